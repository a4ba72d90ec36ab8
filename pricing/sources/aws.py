"""The AWS price source: spot prices, GPU specs, zone offerings, placement scores, on-demand.

Design: a narrow edge to boto3 (Karpenter ``pkg/aws/sdk.go``): the only calls are those in
:data:`AWS_SOURCE_ACTIONS`; clients come from :func:`pricing.sources.boto.make_client`, whose
botocore *adaptive* retry mode retries throttling (no retry loop here); credential errors
become :class:`~pricing.errors.CredentialsError` and other API errors
:class:`~pricing.errors.SourceError`. One fetch fans out over regions in a thread pool; per
region it reads the GPU instance types (``describe_instance_types``, GpuInfo), where they are
offered (``describe_instance_type_offerings`` by availability zone), the spot price history
over a look-back window (``describe_spot_price_history``, every page) and on-demand prices
from the Price List API (``pricing`` client in us-east-1, ``get_products``, every page).
When the Price List cannot be read, :data:`FALLBACK_ON_DEMAND` is used for us-east-1 and the
snapshot's notes say so; other regions then have no on-demand price (never a guess).

Zones are the account's AZ *names* (``us-east-1a``), as the spot API returns them.

Rule for callers: the snapshot is raw; pass its quotes through :func:`pricing.sanity.check`.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Sequence

from pricing.catalog import canonical_gpu
from pricing.errors import SourceError
from pricing.model import GpuSpec, Offering, PriceQuote, Signals, Snapshot, utc
from pricing.sources.boto import MAX_ATTEMPTS, make_client, translate_errors

log = logging.getLogger(__name__)

#: Every AWS action this source calls (read-only; the Terraform role grants these).
AWS_SOURCE_ACTIONS = ("ec2:DescribeSpotPriceHistory", "ec2:DescribeInstanceTypes",
                      "ec2:DescribeInstanceTypeOfferings", "ec2:GetSpotPlacementScores",
                      "ec2:DescribeSubnets",
                      "pricing:GetProducts")

#: Regions read when none are configured: those with the most GPU spot capacity.
DEFAULT_REGIONS = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1")

#: How far back spot price events are read. A spot price holds until its next change, and
#: AWS also returns the price in force at the window's start, so 6 h gives every offering's
#: current price while keeping the paginated answer small.
LOOKBACK = timedelta(hours=6)

#: On-demand Linux prices in us-east-1 (USD/h), used only when the Price List API fails.
#: p2/g3: ec2instances.info 0.0.2 (2017-10-09), ../shared/data/aws_prices. Others: AWS EC2
#: on-demand pricing page, us-east-1 Linux, as listed in 2024 (p5.48xlarge before the June
#: 2025 price cut). Dated figures: the Price List API is the source of truth.
FALLBACK_ON_DEMAND = {
    "p2.xlarge": 0.90, "p2.8xlarge": 7.20, "p2.16xlarge": 14.40,
    "g3.4xlarge": 1.14, "g3.8xlarge": 2.28, "g3.16xlarge": 4.56,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48, "p3dn.24xlarge": 31.212,
    "p4d.24xlarge": 32.7726, "p5.48xlarge": 98.32,
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448,
    "g5.12xlarge": 5.672, "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.12xlarge": 4.6016, "g6.48xlarge": 13.3504,
}
FALLBACK_REGION = "us-east-1"
#: The Price List is auxiliary (a dated fallback exists), so a failing one is given up after
#: 3 attempts instead of the EC2 calls' 8, keeping a fetch within seconds.
PRICE_LIST_ATTEMPTS = 3

#: Instance-type patterns holding every NVIDIA GPU type (p2..p5, g3..g6e, g5g, gr6).
GPU_FAMILY_PATTERNS = ("p*", "g*")


def _spec(info: dict) -> GpuSpec | None:
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus:
        return None
    g = gpus[0]
    mem = (g.get("MemoryInfo") or {}).get("SizeInMiB")
    return GpuSpec(canonical_gpu(g["Name"]), int(sum(x.get("Count", 0) for x in gpus)),
                   None if mem is None else mem / 1024)


def parse_price_list_item(item: str | dict) -> tuple[str, str, float] | None:
    """One Price List product -> ``(region, instance_type, usd_per_hour)``, or None when it
    has no hourly on-demand USD price."""
    doc = json.loads(item) if isinstance(item, str) else item
    attrs = doc.get("product", {}).get("attributes", {})
    itype, region = attrs.get("instanceType"), attrs.get("regionCode")
    for term in doc.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = dim.get("pricePerUnit", {}).get("USD")
            if itype and region and usd not in (None, "") and dim.get("unit", "Hrs") == "Hrs":
                value = float(usd)
                if value > 0:
                    return region, itype, value
    return None


class AwsSource:
    """A :class:`~pricing.sources.base.PriceSource` over the AWS APIs.

    ``client`` makes a client for ``(service, region)`` (default :func:`make_client` with
    ``endpoint_url``), so tests point it at moto or wrap it in a ``Stubber``.
    """

    name = "aws"

    def __init__(self, regions: Sequence[str] | None = None, *, endpoint_url: str | None = None,
                 lookback: timedelta = LOOKBACK, max_workers: int = 8,
                 client: Callable[[str, str], Any] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 signals: bool = False) -> None:
        self.regions = list(regions) if regions else list(DEFAULT_REGIONS)
        self.want_signals = signals
        self.lookback = lookback
        self.max_workers = max_workers
        self._clock = clock
        self._clients: dict[tuple[str, str], Any] = {}
        # "ec2-signals": an EC2 client that tries once (the risk signals are best effort:
        # a refused or unimplemented call must not hold a price poll through 8 retries)
        self._make = client or (lambda service, region: make_client(
            "ec2" if service == "ec2-signals" else service, region, endpoint_url=endpoint_url,
            max_attempts=(PRICE_LIST_ATTEMPTS if service == "pricing" else
                          1 if service == "ec2-signals" else MAX_ATTEMPTS)))

    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = self._make(service, region)
        return self._clients[key]

    def gpu_types(self, region: str, gpus: set[str] | None = None) -> dict[str, GpuSpec]:
        """GPU instance types offered in ``region`` (``describe_instance_types``, all pages).

        Only the ``p*`` and ``g*`` families are asked for (:data:`GPU_FAMILY_PATTERNS`): every
        NVIDIA GPU type is in them, and the answer is a tenth of the full list.
        """
        out: dict[str, GpuSpec] = {}
        with translate_errors(f"describe_instance_types in {region}"):
            pages = self.client("ec2", region).get_paginator("describe_instance_types").paginate(
                Filters=[{"Name": "instance-type", "Values": list(GPU_FAMILY_PATTERNS)}])
            for page in pages:
                for info in page["InstanceTypes"]:
                    spec = _spec(info)
                    if spec is not None and (gpus is None or spec.model in gpus):
                        out[info["InstanceType"]] = spec
        return out

    def zone_offerings(self, region: str, types: Sequence[str]) -> dict[str, set[str]]:
        """``{instance_type: {zone, ...}}`` from ``describe_instance_type_offerings``."""
        out: dict[str, set[str]] = {}
        if not types:
            return out
        with translate_errors(f"describe_instance_type_offerings in {region}"):
            pages = self.client("ec2", region).get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": list(types)}])
            for page in pages:
                for o in page["InstanceTypeOfferings"]:
                    out.setdefault(o["InstanceType"], set()).add(o["Location"])
        return out

    def spot_history(self, region: str, types: Sequence[str], start: datetime,
                     end: datetime | None = None) -> list[PriceQuote]:
        """Linux spot price events in ``region`` for ``types`` since ``start``, every page,
        oldest first (``describe_spot_price_history``)."""
        quotes: list[PriceQuote] = []
        if not types:
            return quotes
        kwargs: dict[str, Any] = {"InstanceTypes": list(types), "StartTime": start,
                                  "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]}
        if end is not None:
            kwargs["EndTime"] = end
        with translate_errors(f"describe_spot_price_history in {region}"):
            pages = self.client("ec2", region).get_paginator("describe_spot_price_history").paginate(**kwargs)
            for page in pages:
                for ev in page["SpotPriceHistory"]:
                    off = Offering("aws", region, ev["AvailabilityZone"], ev["InstanceType"], "spot")
                    quotes.append(PriceQuote(off, utc(ev["Timestamp"]), float(ev["SpotPrice"]), None,
                                             f"aws:describe_spot_price_history:{region}"))
        quotes.sort(key=lambda q: q.time)
        return quotes

    def on_demand_prices(self, regions: Sequence[str]) -> tuple[dict[tuple[str, str], float], list[str]]:
        """``{(region, instance_type): usd_per_hour}`` for GPU instances from the Price List
        API, with notes; on failure the us-east-1 fallback table (noted)."""
        from botocore.exceptions import ClientError

        prices: dict[tuple[str, str], float] = {}
        notes: list[str] = []
        try:
            with translate_errors("pricing get_products"):
                pager = self.client("pricing", "us-east-1").get_paginator("get_products")
                for region in regions:
                    filters = [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in (
                        ("regionCode", region), ("instanceFamily", "GPU instance"),
                        ("operatingSystem", "Linux"), ("tenancy", "Shared"),
                        ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
                    for page in pager.paginate(ServiceCode="AmazonEC2", Filters=filters):
                        for item in page["PriceList"]:
                            parsed = parse_price_list_item(item)
                            if parsed is not None:
                                prices[(parsed[0], parsed[1])] = parsed[2]
        except SourceError as exc:
            notes.append(f"Price List API unavailable ({exc}); on-demand prices from the built-in "
                         f"{FALLBACK_REGION} table (dated, see pricing/sources/aws.py)")
        except ClientError as exc:  # e.g. AccessDenied; moto answers 404 "Not yet implemented"
            notes.append(f"Price List API failed ({exc}); on-demand prices from the built-in "
                         f"{FALLBACK_REGION} table (dated, see pricing/sources/aws.py)")
        if notes and FALLBACK_REGION in regions:
            for itype, usd in FALLBACK_ON_DEMAND.items():
                prices.setdefault((FALLBACK_REGION, itype), usd)
        return prices, notes

    def placement_scores(self, types: Sequence[str], regions: Sequence[str] | None = None,
                         target_capacity: int = 1,
                         client_kind: str = "ec2") -> dict[tuple[str, str], int]:
        """``{(region, az_id): score 1..10}`` from ``get_spot_placement_scores`` (how likely a
        spot request of ``target_capacity`` instances of ``types`` succeeds per zone)."""
        regions = list(regions or self.regions)
        out: dict[tuple[str, str], int] = {}
        with translate_errors("get_spot_placement_scores"):
            pages = self.client(client_kind, regions[0]).get_paginator(
                "get_spot_placement_scores").paginate(
                InstanceTypes=list(types), TargetCapacity=target_capacity,
                SingleAvailabilityZone=True, RegionNames=regions)
            for page in pages:
                for s in page["SpotPlacementScores"]:
                    out[(s["Region"], s.get("AvailabilityZoneId", "*"))] = int(s["Score"])
        return out

    def zone_names(self, region: str) -> dict[str, str]:
        """``{AZ ID: AZ name}`` of ``region`` from its subnets (``describe_subnets``, the
        call the driver already makes: no other permission): placement scores name zones
        by ID, spot prices by name; a zone without a subnet keeps its ID."""
        out: dict[str, str] = {}
        with translate_errors(f"describe_subnets in {region}"):
            pages = self.client("ec2-signals", region).get_paginator("describe_subnets").paginate()
            for page in pages:
                for sn in page.get("Subnets", []):
                    out[sn["AvailabilityZoneId"]] = sn["AvailabilityZone"]
        return out

    def signals(self, types: Sequence[str], regions: Sequence[str]) -> tuple[Signals, list[str]]:
        """Spot placement scores of each type in each zone of ``regions`` (one call per type,
        zones by name where the account's names are known), for the risk estimate
        (:func:`pricing.risk.with_signals`). Best effort: a call that fails (not allowed, not
        implemented) is a note, never an error; a failing call is not retried."""
        placement: dict[tuple[str, str, str], float] = {}
        notes: list[str] = []
        names: dict[str, str] = {}
        for region in regions:
            try:
                names.update(self.zone_names(region))
            except Exception as exc:  # noqa: BLE001 - best effort: a note, zones stay IDs
                notes.append(f"zone names of {region} unknown ({type(exc).__name__}): placement "
                             "scores kept by AZ ID")
                break
        for itype in types:
            try:
                scores = self.placement_scores([itype], regions, client_kind="ec2-signals")
            except Exception as exc:  # noqa: BLE001 - best effort, as above
                notes.append(f"spot placement scores not read ({type(exc).__name__}: "
                             f"{str(exc)[:80]}); hazards without them")
                break
            for (region, az_id), score in scores.items():
                placement[(region, names.get(az_id, az_id), itype)] = float(score)
        return Signals(placement=placement), notes

    def _region(self, region: str, gpus: set[str] | None, start: datetime):
        specs = self.gpu_types(region, gpus)
        offered = self.zone_offerings(region, sorted(specs))
        quotes = self.spot_history(region, sorted(offered), start)
        return specs, offered, quotes

    def fetch(self, *, regions: Sequence[str] | None = None, gpus: Sequence[str] | None = None,
              now: datetime | None = None) -> Snapshot:
        """The latest spot quote per (region, zone, GPU type) with on-demand joined.

        Raises CredentialsError without credentials and SourceError when AWS is unreachable.
        """
        now = utc(now) if now is not None else self._clock()
        regions = list(regions or self.regions)
        want = {canonical_gpu(g) for g in gpus} if gpus else None
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(regions))) as pool:
            results = list(pool.map(lambda r: self._region(r, want, now - self.lookback), regions))
        on_demand, notes = self.on_demand_prices(regions)
        gpu_specs: dict[str, GpuSpec] = {}
        latest: dict[Offering, PriceQuote] = {}
        for region, (specs, offered, quotes) in zip(regions, results):
            gpu_specs.update(specs)
            for q in quotes:
                if q.time <= now and q.offering.zone in offered.get(q.offering.instance_type, ()):
                    latest[q.offering] = q  # oldest first, so the last one wins
        joined = tuple(PriceQuote(q.offering, q.time, q.price_per_hour,
                                  on_demand.get((q.offering.region, q.offering.instance_type)), q.source)
                       for q in sorted(latest.values(), key=lambda q: q.offering))
        missing = sorted({q.offering.region for q in joined if q.on_demand_per_hour is None})
        if missing:
            notes.append(f"no on-demand price for some types in {', '.join(missing)}")
        signals = Signals()
        if self.want_signals and joined:
            signals, more = self.signals(sorted({q.offering.instance_type for q in joined}),
                                         regions)
            notes += more
        log.info("aws: %d spot offerings in %d regions", len(joined), len(regions))
        return Snapshot(quotes=joined, gpus=gpu_specs, notes=tuple(notes), signals=signals)
