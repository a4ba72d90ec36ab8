"""Parsers for recorded trace files: each known format into the common pricing model.

Design: one function per format, chosen by :func:`parse_file` from the file's header (CSV)
or its suffix (JSON), never from a guess about its contents. Every parser returns a
:class:`~pricing.model.Snapshot` holding the *whole* history in the file; the replay view at
a time is made by :class:`pricing.sources.trace.TraceSource`. Formats:

- ``aws-events``: raw ``describe-spot-price-history`` events (ericpauley archive):
  ``az_id,instance_type,product_description,spot_price_usd_per_hour,timestamp``. Only
  ``Linux/UNIX`` rows are kept; the AZ ID (``use1-az4``) is the zone, its prefix the region.
- ``gcp-weekly``: GCP GPU VM weekly price panel:
  ``snapshot_time,machine_type,gpu_type,gpu_count,vcpus,ram_gb,region,ondemand_usd_per_hour,
  spot_usd_per_hour``. One spot quote per (snapshot, machine type, region), zone ``"*"``,
  on-demand attached; rows without a spot price give an on-demand quote only.
- ``gcp-lifetimes``: GCP preemptible GPU lifetimes (2019):
  ``gpu_type,zone,vm_name,workload,start_time,terminate_time,lifetime_hours``; lifetimes of
  24 h or more are censored by GCP's 24 h cap (not revocations).
- ``cant-be-late``: ``{"metadata": {"gap_seconds": G}, "data": [...]}`` under
  ``{availability|preemption}/{N}-node/{cloud}-{MM-DD-YYYY}/{zone}_{token}.json``.
- ``aws-ondemand-2017``: ``instance_type,gpu_count,vcpus,memory_gib,region,
  linux_ondemand_usd_per_hour,...`` (ec2instances.info 0.0.2): on-demand quotes, zone ``"*"``,
  timed at :data:`AWS_ONDEMAND_2017_TIME` (the file has no time column).
- ``aws-regional-spot-2021``: ``region,instance_family_group,instance_type,
  linux_spot_usd_per_hour,windows_spot_usd_per_hour`` (spot.js feed): spot quotes, zone
  ``"*"``, feed region names mapped (``us-east`` -> us-east-1), timed at
  :data:`AWS_REGIONAL_SPOT_2021_TIME`; ``N/A*`` cells skipped.
- ``user``: the documented CSV for users' own traces (see :data:`USER_COLUMNS`).

Rule: a malformed file raises :class:`~pricing.errors.TraceFormatError` naming file, line and
problem; rows out of time order and gaps are reported in ``Snapshot.notes`` with file and
line, and records are always sorted by time, so nothing is silently wrong.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterable

from pricing.catalog import canonical_gpu, gpu_for
from pricing.errors import TraceFormatError
from pricing.model import Availability, GpuSpec, Lifetime, Offering, PriceQuote, Snapshot

#: Header of the user trace format. ``time``: ISO 8601 (UTC if no offset) or Unix seconds;
#: ``market``: spot | on-demand; prices USD/h; ``available``: count held or 0/1. Empty
#: cells mean "not known": a row without a price gives no quote, one without ``available``
#: no availability sample.
USER_COLUMNS = ("time", "cloud", "region", "zone", "instance_type", "market", "price_per_hour",
                "on_demand_per_hour", "available")
AWS_EVENT_COLUMNS = ("az_id", "instance_type", "product_description", "spot_price_usd_per_hour",
                     "timestamp")
GCP_WEEKLY_COLUMNS = ("snapshot_time", "machine_type", "gpu_type", "gpu_count", "vcpus", "ram_gb",
                      "region", "ondemand_usd_per_hour", "spot_usd_per_hour")
AWS_ONDEMAND_2017_COLUMNS = ("instance_type", "gpu_count", "vcpus", "memory_gib", "region",
                             "linux_ondemand_usd_per_hour", "linux_reserved_1y_noupfront_usd_per_hour")
AWS_REGIONAL_SPOT_COLUMNS = ("region", "instance_family_group", "instance_type",
                             "linux_spot_usd_per_hour", "windows_spot_usd_per_hour")
#: Files without a time column are timed at their publication date (shared/data README):
#: the ec2instances.info 0.0.2 wheel (2017-10-09) and the spotinfo fixture commit (2021-04-06).
AWS_ONDEMAND_2017_TIME = datetime(2017, 10, 9, tzinfo=timezone.utc)
AWS_REGIONAL_SPOT_2021_TIME = datetime(2021, 4, 6, tzinfo=timezone.utc)
#: Region names of the spot.js feed.
SPOT_FEED_REGIONS = {"us-east": "us-east-1", "us-west": "us-west-1", "eu-ireland": "eu-west-1",
                     "apac-syd": "ap-southeast-2", "apac-sin": "ap-southeast-1",
                     "apac-tokyo": "ap-northeast-1", "eu-frankfurt": "eu-central-1",
                     "us-west-2": "us-west-2", "us-east-2": "us-east-2"}
GCP_LIFETIME_COLUMNS = ("gpu_type", "zone", "vm_name", "workload", "start_time", "terminate_time",
                        "lifetime_hours")

#: GCP preemptible VMs were stopped after 24 h: a lifetime at or beyond this is censored.
GCP_PREEMPTIBLE_CAP_HOURS = 24.0
#: A gap between GCP weekly snapshots longer than this is reported in the notes.
GCP_WEEKLY_MAX_GAP = timedelta(days=21)
#: A gap in a user trace longer than this many times the offering's median step is reported.
USER_GAP_FACTOR = 10.0

#: AZ ID prefix -> region (AWS AZ IDs are global, e.g. use1-az4 is in us-east-1).
AZ_ID_REGIONS = {
    "use1": "us-east-1", "use2": "us-east-2", "usw1": "us-west-1", "usw2": "us-west-2",
    "cac1": "ca-central-1", "sae1": "sa-east-1", "euw1": "eu-west-1", "euw2": "eu-west-2",
    "euw3": "eu-west-3", "euc1": "eu-central-1", "euc2": "eu-central-2", "eun1": "eu-north-1",
    "eus1": "eu-south-1", "aps1": "ap-south-1", "apse1": "ap-southeast-1",
    "apse2": "ap-southeast-2", "apse3": "ap-southeast-3", "apne1": "ap-northeast-1",
    "apne2": "ap-northeast-2", "apne3": "ap-northeast-3", "ape1": "ap-east-1",
    "afs1": "af-south-1", "mes1": "me-south-1", "mec1": "me-central-1",
}
#: Can't-Be-Late file-name tokens -> instance type.
CANT_BE_LATE_TYPES = {"v100_1": "p3.2xlarge", "v100_8": "p3.16xlarge", "k80_1": "p2.xlarge",
                      "k80_8": "p2.8xlarge", "intel_64": "r5.16xlarge", "c3-88": "c3-highcpu-88"}


class _Offerings:
    """Interns offerings so 178k rows build a few hundred validated objects."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, ...], Offering] = {}

    def get(self, *parts: str) -> Offering:
        off = self._cache.get(parts)
        if off is None:
            off = self._cache[parts] = Offering(*parts)
        return off


