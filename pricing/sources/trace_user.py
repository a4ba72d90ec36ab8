"""The documented trace formats for users' own data: the user CSV, event logs, count series.

Design: three CSV shapes, told apart by their header (see :func:`pricing.sources.
trace_formats.parse_file`), each parsed into the common :class:`~pricing.model.Snapshot`:

- **user CSV** (:data:`USER_COLUMNS`): ``time,cloud,region,zone,instance_type,market,
  price_per_hour,on_demand_per_hour,available``, any offering on any row; empty cells mean
  "not known". An offering whose ``available`` is only ever 0 or 1 is a capacity probe
  (capacity 1, read like a 1-node Can't-Be-Late trace: spot there or not; a note says so);
  a value above 1 anywhere in its series makes it a count of instances.
- **event log** (``TIME,event,instance_id``): one row per instance added to or removed from
  a group (an autoscaling group's activity, a fleet's launch and reclaim log), ``event``
  ``add`` or ``remove``. Each instance's life is exact (add to remove); the group's count
  is its availability; every removal is a revocation.
- **count series** (``TIME,count``): the instances a group held at each time (a monitoring
  export). A fall of ``k`` is ``k`` revocations (the oldest first), a rise new instances.

``TIME`` is ``time`` (ISO 8601, or Unix seconds) or a number in a named unit, ``time_ms``,
``time_s`` or ``time_h``, counted from the start given with ``--trace-start`` (files
without dates), else from the Unix epoch. Event logs and count series hold one offering,
named by the file: ``<cloud>_<zone>_<instance_type>[_<market>].csv`` (optionally
``.csv.gz``), e.g. ``aws_us-east-1a_p3.2xlarge.csv``; the region is the zone's.

Bad input is reported and resolved, never turned into invented changes: rows at the same
time keep the last one (one change, not a flap); count-series rows that go back in time
repeat a period already read (two exports concatenated) and are dropped; an event log's
second ``add`` of a live instance or ``remove`` of a gone one is ignored; a ``remove``
without an ``add`` is an instance alive from the log's start. Each is one note with file
and line. A series needs two distinct times (a start and an end): one row is an error (in the user CSV, a single availability row is a view of
"now", fine for ``provision plan``; its span is empty and the simulator refuses it).

Rule: every series' observed period is a :class:`~pricing.model.Span`; nothing here
assumes a value beyond it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Iterable

from pricing.catalog import gpu_for
from pricing.errors import TraceFormatError
from pricing.model import (MARKETS, Availability, GpuSpec, Lifetime, Offering, PriceQuote,
                           Snapshot, Span)
from pricing.sources.trace_io import (TIME_UNITS, Offerings, availability_to_records, count,
                                      order_note, price, region_of_zone, rows, time_cell)

#: Header of the user trace format. ``time``: ISO 8601 (UTC if no offset) or Unix seconds;
#: ``market``: spot | on-demand; prices USD/h; ``available``: count held, or a 0/1 probe. Empty
#: cells mean "not known": a row without a price gives no quote, one without ``available``
#: no availability sample.
USER_COLUMNS = ("time", "cloud", "region", "zone", "instance_type", "market", "price_per_hour",
                "on_demand_per_hour", "available")
#: The columns after the time column of an event log and of a count series.
EVENT_COLUMNS = ("event", "instance_id")
COUNT_COLUMNS = ("count",)
#: A gap in a user trace longer than this many times the offering's median step is reported.
USER_GAP_FACTOR = 10.0
#: How an event log's or count series' file is named.
NAME_HINT = ("name the file <cloud>_<zone>_<instance_type>[_<market>].csv, e.g. "
             "aws_us-east-1a_p3.2xlarge.csv")


def offering_of_name(path: Path) -> Offering:
    """The offering an event log or count series holds, from its file name."""
    stem = re.sub(r"\.csv(\.gz)?$", "", path.name)
    parts = stem.split("_")
    if len(parts) == 4 and parts[3] in MARKETS:
        cloud, zone, itype, market = parts
    elif len(parts) == 3:
        (cloud, zone, itype), market = parts, "spot"
    else:
        raise TraceFormatError(str(path), None, f"cannot tell the offering from the name: {NAME_HINT}")
    try:
        return Offering(cloud, region_of_zone(cloud, zone), zone, itype, market)
    except ValueError as exc:
        raise TraceFormatError(str(path), None, f"{exc}; {NAME_HINT}") from None


def _gpus(itype: str) -> dict[str, GpuSpec]:
    spec = gpu_for(itype)
    return {itype: spec} if spec is not None else {}


def _one_time(path: Path, what: str, line: int) -> TraceFormatError:
    return TraceFormatError(str(path), line, f"{what} has a single time: a trace needs at least "
                            "two (its start and its end), e.g. a second row at the end of the "
                            "period observed")


def parse_count_series(path: Path, reader: Iterable[list[str]], time_column: str,
                       start: datetime | None = None) -> Snapshot:
    """A count series (``TIME,count``); see the module docstring."""
    off = offering_of_name(path)
    samples: list[tuple[datetime, int, int]] = []
    dup_lines: list[int] = []
    back_lines: list[int] = []
    for line, (t_text, n_text) in rows(path, reader, 2):
        t = time_cell(path, line, time_column, t_text, start)
        n = count(path, line, "count", n_text)
        if samples and t < samples[-1][0]:
            back_lines.append(line)  # a period already read: the first reading stands
            continue
        if samples and t == samples[-1][0]:
            dup_lines.append(line)
            samples[-1] = (t, n, line)
            continue
        samples.append((t, n, line))
    if not samples:
        raise TraceFormatError(str(path), None, "no rows: a count series needs rows of TIME,count")
    if len(samples) < 2:
        raise _one_time(path, "the count series", samples[0][2])
    notes = [f"{path}: count series of {off.key}, {len(samples)} times "
             f"{samples[0][0]:%Y-%m-%d %H:%M}..{samples[-1][0]:%Y-%m-%d %H:%M} UTC"]
    if dup_lines:
        notes.append(f"{path}:{dup_lines[0]}: {len(dup_lines)} row(s) repeat the time of the row "
                     "before: the last one kept (one change, not a flap)")
    if back_lines:
        notes.append(f"{path}:{back_lines[0]}: {len(back_lines)} row(s) go back in time into a "
                     "period already read (overlapping exports?): dropped, the first reading kept")
    end = samples[-1][0]
    recs, lts = availability_to_records(off, [(t, n) for t, n, _ in samples], end, None, path.name)
    return Snapshot(availability=tuple(recs), lifetimes=tuple(lts), gpus=_gpus(off.instance_type),
                    notes=tuple(notes), spans=(Span(off, samples[0][0], end, path.name),))


def parse_event_log(path: Path, reader: Iterable[list[str]], time_column: str,
                    start: datetime | None = None) -> Snapshot:
    """An event log (``TIME,event,instance_id``); see the module docstring."""
    off = offering_of_name(path)
    events: list[tuple[datetime, int, str, int]] = []  # (time, order, kind, line) by id
    ids: list[str] = []
    disorder: list[int] = []
    for line, (t_text, kind, iid) in rows(path, reader, 3):
        t = time_cell(path, line, time_column, t_text, start)
        kind = kind.strip().lower()
        if kind not in ("add", "remove"):
            raise TraceFormatError(str(path), line, f"column 'event': {kind!r} must be add or remove")
        iid = iid.strip()
        if not iid:
            raise TraceFormatError(str(path), line, "column 'instance_id' is empty")
        if events and t < events[-1][0]:
            disorder.append(line)
        events.append((t, len(events), kind, line))
        ids.append(iid)
    if not events:
        raise TraceFormatError(str(path), None, "no rows: an event log needs rows of TIME,event,"
                               "instance_id")
    order = sorted(range(len(events)), key=lambda i: events[i][:2])
    t0, t_end = events[order[0]][0], events[order[-1]][0]
    if t0 == t_end:
        raise _one_time(path, "the event log", events[0][3])
    first_kind: dict[str, str] = {}
    for i in order:
        first_kind.setdefault(ids[i], events[i][2])
    alive: dict[str, datetime] = {iid: t0 for iid, k in first_kind.items() if k == "remove"}
    counts: dict[datetime, int] = {t0: len(alive)}
    lifetimes: list[Lifetime] = []
    dup: list[int] = []
    for i in order:
        t, _, kind, line = events[i]
        iid = ids[i]
        if kind == "add":
            if iid in alive:
                dup.append(line)
                continue
            alive[iid] = t
        else:
            began = alive.pop(iid, None)
            if began is None:
                dup.append(line)
                continue
            lifetimes.append(Lifetime(off, began, (t - began).total_seconds(), True,
                                      f"{path.name}:{line}"))
        counts[t] = len(alive)  # the count after every event at t: one change per time
    for began in alive.values():
        lifetimes.append(Lifetime(off, began, (t_end - began).total_seconds(), False, path.name))
    records: list[Availability] = []
    for t in sorted(counts):
        if not records or records[-1].available != counts[t]:
            records.append(Availability(off, t, counts[t], None, path.name))
    early = sum(1 for k in first_kind.values() if k == "remove")
    notes = [f"{path}: event log of {off.key}, {len(events)} events "
             f"{t0:%Y-%m-%d %H:%M}..{t_end:%Y-%m-%d %H:%M} UTC, "
             f"{sum(lt.revoked for lt in lifetimes)} removals (revocations)"]
    notes += order_note(path, disorder)
    if early:
        notes.append(f"{path}: {early} instance(s) removed without an add: taken as alive from "
                     "the log's start")
    if dup:
        notes.append(f"{path}:{dup[0]}: {len(dup)} event(s) add a live instance or remove a gone "
                     "one again: ignored (duplicates)")
    return Snapshot(availability=tuple(records), lifetimes=tuple(lifetimes),
                    gpus=_gpus(off.instance_type), notes=tuple(notes),
                    spans=(Span(off, t0, t_end, path.name),))


def parse_user(path: Path, reader: Iterable[list[str]]) -> Snapshot:
    """The documented user CSV (:data:`USER_COLUMNS`)."""
    offs, quotes, disorder, gpus = Offerings(), [], [], {}
    samples: dict[Offering, list[tuple[datetime, int, int]]] = defaultdict(list)
    last: datetime | None = None
    for line, row in rows(path, reader, len(USER_COLUMNS)):
        t_text, cloud, region, zone, itype, market, price_t, od_t, avail_t = (c.strip() for c in row)
        t = time_cell(path, line, "time", t_text)
        try:
            off = offs.get(cloud, region, zone or "*", itype, market or "spot")
        except ValueError as exc:
            raise TraceFormatError(str(path), line, str(exc)) from None
        if last is not None and t < last:
            disorder.append(line)
        last = t
        p = price(path, line, "price_per_hour", price_t, required=False)
        od = price(path, line, "on_demand_per_hour", od_t, required=False)
        if p is not None:
            quotes.append(PriceQuote(off, t, p, od, f"{path.name}:{line}"))
        if avail_t:
            samples[off].append((t, count(path, line, "available", avail_t), line))
        if itype not in gpus:
            gpus.update(_gpus(itype))
    quotes.sort(key=lambda q: q.time)
    notes = order_note(path, disorder)
    availability: list[Availability] = []
    lifetimes: list[Lifetime] = []
    spans: list[Span] = []
    probes: list[str] = []
    for off, series in samples.items():
        series.sort(key=lambda r: r[0])
        kept: list[tuple[datetime, int, int]] = []
        dups = 0
        for r in series:
            if kept and kept[-1][0] == r[0]:
                kept[-1], dups = r, dups + 1
            else:
                kept.append(r)
        if dups:
            notes.append(f"{path}: {dups} availability row(s) of {off} repeat a time: the last "
                         "one kept (one change, not a flap)")
        steps = sorted((b[0] - a[0]).total_seconds() for a, b in zip(kept, kept[1:]))
        median = steps[len(steps) // 2] if steps else 0.0
        for a, b in zip(kept, kept[1:]):
            if median > 0 and (b[0] - a[0]).total_seconds() > USER_GAP_FACTOR * median:
                notes.append(f"{path}:{b[2]}: gap of {b[0] - a[0]} in availability of {off} "
                             f"(median step {median:g} s); the earlier value is held across it")
        end = kept[-1][0]  # the last value is known at its instant only: no exposure after it
        probe = all(n in (0, 1) for _, n, _ in kept)  # a capacity probe: is there spot or not
        if probe:
            probes.append(str(off))
        recs, lts = availability_to_records(off, [(t, n) for t, n, _ in kept], end,
                                            1 if probe else None, path.name)
        availability += recs
        lifetimes += lts
        spans.append(Span(off, kept[0][0], end, path.name))
    if probes:
        more = ", ..." if len(probes) > 3 else ""
        notes.append(f"{path}: the availability of {len(probes)} offering(s) is only 0 and 1 "
                     f"({', '.join(probes[:3])}{more}): read as capacity probes (1: spot "
                     "capacity there, as many instances as the fleet may hold; 0: none), as "
                     "for a 1-node Can't-Be-Late trace; a count above 1 in a series makes it "
                     "a count of instances")
    availability.sort(key=lambda a: a.time)
    return Snapshot(quotes=tuple(quotes), availability=tuple(availability),
                    lifetimes=tuple(lifetimes), gpus=gpus, notes=tuple(notes), spans=tuple(spans))


def user_formats() -> dict[tuple[str, ...], tuple[str, str]]:
    """Header -> (format, time column) for every user format with every time column."""
    out: dict[tuple[str, ...], tuple[str, str]] = {USER_COLUMNS: ("user", "time")}
    for col in TIME_UNITS:
        out[(col,) + EVENT_COLUMNS] = ("events", col)
        out[(col,) + COUNT_COLUMNS] = ("counts", col)
    return out

