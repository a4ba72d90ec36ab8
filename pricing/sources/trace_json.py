"""The JSON trace formats: raw ``aws ec2 describe-spot-price-history`` output, and the
Can't-Be-Late availability and preemption traces (AWS and GCP types, time of day kept).

Design: one entry point, :func:`parse_json`, reads the document(s) of a ``.json`` or
``.json.gz`` file and tells the format from its keys, never from a guess about the values:

- ``aws-spot-json``: what ``aws ec2 describe-spot-price-history --output json`` prints,
  ``{"SpotPriceHistory": [{"AvailabilityZone", "InstanceType", "ProductDescription",
  "SpotPrice", "Timestamp"}, ...]}`` (several pages concatenated, or a bare list of the
  events, are read too). Linux/UNIX rows only (``Linux/UNIX`` and the older ``Linux/UNIX
  (Amazon VPC)``); the zone is the AZ name, its region the name less the letter; no
  on-demand price in this format.
- ``cant-be-late``: ``{"metadata": {"gap_seconds": G}, "data": [...]}`` under
  ``{availability|preemption}/{N}-node/{cloud}-{MM-DD-YYYY}[-HH-MM[-SS]]/{zone}_{token}.json``.
  The start is the folder's date and time of day (``-HH-MM``), or ``metadata.start`` (ISO
  8601 or Unix seconds) when the file says it; with neither, the start of the day (UTC)
  and a note says so. The token is ``<gpu>_<count>``, mapped per cloud: ``v100_1`` is
  p3.2xlarge on AWS and ``n1+v100`` (an N1 VM with one V100) on GCP, ``a100_8``
  p4d.24xlarge and a2-highgpu-8g, ``t4_1`` g4dn.xlarge and ``n1+t4`` (:func:`cbl_type`).

Rule: a malformed file raises :class:`~pricing.errors.TraceFormatError` with the file and
the fix (one line); records come back sorted by time.
"""

from __future__ import annotations

import gzip
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pricing.catalog import gpu_for
from pricing.errors import TraceFormatError
from pricing.model import GpuSpec, Offering, PriceQuote, Snapshot, Span
from pricing.sources.trace_io import (MAX_PRICE_PER_HOUR, Offerings, availability_to_records,
                                      parse_time, region_of_zone)

#: Can't-Be-Late file-name tokens on AWS (the published traces' own, kept by name).
CANT_BE_LATE_TYPES = {"v100_1": "p3.2xlarge", "v100_8": "p3.16xlarge", "k80_1": "p2.xlarge",
                      "k80_8": "p2.8xlarge", "intel_64": "r5.16xlarge", "c3-88": "c3-highcpu-88"}
#: More AWS tokens (``<gpu>_<count>``) for traces of other types in the same layout.
AWS_TOKENS = {**CANT_BE_LATE_TYPES, "v100_4": "p3.8xlarge", "k80_16": "p2.16xlarge",
              "t4_1": "g4dn.xlarge", "t4_4": "g4dn.12xlarge", "t4_8": "g4dn.metal",
              "a10g_1": "g5.xlarge", "a10g_4": "g5.12xlarge", "a10g_8": "g5.48xlarge",
              "a100_8": "p4d.24xlarge", "h100_8": "p5.48xlarge", "l4_1": "g6.xlarge",
              "m60_1": "g3s.xlarge"}
#: GCP tokens: A100 and L4 come bundled (a2, g2 machine types); others are N1 VMs with the
#: GPUs attached, spelt ``n1+<gpu>[x<count>]`` as for the GCP preemptible lifetimes.
GCP_BUNDLED = {"a100_1": "a2-highgpu-1g", "a100_2": "a2-highgpu-2g", "a100_4": "a2-highgpu-4g",
               "a100_8": "a2-highgpu-8g", "a100_16": "a2-megagpu-16g",
               "l4_1": "g2-standard-4", "l4_2": "g2-standard-24", "l4_4": "g2-standard-48",
               "l4_8": "g2-standard-96", "h100_8": "a3-highgpu-8g", "c3-88": "c3-highcpu-88"}
GCP_ATTACHED = ("v100", "k80", "p100", "p4", "t4")
#: Longest tick of a Can't-Be-Late trace believed (the data's ticks are 30 s to 10 minutes).
CANT_BE_LATE_MAX_GAP_S = 7 * 86400.0
#: ProductDescription values that are Linux (the older CLI output says "(Amazon VPC)").
LINUX = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
AWS_JSON_FIELDS = ("AvailabilityZone", "InstanceType", "ProductDescription", "SpotPrice",
                   "Timestamp")


def cbl_type(cloud: str, token: str) -> str | None:
    """The instance type of a Can't-Be-Late file-name token on ``cloud`` (None: unknown)."""
    if cloud == "aws":
        return AWS_TOKENS.get(token)
    if token in GCP_BUNDLED:
        return GCP_BUNDLED[token]
    m = re.fullmatch(r"([a-z0-9]+)_(\d+)", token)
    if m and m.group(1) in GCP_ATTACHED and int(m.group(2)) in (1, 2, 4, 8):
        n = int(m.group(2))
        return f"n1+{m.group(1)}" + (f"x{n}" if n > 1 else "")
    return None