def region_of_zone(cloud: str, zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1`` (AWS); ``us-central1-a`` -> ``us-central1`` (GCP)."""
    if cloud == "gcp":
        return zone.rsplit("-", 1)[0]
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def parse_time(text: str) -> datetime:
    """ISO 8601 (naive means UTC) or Unix seconds -> aware UTC datetime. Raises ValueError."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d*)?", text):
        return datetime.fromtimestamp(float(text), tz=timezone.utc)
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _number(path: Path, line: int, column: str, text: str, *, required: bool) -> float | None:
    text = text.strip()
    if not text:
        if required:
            raise TraceFormatError(str(path), line, f"column {column!r} is empty")
        return None
    try:
        return float(text)
    except ValueError:
        raise TraceFormatError(str(path), line, f"column {column!r}: {text!r} is not a number") from None


def _time(path: Path, line: int, column: str, text: str) -> datetime:
    try:
        return parse_time(text)
    except (ValueError, OverflowError):
        raise TraceFormatError(str(path), line, f"column {column!r}: {text!r} is not an ISO 8601 "
                               "time or Unix seconds") from None


def _order_note(path: Path, lines_out_of_order: list[int]) -> list[str]:
    if not lines_out_of_order:
        return []
    return [f"{path}:{lines_out_of_order[0]}: {len(lines_out_of_order)} row(s) out of time order "
            "(sorted by time on load)"]


