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
- the JSON formats (raw ``describe-spot-price-history`` output, the Can't-Be-Late traces):
  :mod:`pricing.sources.trace_json`, chosen by the ``.json`` / ``.json.gz`` suffix.
- ``aws-ondemand-2017``: ``instance_type,gpu_count,vcpus,memory_gib,region,
  linux_ondemand_usd_per_hour,...`` (ec2instances.info 0.0.2): on-demand quotes, zone ``"*"``,
  timed at :data:`AWS_ONDEMAND_2017_TIME` (the file has no time column).
- ``aws-regional-spot-2021``: ``region,instance_family_group,instance_type,
  linux_spot_usd_per_hour,windows_spot_usd_per_hour`` (spot.js feed): spot quotes, zone
  ``"*"``, feed region names mapped (``us-east`` -> us-east-1), timed at
  :data:`AWS_REGIONAL_SPOT_2021_TIME`; ``N/A*`` cells skipped.
- the user formats (the user CSV, event logs, count series): :mod:`pricing.sources.trace_user`.

Cells and rows are read through :mod:`pricing.sources.trace_io` (finite, believable numbers).

Rule: a malformed file raises :class:`~pricing.errors.TraceFormatError` naming file, line and
problem; rows out of time order and gaps are reported in ``Snapshot.notes`` with file and
line, and records are always sorted by time, so nothing is silently wrong.
"""

from __future__ import annotations

import csv
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterable

from pricing.catalog import canonical_gpu, gpu_for
from pricing.errors import TraceFormatError
from pricing.model import GpuSpec, Lifetime, PriceQuote, Snapshot
from pricing.sources.trace_io import (Offerings, number, open_text,
                                      order_note, parse_time, price, region_of_zone, rows,
                                      time_cell)
from pricing.sources.trace_json import CANT_BE_LATE_TYPES, parse_cant_be_late, parse_json
from pricing.sources.trace_user import (USER_COLUMNS, parse_count_series, parse_event_log,
                                        parse_user, user_formats)

#: parse_time and USER_COLUMNS are re-exported: the commands and tests name them here.
__all__ = ["parse_file", "parse_time", "NotATrace", "USER_COLUMNS", "CANT_BE_LATE_TYPES",
           "parse_cant_be_late"]

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
def parse_aws_events(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """AWS spot price change events; see the module docstring."""
    offs, quotes, skipped, disorder = Offerings(), [], 0, []
    last: datetime | None = None
    gpus: dict[str, GpuSpec] = {}
    for line, (az_id, itype, product, price_text, ts) in rows(path, reader, 5):
        if product != "Linux/UNIX":
            skipped += 1
            continue
        prefix = az_id.split("-az")[0]
        region = AZ_ID_REGIONS.get(prefix)
        if region is None:
            raise TraceFormatError(str(path), line, f"az_id {az_id!r}: unknown AZ ID prefix "
                                   f"{prefix!r} (known: {', '.join(sorted(AZ_ID_REGIONS))})")
        t = time_cell(path, line, "timestamp", ts)
        if last is not None and t < last:
            disorder.append(line)
        last = t
        value = price(path, line, "spot_price_usd_per_hour", price_text, required=True)
        quotes.append(PriceQuote(offs.get("aws", region, az_id, itype, "spot"), t, value, None,
                                 f"{path.name}:{line}"))
        if itype not in gpus and (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    quotes.sort(key=lambda q: q.time)
    notes = [f"{path}: {len(quotes)} Linux/UNIX spot events; {skipped} rows of other operating "
             "systems skipped; no on-demand price in this format"] + order_note(path, disorder)
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=tuple(notes))


def parse_gcp_weekly(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """GCP weekly GPU VM prices; see the module docstring."""
    offs, quotes, disorder = Offerings(), [], []
    times: dict[str, datetime] = {}
    gpus: dict[str, GpuSpec] = {}
    last: datetime | None = None
    for line, row in rows(path, reader, 9):
        snap, mtype, gpu_type, gpu_count, _vcpu, _ram, region, od_text, spot_text = row
        t = times.get(snap)
        if t is None:
            t = times[snap] = time_cell(path, line, "snapshot_time", snap)
        if last is not None and t < last:
            disorder.append(line)
        last = t
        od = price(path, line, "ondemand_usd_per_hour", od_text, required=False)
        spot = price(path, line, "spot_usd_per_hour", spot_text, required=False)
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
    notes += order_note(path, disorder)
    for a, b in zip(snaps, snaps[1:]):
        if b - a > GCP_WEEKLY_MAX_GAP:
            notes.append(f"{path}: gap of {(b - a).days} days between snapshots {a:%Y-%m-%d} and "
                         f"{b:%Y-%m-%d} (prices held from the earlier one)")
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=tuple(notes))


def parse_gcp_lifetimes(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """GCP preemptible lifetimes; instance type ``n1+<gpu>`` (an N1 VM with one GPU)."""
    offs, lifetimes, gpus = Offerings(), [], {}
    for line, (gpu, zone, _vm, _wl, start, _end, hours_text) in rows(path, reader, 7):
        hours = number(path, line, "lifetime_hours", hours_text, required=True, high=24 * 365,
                       fix="hours a VM lived")
        if hours is None or hours < 0:
            raise TraceFormatError(str(path), line, f"lifetime_hours {hours_text!r} must be >= 0")
        itype = f"n1+{canonical_gpu(gpu).lower()}"
        off = offs.get("gcp", region_of_zone("gcp", zone), zone, itype, "spot")
        lifetimes.append(Lifetime(off, time_cell(path, line, "start_time", start), hours * 3600.0,
                                  revoked=hours < GCP_PREEMPTIBLE_CAP_HOURS, source=f"{path.name}:{line}"))
        if (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    censored = sum(not lt.revoked for lt in lifetimes)
    notes = (f"{path}: {len(lifetimes)} lifetimes, {censored} censored at the "
             f"{GCP_PREEMPTIBLE_CAP_HOURS:g} h preemptible cap; times taken as UTC",)
    return Snapshot(lifetimes=tuple(lifetimes), gpus=gpus, notes=notes)


def parse_aws_ondemand_2017(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """AWS on-demand GPU prices of 2017 (no time column: see the module docstring)."""
    offs, quotes, gpus = Offerings(), [], {}
    for line, row in rows(path, reader, 7):
        itype, region, price_t = row[0], row[4], row[5]
        usd = price(path, line, "linux_ondemand_usd_per_hour", price_t, required=True)
        quotes.append(PriceQuote(offs.get("aws", region, "*", itype, "on-demand"),
                                 AWS_ONDEMAND_2017_TIME, usd, usd, f"{path.name}:{line}"))
        if (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    note = f"{path}: {len(quotes)} on-demand prices, timed {AWS_ONDEMAND_2017_TIME:%Y-%m-%d} (file date)"
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=(note,))


def parse_aws_regional_spot(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """AWS region-level spot prices of 2021 (spot.js feed; no time column)."""
    offs, quotes, gpus, skipped = Offerings(), [], {}, 0
    for line, (feed_region, _group, itype, linux, _win) in rows(path, reader, 5):
        region = SPOT_FEED_REGIONS.get(feed_region)
        if region is None:
            raise TraceFormatError(str(path), line, f"region {feed_region!r} unknown; known: "
                                   f"{', '.join(SPOT_FEED_REGIONS)}")
        if linux.strip().upper().startswith("N/A"):
            skipped += 1
            continue
        usd = price(path, line, "linux_spot_usd_per_hour", linux, required=True)
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


def parse_file(path: Path, start: datetime | None = None) -> Snapshot:
    """Detect the format of one file and parse it. ``start`` anchors the times of user
    formats given in a unit (``time_s``, ...). Raises TraceFormatError."""
    if path.name.endswith((".json", ".json.gz")):
        return parse_json(path)
    user = user_formats()
    try:
        with open_text(path) as f:
            reader = csv.reader(f)
            header = tuple(h.strip() for h in next(reader, []))
            parser = _CSV_FORMATS.get(header)
            if parser is not None:
                return parser(path, reader)
            if header in user:
                kind, time_column = user[header]
                if kind == "user":
                    return parse_user(path, reader)
                read = parse_event_log if kind == "events" else parse_count_series
                return read(path, reader, time_column, start)
            hint = _NOT_TRACE_HINTS.get(header[0].split(";")[0]) if header else None
            if hint:
                raise NotATrace(str(path), 1, hint)
            known = "; ".join(",".join(cols) for cols in list(_CSV_FORMATS) + [
                USER_COLUMNS, ("TIME", "event", "instance_id"), ("TIME", "count")])
            raise TraceFormatError(str(path), 1, f"unknown trace format (header "
                                   f"{','.join(header)!r}); known headers: {known} (TIME: time, "
                                   "time_ms, time_s or time_h)")
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error) as exc:
        raise TraceFormatError(str(path), None, f"cannot read: {exc}") from None
