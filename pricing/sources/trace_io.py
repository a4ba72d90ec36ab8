"""Cell and row readers shared by every trace format, and counts turned into records.

Design: the parsers (:mod:`pricing.sources.trace_formats` for the published datasets,
:mod:`pricing.sources.trace_user` for the documented user formats) read files only through
these helpers, so every format refuses the same bad input the same way: a
:class:`~pricing.errors.TraceFormatError` naming file, line, column and the fix. Numbers must
be finite and within the bound the caller gives (a price of 1e308 or a gap of 1e300 seconds
is refused, not carried into a cost); times are ISO 8601 or Unix seconds, or a number in a
named unit (``time_ms``, ``time_s``, ``time_h``) counted from a start the user gives.

:func:`availability_to_records` is the one place counts become availability records,
lifetimes (the hazard the policy learns) and removals (the revocations the simulator
applies): both come from the same falls of the same count.

Rule: times are aware UTC datetimes; a parser never returns records out of time order.
"""

from __future__ import annotations

import gzip
import io
import math
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable

from pricing.errors import TraceFormatError
from pricing.model import Availability, Lifetime, Offering

#: The time column of the user formats: ``time`` holds ISO 8601 or Unix seconds; the others
#: hold a number in the unit they name, counted from the start given with ``--trace-start``
#: (else from the Unix epoch).
TIME_UNITS = {"time": None, "time_ms": 1e-3, "time_s": 1.0, "time_h": 3600.0}
#: A unit-column time before this, with no start given, is a relative time read as epoch
#: time (a trace from 1970): refused with the fix (give the start).
EARLIEST_ABSOLUTE = datetime(2000, 1, 1, tzinfo=timezone.utc)
#: Latest time any trace may hold (keeps datetime arithmetic finite).
LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)
#: Highest believable price, USD per hour: ten times the dearest instance in
#: ../shared/data (GCP a3-megagpu-8g, about $100/h on-demand).
MAX_PRICE_PER_HOUR = 1000.0
#: Highest believable count of instances in one availability series.
MAX_COUNT = 100_000


def parse_time(text: str) -> datetime:
    """ISO 8601 (naive means UTC) or Unix seconds -> aware UTC datetime. Raises ValueError."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d*)?", text):
        return datetime.fromtimestamp(float(text), tz=timezone.utc)
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


class Offerings:
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


def number(path: Path, line: int, column: str, text: str, *, required: bool,
           high: float = math.inf, fix: str = "") -> float | None:
    """The number in a cell; None for an empty cell unless ``required``. Refuses text, NaN,
    infinities and values above ``high`` (``fix`` says what is expected)."""
    text = text.strip()
    if not text:
        if required:
            raise TraceFormatError(str(path), line, f"column {column!r} is empty")
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(str(path), line, f"column {column!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or value > high:
        raise TraceFormatError(str(path), line, f"column {column!r}: {text!r} is not believable"
                               + (f" ({fix})" if fix else ""))
    return value


def price(path: Path, line: int, column: str, text: str, *, required: bool) -> float | None:
    """A price cell in USD per hour (finite, at most :data:`MAX_PRICE_PER_HOUR`)."""
    return number(path, line, column, text, required=required, high=MAX_PRICE_PER_HOUR,
                  fix=f"a price in USD per hour, at most {MAX_PRICE_PER_HOUR:g}")


def count(path: Path, line: int, column: str, text: str) -> int:
    """An instance count cell: an integer 0..:data:`MAX_COUNT`."""
    value = number(path, line, column, text, required=True, high=MAX_COUNT,
                   fix=f"a count of instances, 0..{MAX_COUNT}")
    if value is None or value < 0 or value != int(value):
        raise TraceFormatError(str(path), line, f"column {column!r}: {text!r} must be a count "
                               "of instances (an integer >= 0)")
    return int(value)


def time_cell(path: Path, line: int, column: str, text: str,
              start: datetime | None = None) -> datetime:
    """A time cell of ``column`` (see :data:`TIME_UNITS`); ``start`` anchors unit columns."""
    unit = TIME_UNITS.get(column)
    try:
        if unit is None:
            t = parse_time(text)
        else:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            t = (start or datetime(1970, 1, 1, tzinfo=timezone.utc)) + timedelta(
                seconds=value * unit)
    except (ValueError, OverflowError):
        what = ("an ISO 8601 time or Unix seconds" if unit is None
                else f"a number of {column[5:]} from the trace's start")
        raise TraceFormatError(str(path), line, f"column {column!r}: {text!r} is not {what}") from None
    if unit is not None and start is None and t < EARLIEST_ABSOLUTE:
        raise TraceFormatError(str(path), line, f"column {column!r}: {text.strip()} is a time "
                               "from the trace's start, and no start was given: pass "
                               "--trace-start ISO_TIME (e.g. 2024-01-01T00:00:00Z)")
    if t >= LATEST:
        raise TraceFormatError(str(path), line, f"column {column!r}: {text.strip()!r} is after "
                               f"{LATEST:%Y}: not a believable time")
    return t


def order_note(path: Path, lines_out_of_order: list[int]) -> list[str]:
    if not lines_out_of_order:
        return []
    return [f"{path}:{lines_out_of_order[0]}: {len(lines_out_of_order)} row(s) out of time order "
            "(sorted by time on load)"]


def rows(path: Path, reader: Iterable[list[str]], width: int) -> Iterable[tuple[int, list[str]]]:
    for line, row in enumerate(reader, start=2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != width:
            raise TraceFormatError(str(path), line, f"expected {width} columns, found {len(row)}")
        yield line, row


def availability_to_records(off: Offering, samples: list[tuple[datetime, int]], end: datetime,
                            capacity: int | None, source: str
                            ) -> tuple[list[Availability], list[Lifetime]]:
    """Turn time-sorted availability counts into change records and lifetimes.

    Availability records are emitted at the first sample and at every change (the value
    holds until the next record). Each unit of count is one instance: a rise starts
    lifetimes, a fall revokes the oldest ones (FIFO; the hazard MLE depends only on the total
    exposure and the number of falls, not on which instance fell), and instances still up at
    ``end`` are censored. The revoked lifetimes' ends are the removals the simulator applies
    (:mod:`provisioner.sim.world`), so the hazard learned and the revocations suffered are
    the same falls.
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