def _documents(path: Path) -> list[Any]:
    """Every JSON document in the file (pages of CLI output may be concatenated)."""
    try:
        raw = gzip.open(path, "rb").read() if path.name.endswith(".gz") else path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(str(path), None, f"cannot read: {exc}") from None
    decoder, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        try:
            doc, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(str(path), exc.lineno, f"not valid JSON: {exc.msg} at column "
                                   f"{exc.colno} (a .json trace is the output of `aws ec2 "
                                   "describe-spot-price-history --output json`, whole, or a "
                                   "Can't-Be-Late trace; other traces are CSV)") from None
        docs.append(doc)
    if not docs:
        raise TraceFormatError(str(path), None, "empty file: a JSON trace needs a document")
    return docs


def parse_json(path: Path) -> Snapshot:
    """Detect the JSON format of one file (see the module docstring) and parse it."""
    docs = _documents(path)
    first = docs[0]
    if isinstance(first, dict) and "SpotPriceHistory" in first or (
            isinstance(first, list) and first and isinstance(first[0], dict)
            and "SpotPrice" in first[0]):
        return parse_aws_spot_json(path, docs)
    if isinstance(first, dict) and ("metadata" in first or "data" in first):
        if len(docs) > 1:
            raise TraceFormatError(str(path), None, "a Can't-Be-Late trace holds one document; "
                                   "split the file, one trace per zone and type")
        return parse_cant_be_late(path, first)
    raise TraceFormatError(str(path), None, 'unknown JSON trace: expected the output of `aws '
                           'ec2 describe-spot-price-history --output json` ({"SpotPriceHistory":'
                           ' [...]}) or a Can\'t-Be-Late trace ({"metadata": {"gap_seconds": '
                           'G}, "data": [...]})')


def parse_aws_spot_json(path: Path, docs: list[Any]) -> Snapshot:
    """``describe-spot-price-history`` JSON; see the module docstring."""
    events: list[Any] = []
    for doc in docs:
        items = doc.get("SpotPriceHistory") if isinstance(doc, dict) else doc
        if not isinstance(items, list):
            raise TraceFormatError(str(path), None, '"SpotPriceHistory" must be a list of price '
                                   "events (the CLI's output, unchanged)")
        events.extend(items)
    offs, quotes, skipped, disorder = Offerings(), [], 0, []
    gpus: dict[str, GpuSpec] = {}
    last: datetime | None = None
    for k, ev in enumerate(events):
        where = f"SpotPriceHistory[{k}]"
        missing = [f for f in AWS_JSON_FIELDS if not isinstance(ev, dict) or f not in ev]
        if missing:
            raise TraceFormatError(str(path), None, f"{where}: missing {', '.join(missing)} "
                                   "(pass the CLI's output unchanged, without --query)")
        if ev["ProductDescription"] not in LINUX:
            skipped += 1
            continue
        zone, itype = str(ev["AvailabilityZone"]), str(ev["InstanceType"])
        try:
            t = parse_time(str(ev["Timestamp"]))
            price = float(ev["SpotPrice"])
        except (ValueError, OverflowError):
            raise TraceFormatError(str(path), None, f"{where}: Timestamp {ev['Timestamp']!r} or "
                                   f"SpotPrice {ev['SpotPrice']!r} is not readable (ISO 8601 "
                                   "time, price in USD per hour)") from None
        if not (0.0 < price <= MAX_PRICE_PER_HOUR):
            raise TraceFormatError(str(path), None, f"{where}: SpotPrice {ev['SpotPrice']!r} is "
                                   f"not believable (a price in USD per hour, at most "
                                   f"{MAX_PRICE_PER_HOUR:g})")
        if last is not None and t < last:
            disorder.append(k)
        last = t
        try:
            off = offs.get("aws", region_of_zone("aws", zone), zone, itype, "spot")
        except ValueError as exc:
            raise TraceFormatError(str(path), None, f"{where}: {exc}") from None
        quotes.append(PriceQuote(off, t, price, None, f"{path.name}:{where}"))
        if itype not in gpus and (spec := gpu_for(itype)) is not None:
            gpus[itype] = spec
    quotes.sort(key=lambda q: q.time)
    notes = [f"{path}: {len(quotes)} Linux/UNIX spot price events from describe-spot-price-"
             f"history JSON; {skipped} events of other operating systems skipped; no "
             "on-demand price in this format"]
    if disorder:  # (the CLI prints newest first: that is not an error, only sorted)
        notes.append(f"{path}: events not in time order (the CLI prints newest first): sorted")
    return Snapshot(quotes=tuple(quotes), gpus=gpus, notes=tuple(notes))


