"""The GCP price source: where GPU machine types are offered, and their spot/on-demand prices.

Design: a narrow edge to the Google clients, imported lazily. google-cloud-compute gives the
zones (``ZonesClient.list``), the machine types per zone with their bundled GPUs
(``MachineTypesClient.aggregated_list``) and the attachable accelerator types per zone
(``AcceleratorTypesClient.aggregated_list``); google-cloud-billing's
``CloudCatalogClient.list_skus`` on the Compute Engine service (:data:`COMPUTE_SERVICE`)
gives the prices. GCP prices a GPU machine type by components, so

    price(machine, region, usage) = vCPUs x core rate + memory GiB x RAM rate
                                    + GPUs x GPU rate

with the family's rates (``A2 Instance Core``, ``A2 Instance Ram``, ``Nvidia Tesla A100 GPU``
...) for ``usage`` in {``OnDemand``, ``Preemptible``} (spot SKUs are described "Spot
Preemptible ..."), each from the SKU whose ``serviceRegions`` holds the region. A machine
type missing any component rate gets no quote, and the notes say which. One spot quote per
(zone, machine type) the compute API lists, on-demand joined, timed at the fetch. GPUs
attached to N1 VMs (V100, T4, P100, K80, P4) are priced the same way, in the shapes described at
:data:`N1_GPUS`, in every zone whose accelerator types list them.

Rule for callers: errors arrive as :mod:`pricing.errors` (no credentials ->
CredentialsError, API failures -> SourceError); the snapshot is raw, so sanity-check it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Iterator, Sequence

from pricing.catalog import canonical_gpu
from pricing.errors import CredentialsError, SourceError
from pricing.model import GpuSpec, Offering, PriceQuote, Signals, Snapshot, utc

log = logging.getLogger(__name__)

#: The Compute Engine service in the Cloud Billing catalog.
COMPUTE_SERVICE = "services/6F81-5844-456A"
#: Machine families whose types bundle GPUs.
GPU_FAMILIES = ("a2", "a3", "g2", "g4")
#: GPUs attached to N1 VMs, priced as ``n1-standard-{8 x count}+<gpu>x<count>`` (8 vCPUs and
#: 30 GB per GPU: the usual shape for one training GPU) for each count in :data:`N1_COUNTS`
#: up to the accelerator type's ``maximumCardsPerInstance``.
N1_GPUS = ("K80", "P4", "P100", "V100", "T4")
N1_COUNTS = (1, 2, 4, 8)
N1_VCPUS_PER_GPU = 8
N1_GB_PER_VCPU = 3.75

CREDENTIALS_HELP = ("no GCP credentials found: run `gcloud auth application-default login` or set "
                    "GOOGLE_APPLICATION_CREDENTIALS (and --project), or use --source trace")

_COMPONENT = re.compile(r"^(?:Spot Preemptible )?([A-Z]\d+[A-Z]?) (?:Predefined )?Instance (Core|Ram) "
                        r"running in")
_GPU = re.compile(r"^(?:Spot Preemptible )?Nvidia (?:Tesla )?(.+?) GPU running in")


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """google-auth / google-api-core errors -> pricing errors naming the call."""
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    try:
        yield
    except (DefaultCredentialsError, RefreshError):
        raise CredentialsError(CREDENTIALS_HELP) from None
    except (gexc.Unauthorized, gexc.Forbidden) as exc:  # HTTP 401/403 (and their gRPC kin)
        raise CredentialsError(f"{what}: GCP refused the credentials ({exc.message}); "
                               f"{CREDENTIALS_HELP}") from None
    except gexc.GoogleAPICallError as exc:
        raise SourceError(f"{what}: {exc}") from None
    except (gexc.RetryError, ConnectionError, OSError) as exc:
        raise SourceError(f"{what}: cannot reach the GCP API: {exc}") from None


def _usd(price: dict | Any) -> float:
    units = float(getattr(price, "units", None) if not isinstance(price, dict) else price.get("units", 0) or 0)
    nanos = float(getattr(price, "nanos", None) if not isinstance(price, dict) else price.get("nanos", 0) or 0)
    return units + nanos / 1e9


def sku_rates(skus: Sequence[Any]) -> dict[tuple[str, str, str, str], float]:
    """``{(family_or_gpu, component, usage, region): usd}`` from Compute Engine SKUs.

    ``component`` is ``core`` (per vCPU-hour), ``ram`` (per GiB-hour) or ``gpu`` (per
    GPU-hour, keyed by the canonical GPU name); ``usage`` is ``OnDemand`` or ``Preemptible``.
    The rate is the first non-zero tier of the SKU's first pricing info.
    """
    rates: dict[tuple[str, str, str, str], float] = {}
    for s in skus:
        usage = s.category.usage_type
        if usage not in ("OnDemand", "Preemptible"):
            continue
        m = _COMPONENT.match(s.description)
        if m:
            key, component = m.group(1).lower(), m.group(2).lower()
        else:
            g = _GPU.match(s.description)
            if not g:
                continue
            key, component = canonical_gpu(g.group(1)), "gpu"
        if not s.pricing_info:
            continue
        tiers = s.pricing_info[0].pricing_expression.tiered_rates
        usd = next((_usd(t.unit_price) for t in tiers if _usd(t.unit_price) > 0), 0.0)
        if usd <= 0:
            continue
        for region in s.service_regions:
            rates[(key, component, usage, region)] = usd
    return rates


class GcpSource:
    """A :class:`~pricing.sources.base.PriceSource` over the GCP compute and billing APIs."""

    name = "gcp"

    def __init__(self, project: str | None = None, regions: Sequence[str] | None = None, *,
                 endpoint_url: str | None = None, billing_endpoint: str | None = None,
                 credentials: Any = None, signals: bool = False) -> None:
        self.project = project
        self.regions = list(regions) if regions else None
        self.endpoint_url = endpoint_url
        self.billing_endpoint = billing_endpoint or endpoint_url
        self.credentials = credentials
        self.want_signals = signals

    def _kwargs(self, endpoint: str | None) -> dict[str, Any]:
        from google.api_core.client_options import ClientOptions

        kwargs: dict[str, Any] = {"transport": "rest"}
        if endpoint:
            kwargs["client_options"] = ClientOptions(api_endpoint=endpoint)
        if self.credentials is not None:
            kwargs["credentials"] = self.credentials
        return kwargs

    def _project(self) -> str:
        if self.project:
            return self.project
        import google.auth

        with translate_errors("finding the GCP project"):
            creds, project = google.auth.default()
        if not project:
            raise CredentialsError("no GCP project: pass --project or set GOOGLE_CLOUD_PROJECT")
        self.credentials = self.credentials or creds
        self.project = project
        return project

    def zones(self) -> dict[str, str]:
        """``{zone: region}`` of the project (``ZonesClient.list``)."""
        from google.cloud import compute_v1

        project = self._project()
        with translate_errors("listing GCP zones"):
            client = compute_v1.ZonesClient(**self._kwargs(self.endpoint_url))
            return {z.name: z.region.rsplit("/", 1)[-1] for z in client.list(project=project)}

    def machine_types(self) -> dict[str, list[Any]]:
        """``{zone: [machine types with bundled GPUs]}`` (``aggregated_list``)."""
        from google.cloud import compute_v1

        project = self._project()
        out: dict[str, list[Any]] = defaultdict(list)
        with translate_errors("listing GCP machine types"):
            client = compute_v1.MachineTypesClient(**self._kwargs(self.endpoint_url))
            for scope, scoped in client.aggregated_list(project=project):
                for mt in scoped.machine_types:
                    if mt.name.split("-")[0] in GPU_FAMILIES and mt.accelerators:
                        out[scope.split("/")[-1]].append(mt)
        return out

    def accelerator_types(self) -> dict[str, dict[str, int]]:
        """``{zone: {canonical GPU: max cards per VM}}`` attachable there (``aggregated_list``;
        a type without ``maximumCardsPerInstance`` counts as 4)."""
        from google.cloud import compute_v1

        project = self._project()
        out: dict[str, dict[str, int]] = defaultdict(dict)
        with translate_errors("listing GCP accelerator types"):
            client = compute_v1.AcceleratorTypesClient(**self._kwargs(self.endpoint_url))
            for scope, scoped in client.aggregated_list(project=project):
                for at in scoped.accelerator_types:
                    out[scope.split("/")[-1]][canonical_gpu(at.name)] = at.maximum_cards_per_instance or 4
        return out

    def skus(self) -> list[Any]:
        """Every Compute Engine SKU (``CloudCatalogClient.list_skus``, all pages)."""
        from google.cloud import billing_v1

        with translate_errors("listing Compute Engine SKUs"):
            client = billing_v1.CloudCatalogClient(**self._kwargs(self.billing_endpoint))
            return list(client.list_skus(parent=COMPUTE_SERVICE))

    def capacity_history(self, region: str, machine_type: str) -> dict[str, float]:
        """``{zone or "*": preemption rate}`` of SPOT ``machine_type`` in ``region`` from
        ``AdviceClient.capacity_history`` (types PREEMPTION): the newest record per location
        (the share of the spot VMs that stopped which were preempted)."""
        from google.cloud import compute_v1

        project = self._project()
        req = compute_v1.CapacityHistoryRequest(
            instance_properties=compute_v1.CapacityHistoryRequestInstanceProperties(
                machine_type=machine_type,
                scheduling=compute_v1.CapacityHistoryRequestInstancePropertiesScheduling(
                    provisioning_model="SPOT")),
            types=["PREEMPTION"])
        with translate_errors(f"capacity history of {machine_type} in {region}"):
            client = compute_v1.AdviceClient(**self._kwargs(self.endpoint_url))
            resp = client.capacity_history(project=project, region=region,
                                           capacity_history_request_resource=req)
        where = resp.location.rstrip("/").rsplit("/", 1)[-1] if resp.location else region
        zone = "*" if where == region else where
        records = sorted(resp.preemption_history, key=lambda r: r.interval.end_time or "")
        return {zone: float(records[-1].preemption_rate)} if records else {}

    def signals(self, pairs: Sequence[tuple[str, str]]) -> tuple[Signals, list[str]]:
        """Preemption rates of (region, machine type) ``pairs`` for the risk estimate
        (:func:`pricing.risk.with_signals`). Best effort: a call that fails is a note."""
        rates: dict[tuple[str, str, str], float] = {}
        for region, mtype in pairs:
            try:
                for zone, rate in self.capacity_history(region, mtype).items():
                    rates[(region, zone, mtype)] = rate
            except Exception as exc:  # noqa: BLE001 - best effort: hazards without it
                return Signals(preemption_rate=rates), [
                    f"capacity history not read ({type(exc).__name__}: {str(exc)[:80]}); "
                    "hazards without it"]
        return Signals(preemption_rate=rates), []

    @staticmethod
    def _priced(rates: dict, family: str, gpu: str, usage: str, region: str, vcpus: float,
                memory_gib: float, count: int) -> float | None:
        """vCPUs x core + GiB x RAM + GPUs x GPU rate, or None when a rate is missing."""
        parts = [rates.get((family, "core", usage, region)), rates.get((family, "ram", usage, region)),
                 rates.get((gpu, "gpu", usage, region))]
        if None in parts:
            return None
        core, ram, per_gpu = parts
        return vcpus * core + memory_gib * ram + count * per_gpu

    def fetch(self, *, regions: Sequence[str] | None = None, gpus: Sequence[str] | None = None,
              now: datetime | None = None) -> Snapshot:
        """One spot quote per (zone, GPU machine type), on-demand joined; see the module doc."""
        now = utc(now) if now is not None else datetime.now(timezone.utc)
        regions = list(regions or self.regions or [])
        want = {canonical_gpu(g) for g in gpus} if gpus else None
        zone_region = self.zones()
        rates = sku_rates(self.skus())
        quotes: list[PriceQuote] = []
        specs: dict[str, GpuSpec] = {}
        missing: set[str] = set()
        for zone, types in sorted(self.machine_types().items()):
            region = zone_region.get(zone, zone.rsplit("-", 1)[0])
            if regions and region not in regions:
                continue
            for mt in types:
                acc = mt.accelerators[0]
                gpu = canonical_gpu(acc.guest_accelerator_type)
                if want is not None and gpu not in want:
                    continue
                family = mt.name.split("-")[0]
                count = sum(a.guest_accelerator_count for a in mt.accelerators)
                specs[mt.name] = GpuSpec(gpu, count)
                price = {usage: self._priced(rates, family, gpu, usage, region, mt.guest_cpus,
                                             mt.memory_mb / 1024, count)
                         for usage in ("Preemptible", "OnDemand")}
                if price["Preemptible"] is None:
                    missing.add(f"{mt.name} in {region}")
                    continue
                quotes.append(PriceQuote(Offering("gcp", region, zone, mt.name, "spot"), now,
                                         price["Preemptible"], price["OnDemand"],
                                         "gcp:cloudbilling+compute"))
        for zone, attachable in sorted(self.accelerator_types().items()):
            region = zone_region.get(zone, zone.rsplit("-", 1)[0])
            if regions and region not in regions:
                continue
            for gpu, max_cards in sorted(attachable.items()):
                if gpu not in N1_GPUS or (want is not None and gpu not in want):
                    continue
                for count in (c for c in N1_COUNTS if c <= max_cards):
                    vcpus = N1_VCPUS_PER_GPU * count
                    name = f"n1-standard-{vcpus}+{gpu.lower()}x{count}"
                    price = {usage: self._priced(rates, "n1", gpu, usage, region, vcpus,
                                                 vcpus * N1_GB_PER_VCPU, count)
                             for usage in ("Preemptible", "OnDemand")}
                    if price["Preemptible"] is None:
                        missing.add(f"{name} in {region}")
                        continue
                    specs[name] = GpuSpec(gpu, count)
                    quotes.append(PriceQuote(Offering("gcp", region, zone, name, "spot"), now,
                                             price["Preemptible"], price["OnDemand"],
                                             "gcp:cloudbilling+compute"))
        notes = []
        if missing:
            notes.append(f"no spot SKU rates for {len(missing)} machine type/region pairs, e.g. "
                         + ", ".join(sorted(missing)[:3]))
        signals = Signals()
        if self.want_signals and quotes:  # machine types with their GPUs bundled (a2, a3,
            # g2, g4): the API is asked per machine type; N1 VMs with attached GPUs are not
            pairs = sorted({(q.offering.region, q.offering.instance_type) for q in quotes
                            if "+" not in q.offering.instance_type})
            signals, more = self.signals(pairs)
            notes += more
        log.info("gcp: %d spot offerings", len(quotes))
        return Snapshot(quotes=tuple(sorted(quotes, key=lambda q: q.offering)), gpus=specs,
                        notes=tuple(notes), signals=signals)