def _rows(path: Path, reader: Iterable[list[str]], width: int) -> Iterable[tuple[int, list[str]]]:
    for line, row in enumerate(reader, start=2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != width:
            raise TraceFormatError(str(path), line, f"expected {width} columns, found {len(row)}")
        yield line, row


def parse_aws_events(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """AWS spot price change events; see the module docstring."""
    offs, quotes, skipped, disorder = _Offerings(), [], 0, []
    last: datetime | None = None
    gpus: dict[str, GpuSpec] = {}
    for line, (az_id, itype, product, price, ts) in _rows(path, reader, 5):
        if product != "Linux/UNIX":
            skipped += 1
            continue
        prefix = az_id.split("-az")[0]
        region = AZ_ID_REGIONS.get(prefix)
        if region is None:
            raise TraceFormatError(str(path), line, f"az_id {az_id!r}: unknown AZ ID prefix "
                                   f"{prefix!r} (known: {', '.join(sorted(AZ_ID_REGIONS))})")
        t = _time(path, line, "timestamp", ts)
        if last is not None and t < last:
            disorder.append(line)
        last = t
        value = _number(path, line, "spot_price_usd_per_hour", price, required=True)
        quotes.append(PriceQuote(offs.get("aws", region, az_id, itype, "spot"), t, value, None,
                                 f"{path.name}:{line}"))
        if itype not in gpus and (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    quotes.sort(key=lambda q: q.time)
    notes = [f"{path}: {len(quotes)} Linux/UNIX spot events; {skipped} rows of other operating "
             "systems skipped; no on-demand price in this format"] + _order_note(path, disorder)
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=tuple(notes))


def parse_gcp_weekly(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """GCP weekly GPU VM prices; see the module docstring."""
    offs, quotes, disorder = _Offerings(), [], []
    times: dict[str, datetime] = {}
    gpus: dict[str, GpuSpec] = {}
    last: datetime | None = None
    for line, row in _rows(path, reader, 9):
        snap, mtype, gpu_type, gpu_count, _vcpu, _ram, region, od_text, spot_text = row
        t = times.get(snap)
        if t is None:
            t = times[snap] = _time(path, line, "snapshot_time", snap)
        if last is not None and t < last:
            disorder.append(line)
        last = t
        od = _number(path, line, "ondemand_usd_per_hour", od_text, required=False)
        spot = _number(path, line, "spot_usd_per_hour", spot_text, required=False)
        src = f"{path.name}:{line}"
        if spot is not None:
            quotes.append(PriceQuote(offs.get("gcp", region, "*", mtype, "spot"), t, spot, od, src))
        elif od is not None:
            quotes.append(PriceQuote(offs.get("gcp", region, "*", mtype, "on-demand"), t, od, od, src))
        if mtype not in gpus:
            spec = gpu_for(mtype)
            if spec is None and gpu_count.strip() not in ("", "0"):
                spec = GpuSpec(canonical_gpu(gpu_type), int(float(gpu_count)))
            if spec is not None:
                gpus[mtype] = spec
    quotes.sort(key=lambda q: q.time)
    snaps = sorted(times.values())
    notes = [f"{path}: {len(quotes)} quotes from {len(snaps)} weekly snapshots "
             f"{snaps[0]:%Y-%m-%d}..{snaps[-1]:%Y-%m-%d}" if snaps else f"{path}: no rows"]
    notes += _order_note(path, disorder)
    for a, b in zip(snaps, snaps[1:]):
        if b - a > GCP_WEEKLY_MAX_GAP:
            notes.append(f"{path}: gap of {(b - a).days} days between snapshots {a:%Y-%m-%d} and "
                         f"{b:%Y-%m-%d} (prices held from the earlier one)")
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=tuple(notes))


def parse_gcp_lifetimes(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """GCP preemptible lifetimes; instance type ``n1+<gpu>`` (an N1 VM with one GPU)."""
    offs, lifetimes, gpus = _Offerings(), [], {}
    for line, (gpu, zone, _vm, _wl, start, _end, hours_text) in _rows(path, reader, 7):
        hours = _number(path, line, "lifetime_hours", hours_text, required=True)
        if hours is None or hours < 0 or math.isnan(hours):
            raise TraceFormatError(str(path), line, f"lifetime_hours {hours_text!r} must be >= 0")
        itype = f"n1+{canonical_gpu(gpu).lower()}"
        off = offs.get("gcp", region_of_zone("gcp", zone), zone, itype, "spot")
        lifetimes.append(Lifetime(off, _time(path, line, "start_time", start), hours * 3600.0,
                                  revoked=hours < GCP_PREEMPTIBLE_CAP_HOURS, source=f"{path.name}:{line}"))
        if (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    censored = sum(not lt.revoked for lt in lifetimes)
    notes = (f"{path}: {len(lifetimes)} lifetimes, {censored} censored at the "
             f"{GCP_PREEMPTIBLE_CAP_HOURS:g} h preemptible cap; times taken as UTC",)
    return Snapshot(lifetimes=tuple(lifetimes), gpus=gpus, notes=notes)


def availability_to_records(off: Offering, samples: list[tuple[datetime, int]], end: datetime,
                            capacity: int | None, source: str
                            ) -> tuple[list[Availability], list[Lifetime]]:
    """Turn time-sorted availability counts into change records and lifetimes.

    Availability records are emitted at the first sample and at every change (the value
    holds until the next record). Each unit of count is one instance: a rise starts
    lifetimes, a fall revokes the oldest ones (FIFO; the hazard MLE depends only on the total
    exposure and the number of falls, not on which instance fell), and instances still up at
    ``end`` are censored.
    """
    records: list[Availability] = []
    lifetimes: list[Lifetime] = []
    alive: list[datetime] = []
    prev: int | None = None
    for t, n in samples:
        if n == prev:
            continue
        records.append(Availability(off, t, n, capacity, source))
        if n > len(alive):
            alive.extend([t] * (n - len(alive)))
        while len(alive) > n:
            s = alive.pop(0)
            lifetimes.append(Lifetime(off, s, (t - s).total_seconds(), True, source))
        prev = n
    for s in alive:
        lifetimes.append(Lifetime(off, s, (end - s).total_seconds(), False, source))
    return records, lifetimes


def parse_cant_be_late(path: Path) -> Snapshot:
    """A Can't-Be-Late JSON trace; the layout of its path gives cloud, date, zone and type."""
    m_dir = re.fullmatch(r"(aws|gcp)-(\d\d)-(\d\d)-(\d{4})", path.parent.name)
    if m_dir is None:
        raise TraceFormatError(str(path), None, f"folder {path.parent.name!r} must be named "
                               "{aws|gcp}-MM-DD-YYYY (the trace's start date)")
    cloud, mm, dd, yyyy = m_dir.groups()
    zone, _, token = path.stem.partition("_")
    itype = CANT_BE_LATE_TYPES.get(token)
    if itype is None:
        raise TraceFormatError(str(path), None, f"file-name token {token!r} unknown; expected "
                               f"<zone>_<token>.json with token one of {', '.join(CANT_BE_LATE_TYPES)}")
    m_nodes = re.fullmatch(r"(\d+)-node", path.parent.parent.name)
    capacity = int(m_nodes.group(1)) if m_nodes else None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        gap = float(doc["metadata"]["gap_seconds"])
        data = doc["data"]
    except json.JSONDecodeError as exc:
        raise TraceFormatError(str(path), exc.lineno, f"not valid JSON: {exc.msg}") from None
    except (KeyError, TypeError):
        raise TraceFormatError(str(path), None, 'expected {"metadata": {"gap_seconds": G}, '
                               '"data": [...]}') from None
    if not gap > 0 or not isinstance(data, list):
        raise TraceFormatError(str(path), None, "metadata.gap_seconds must be > 0 and data a list")
    start = datetime(int(yyyy), int(mm), int(dd), tzinfo=timezone.utc)
    samples: list[tuple[datetime, int]] = []
    for i, v in enumerate(data):
        if not isinstance(v, (int, float)) or v < 0 or v != int(v) or (capacity and v > capacity):
            raise TraceFormatError(str(path), None, f"data[{i}]={v!r}: must be an integer count "
                                   f"0..{capacity or 'N'}")
        samples.append((start + timedelta(seconds=i * gap), int(v)))
    end = start + timedelta(seconds=len(data) * gap)
    off = Offering(cloud, region_of_zone(cloud, zone), zone, itype, "spot")
    records, lifetimes = availability_to_records(off, samples, end, capacity, path.name)
    gpus = {itype: spec} if (spec := gpu_for(itype)) is not None else {}
    note = (f"{path}: {len(data)} ticks of {gap:g} s from {start:%Y-%m-%d} (start of day UTC; the "
            f"folder gives only the date), {len(records)} changes, "
            f"{sum(lt.revoked for lt in lifetimes)} revocations")
    return Snapshot(availability=tuple(records), lifetimes=tuple(lifetimes), gpus=gpus, notes=(note,))


def parse_user(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """The documented user CSV (:data:`USER_COLUMNS`)."""
    offs, quotes, disorder, gpus = _Offerings(), [], [], {}
    samples: dict[Offering, list[tuple[datetime, int, int]]] = defaultdict(list)
    last: datetime | None = None
    for line, row in _rows(path, reader, len(USER_COLUMNS)):
        t_text, cloud, region, zone, itype, market, price_t, od_t, avail_t = (c.strip() for c in row)
        t = _time(path, line, "time", t_text)
        try:
            off = offs.get(cloud, region, zone or "*", itype, market or "spot")
        except ValueError as exc:
            raise TraceFormatError(str(path), line, str(exc)) from None
        if last is not None and t < last:
            disorder.append(line)
        last = t
        price = _number(path, line, "price_per_hour", price_t, required=False)
        od = _number(path, line, "on_demand_per_hour", od_t, required=False)
        if price is not None:
            quotes.append(PriceQuote(off, t, price, od, f"{path.name}:{line}"))
        avail = _number(path, line, "available", avail_t, required=False)
        if avail is not None:
            if avail < 0 or avail != int(avail):
                raise TraceFormatError(str(path), line, f"available={avail_t!r}: must be a count >= 0")
            samples[off].append((t, int(avail), line))
        if itype not in gpus and (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    quotes.sort(key=lambda q: q.time)
    notes = _order_note(path, disorder)
    availability: list[Availability] = []
    lifetimes: list[Lifetime] = []
    for off, rows in samples.items():
        rows.sort(key=lambda r: r[0])
        steps = sorted((b[0] - a[0]).total_seconds() for a, b in zip(rows, rows[1:]))
        median = steps[len(steps) // 2] if steps else 0.0
        for a, b in zip(rows, rows[1:]):
            if median > 0 and (b[0] - a[0]).total_seconds() > USER_GAP_FACTOR * median:
                notes.append(f"{path}:{b[2]}: gap of {b[0] - a[0]} in availability of {off} "
                             f"(median step {median:g} s); the earlier value is held across it")
        end = rows[-1][0]  # the last value is known at its instant only: no exposure after it
        recs, lts = availability_to_records(off, [(t, n) for t, n, _ in rows], end, None, path.name)
        availability += recs
        lifetimes += lts
    availability.sort(key=lambda a: a.time)
    return Snapshot(quotes=tuple(quotes), availability=tuple(availability),
                    lifetimes=tuple(lifetimes), gpus=gpus, notes=tuple(notes))


def parse_aws_ondemand_2017(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """AWS on-demand GPU prices of 2017 (no time column: see the module docstring)."""
    offs, quotes, gpus = _Offerings(), [], {}
    for line, row in _rows(path, reader, 7):
        itype, region, price_t = row[0], row[4], row[5]
        usd = _number(path, line, "linux_ondemand_usd_per_hour", price_t, required=True)
        quotes.append(PriceQuote(offs.get("aws", region, "*", itype, "on-demand"),
                                 AWS_ONDEMAND_2017_TIME, usd, usd, f"{path.name}:{line}"))
        if (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    note = f"{path}: {len(quotes)} on-demand prices, timed {AWS_ONDEMAND_2017_TIME:%Y-%m-%d} (file date)"
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=(note,))


def parse_aws_regional_spot(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """AWS region-level spot prices of 2021 (spot.js feed; no time column)."""
    offs, quotes, gpus, skipped = _Offerings(), [], {}, 0
    for line, (feed_region, _group, itype, linux, _win) in _rows(path, reader, 5):
        region = SPOT_FEED_REGIONS.get(feed_region)
        if region is None:
            raise TraceFormatError(str(path), line, f"region {feed_region!r} unknown; known: "
                                   f"{', '.join(SPOT_FEED_REGIONS)}")
        if linux.strip().upper().startswith("N/A"):
            skipped += 1
            continue
        usd = _number(path, line, "linux_spot_usd_per_hour", linux, required=True)
        quotes.append(PriceQuote(offs.get("aws", region, "*", itype, "spot"),
                                 AWS_REGIONAL_SPOT_2021_TIME, usd, None, f"{path.name}:{line}"))
        if itype not in gpus and (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    note = (f"{path}: {len(quotes)} regional spot prices, timed {AWS_REGIONAL_SPOT_2021_TIME:%Y-%m-%d} "
            f"(file date); {skipped} 'N/A' cells skipped")
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=(note,))


_CSV_FORMATS: dict[tuple[str, ...], Callable[[Path, Iterable[list[str]]], Snapshot]] = {
    AWS_EVENT_COLUMNS: parse_aws_events,
    GCP_WEEKLY_COLUMNS: parse_gcp_weekly,
    GCP_LIFETIME_COLUMNS: parse_gcp_lifetimes,
    AWS_ONDEMAND_2017_COLUMNS: parse_aws_ondemand_2017,
    AWS_REGIONAL_SPOT_COLUMNS: parse_aws_regional_spot,
    USER_COLUMNS: parse_user,
}
#: Files that are not traces, with what to do instead (first header column -> hint).
_NOT_TRACE_HINTS = {
    "snapshot_date": "this is an AWS Spot Advisor file: pass it with --advisor (a hazard prior)",
    "NAME": "this is a GCP zone list, not a price trace",
    "name_gpu": "this is a GPU throughput table, not a price trace",
    "num_gpus": "this is a GPU scaling table, not a price trace",
}


class NotATrace(TraceFormatError):
    """A known data file that carries no prices, availability or lifetimes."""


def parse_file(path: Path) -> Snapshot:
    """Detect the format of one file and parse it. Raises TraceFormatError."""
    if path.suffix == ".json":
        return parse_cant_be_late(path)
    try:
        with _open_text(path) as f:
            reader = csv.reader(f)
            header = tuple(h.strip() for h in next(reader, []))
            parser = _CSV_FORMATS.get(header)
            hint = _NOT_TRACE_HINTS.get(header[0].split(";")[0]) if header else None
            if parser is None and hint:
                raise NotATrace(str(path), 1, hint)
            if parser is None:
                known = "; ".join(",".join(cols) for cols in _CSV_FORMATS)
                raise TraceFormatError(str(path), 1, f"unknown trace format (header "
                                       f"{','.join(header)!r}); known headers: {known}")
            return parser(path, reader)
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceFormatError(str(path), None, f"cannot read: {exc}") from None