def _start(path: Path, date: tuple[str, ...], meta: dict) -> tuple[datetime, str]:
    """The trace's start and how it was known (metadata, folder time, or the day only)."""
    mm, dd, yyyy, hh, mi, ss = date
    given = meta.get("start", meta.get("start_time"))
    if given is not None:
        try:
            return parse_time(str(given)), "metadata.start"
        except (ValueError, OverflowError):
            raise TraceFormatError(str(path), None, f"metadata.start {given!r}: not an ISO 8601 "
                                   "time or Unix seconds") from None
    try:
        t = datetime(int(yyyy), int(mm), int(dd), int(hh or 0), int(mi or 0), int(ss or 0),
                     tzinfo=timezone.utc)
    except ValueError:
        raise TraceFormatError(str(path), None, f"folder {path.parent.name!r}: not a real date "
                               "and time (name it {aws|gcp}-MM-DD-YYYY[-HH-MM[-SS]])") from None
    if hh is None:
        return t, ("start of day UTC: the folder gives only the date (name it "
                   "{cloud}-MM-DD-YYYY-HH-MM or set metadata.start to keep the time of day)")
    return t, "folder name"


def parse_cant_be_late(path: Path, doc: Any = None) -> Snapshot:
    """A Can't-Be-Late JSON trace; the layout of its path gives cloud, date, zone and type."""
    m_dir = re.fullmatch(r"(aws|gcp)-(\d\d)-(\d\d)-(\d{4})(?:-(\d\d)-(\d\d)(?:-(\d\d))?)?",
                         path.parent.name)
    if m_dir is None:
        raise TraceFormatError(str(path), None, f"folder {path.parent.name!r} must be named "
                               "{aws|gcp}-MM-DD-YYYY[-HH-MM[-SS]] (the trace's start)")
    cloud = m_dir.group(1)
    stem = re.sub(r"\.json(\.gz)?$", "", path.name)
    zone, _, token = stem.partition("_")
    itype = cbl_type(cloud, token)
    if itype is None:
        known = AWS_TOKENS if cloud == "aws" else [*GCP_BUNDLED, *(f"{g}_N" for g in GCP_ATTACHED)]
        raise TraceFormatError(str(path), None, f"file-name token {token!r} unknown on {cloud}; "
                               f"expected <zone>_<token>.json with token one of "
                               f"{', '.join(known)}")
    m_nodes = re.fullmatch(r"(\d+)-node", path.parent.parent.name)
    capacity = int(m_nodes.group(1)) if m_nodes else None
    if doc is None:
        doc = _documents(path)[0]
    try:
        meta = doc["metadata"]
        gap = float(meta["gap_seconds"])
        data = doc["data"]
    except (KeyError, TypeError, ValueError):
        raise TraceFormatError(str(path), None, 'expected {"metadata": {"gap_seconds": G}, '
                               '"data": [...]}') from None
    if not isinstance(data, list) or not (0 < gap <= CANT_BE_LATE_MAX_GAP_S):
        raise TraceFormatError(str(path), None, f"metadata.gap_seconds={gap!r}: must be a number "
                               f"of seconds in (0, {CANT_BE_LATE_MAX_GAP_S:g}], and data a list")
    if len(data) < 2:
        raise TraceFormatError(str(path), None, f"data holds {len(data)} tick(s): a trace needs at "
                               "least two (its start and its end)")
    start, how = _start(path, m_dir.groups()[1:], meta)
    samples: list[tuple[datetime, int]] = []
    for i, v in enumerate(data):
        if not isinstance(v, (int, float)) or v < 0 or v != int(v) or (capacity and v > capacity):
            raise TraceFormatError(str(path), None, f"data[{i}]={v!r}: must be an integer count "
                                   f"0..{capacity or 'N'}")
        samples.append((start + timedelta(seconds=i * gap), int(v)))
    end = start + timedelta(seconds=len(data) * gap)
    try:
        off = Offering(cloud, region_of_zone(cloud, zone), zone, itype, "spot")
    except ValueError as exc:
        raise TraceFormatError(str(path), None, f"zone {zone!r}: {exc}") from None
    records, lifetimes = availability_to_records(off, samples, end, capacity, path.name)
    gpus = {itype: spec} if (spec := gpu_for(itype)) is not None else {}
    note = (f"{path}: {len(data)} ticks of {gap:g} s from {start:%Y-%m-%d %H:%M} UTC ({how}), "
            f"{len(records)} changes, {sum(lt.revoked for lt in lifetimes)} revocations; "
            f"{token} is {itype} on {cloud}")
    return Snapshot(availability=tuple(records), lifetimes=tuple(lifetimes), gpus=gpus,
                    notes=(note,), spans=(Span(off, start, end, path.name),))


__all__ = ["parse_json", "parse_cant_be_late", "parse_aws_spot_json", "cbl_type",
           "CANT_BE_LATE_TYPES"]
