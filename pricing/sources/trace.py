"""Replay of recorded traces (prices, availability, lifetimes) at any speed.

Design: :func:`load_trace` reads every known format (see :mod:`pricing.sources.trace_formats`)
into one :class:`~pricing.model.Snapshot` holding the whole history; :class:`TraceSource`
indexes it once and answers ``fetch(now=t)`` with the view *at trace time t*: the latest quote
per offering at or before t, the availability in force at t, and the lifetimes as they could
have been observed by t (ended ones as recorded, running ones censored at t), so a replay
never sees the future. :class:`ReplayClock` maps wall time to trace time at any ``speed``,
with the clock injected so tests and the simulator run faster than real time.

Rule for callers: ``now`` passed to :meth:`TraceSource.fetch` is *trace* time. To replay, give
the source a :class:`ReplayClock` and call ``fetch()`` without ``now``. Without either, the
view is at the end of the trace (what "now" means for a history file).
"""

from __future__ import annotations

import bisect
import logging
import time as _time
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Iterable, Sequence

from pricing.catalog import canonical_gpu
from pricing.errors import TraceFormatError
from pricing.model import Availability, Lifetime, Offering, PriceQuote, Snapshot, Span, utc
from pricing.sources.trace_formats import USER_COLUMNS, NotATrace, parse_file

log = logging.getLogger(__name__)

__all__ = ["load_trace", "TraceSource", "ReplayClock", "USER_COLUMNS"]

_TRACE_SUFFIXES = (".csv", ".csv.gz", ".json", ".json.gz")
#: Files in a trace folder that are indexes or raw upstream copies of a tidied trace.
_NOT_TRACES = {"index.csv", "gcp_pricing_snapshots.csv", "cake_lab_lifetime_raw.csv"}


def _trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = [p for p in sorted(path.rglob("*"))
                 if p.is_file() and p.name.endswith(_TRACE_SUFFIXES) and p.name not in _NOT_TRACES]
        if not files:
            raise TraceFormatError(str(path), None, "folder holds no trace files (*.csv, *.csv.gz, *.json, *.json.gz)")
        return files
    if not path.exists():
        raise TraceFormatError(str(path), None, "no such file (pass an existing trace with --trace)")
    return [path]


def merge(snapshots: Iterable[Snapshot]) -> Snapshot:
    """Concatenate snapshots; quotes and availability sorted by time. Two files observing
    the same offering over overlapping periods would interleave into invented flaps: the
    file that starts first is kept for that offering, the other's records of it dropped,
    and a note names both."""
    snaps = list(snapshots)
    gpus: dict = {}
    for s in snaps:
        gpus.update(s.gpus)
    spans = sorted(((sp, i) for i, s in enumerate(snaps) for sp in s.spans),
                   key=lambda si: (si[0].start, si[1]))
    kept: dict[Offering, list[Span]] = defaultdict(list)
    dropped: set[tuple[Offering, int]] = set()  # (offering, index of the snapshot)
    notes = [n for s in snaps for n in s.notes]
    for sp, i in spans:
        clash = next((k for k in kept[sp.offering] if sp.start < k.end and k.start < sp.end), None)
        if clash is None:
            kept[sp.offering].append(sp)
            continue
        dropped.add((sp.offering, i))
        notes.append(f"{sp.source} observes {sp.offering} over {sp.start:%Y-%m-%d %H:%M}.."
                     f"{sp.end:%Y-%m-%d %H:%M}, overlapping {clash.source}: its records of it "
                     f"are dropped, the first file's kept")
    return Snapshot(
        quotes=tuple(sorted((q for s in snaps for q in s.quotes), key=lambda q: q.time)),
        availability=tuple(sorted((a for i, s in enumerate(snaps) for a in s.availability
                                   if (a.offering, i) not in dropped), key=lambda a: a.time)),
        lifetimes=tuple(lt for i, s in enumerate(snaps) for lt in s.lifetimes
                        if (lt.offering, i) not in dropped),
        gpus=gpus,
        rejected=tuple(r for s in snaps for r in s.rejected),
        notes=tuple(notes),
        spans=tuple(sp for ks in kept.values() for sp in ks),
    )


def load_trace(path: str | Path | Sequence[str | Path], *, start: datetime | None = None
               ) -> Snapshot:
    """Read one trace file, every trace file under a folder, or a list of those.

    Known data files that are not traces (Spot Advisor, zone lists, throughput tables) are
    skipped with a note inside a folder, and refused with a hint when named directly.
    ``start`` anchors user formats whose times are a number in a unit (``time_s``, ...;
    ``--trace-start``). Returns the whole history as one Snapshot (records sorted by time;
    disorder, gaps and overlaps reported in ``notes``). Raises :class:`TraceFormatError`
    naming file, line and problem for a missing, unreadable or malformed file or an
    unknown format.
    """
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if not paths:
        raise TraceFormatError("<none>", None, "no trace given (pass --trace PATH)")
    snaps = []
    for p in paths:
        in_folder = Path(p).is_dir()
        for f in _trace_files(Path(p)):
            t0 = _time.perf_counter()
            try:
                snaps.append(parse_file(f, start))
            except NotATrace as exc:
                if not in_folder:
                    raise
                snaps.append(Snapshot(notes=(f"skipped {exc}",)))
                continue
            log.info("loaded trace %s in %.2f s", f, _time.perf_counter() - t0)
    return merge(snaps)


def _join_on_demand(quotes: list[PriceQuote]) -> tuple[list[PriceQuote], int]:
    """Give spot quotes without an on-demand price the one in force for the same (cloud,
    region, instance type): the latest on-demand quote, or on-demand price on another quote,
    in the same view. Returns the quotes and how many were joined."""
    od: dict[tuple[str, str, str], tuple[datetime, float]] = {}
    for q in quotes:
        price = q.price_per_hour if q.offering.market == "on-demand" else q.on_demand_per_hour
        if price is None:
            continue
        key = (q.offering.cloud, q.offering.region, q.offering.instance_type)
        if key not in od or od[key][0] < q.time:
            od[key] = (q.time, price)
    out, joined = [], 0
    for q in quotes:
        key = (q.offering.cloud, q.offering.region, q.offering.instance_type)
        if q.offering.market == "spot" and q.on_demand_per_hour is None and key in od:
            q = replace(q, on_demand_per_hour=od[key][1])
            joined += 1
        out.append(q)
    return out, joined


@dataclass(frozen=True)
class ReplayClock:
    """Maps wall time to trace time: ``trace = trace_start + (clock() - wall_start) * speed``.

    ``clock`` returns seconds (default ``time.monotonic``); ``wall_start`` defaults to the
    clock's value when the replay clock is made (see :meth:`starting_now`).
    """

    trace_start: datetime
    wall_start: float
    speed: float = 1.0
    clock: Callable[[], float] = _time.monotonic

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError(f"ReplayClock.speed={self.speed!r}: must be > 0")
        object.__setattr__(self, "trace_start", utc(self.trace_start))

    @classmethod
    def starting_now(cls, trace_start: datetime, speed: float = 1.0,
                     clock: Callable[[], float] = _time.monotonic) -> "ReplayClock":
        return cls(trace_start, clock(), speed, clock)

    def trace_time(self, wall: float | None = None) -> datetime:
        """Trace time at wall-clock reading ``wall`` (default: the clock now)."""
        w = self.clock() if wall is None else wall
        return self.trace_start + timedelta(seconds=(w - self.wall_start) * self.speed)


class TraceSource:
    """A :class:`~pricing.sources.base.PriceSource` over recorded traces.

    ``TraceSource(paths, speed=60, clock=fake)`` replays from the trace start (or ``start``)
    at 60x; ``TraceSource(paths)`` answers at the trace end unless ``fetch(now=...)`` says.
    ``sanitize=True`` passes the whole history through :func:`pricing.sanity.check` once at
    load (refusals in ``history.rejected``), so views never hold a refused quote.
    """

    name = "trace"

    def __init__(self, paths: str | Path | Sequence[str | Path], *, speed: float | None = None,
                 clock: Callable[[], float] | None = None, start: datetime | None = None,
                 snapshot: Snapshot | None = None, sanitize: bool = False) -> None:
        self.paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        self.history = snapshot if snapshot is not None else load_trace(self.paths)
        if sanitize:  # refuse bad rows once, so the view at t is the latest *believable* quote
            from pricing.sanity import check

            ok, refused = check(self.history.quotes)
            self.history = replace(self.history, quotes=tuple(ok),
                                   rejected=self.history.rejected + tuple(refused))
        self._quote_times: dict[Offering, list[datetime]] = defaultdict(list)
        self._quotes: dict[Offering, list[PriceQuote]] = defaultdict(list)
        for q in self.history.quotes:  # already sorted by time
            self._quote_times[q.offering].append(q.time)
            self._quotes[q.offering].append(q)
        self._avail_times: dict[Offering, list[datetime]] = defaultdict(list)
        self._avail: dict[Offering, list[Availability]] = defaultdict(list)
        for a in self.history.availability:
            self._avail_times[a.offering].append(a.time)
            self._avail[a.offering].append(a)
        times = [q.time for q in self.history.quotes[:1] + self.history.quotes[-1:]]
        times += [a.time for a in self.history.availability[:1] + self.history.availability[-1:]]
        times += [lt.start for lt in self.history.lifetimes]
        times += [lt.start + timedelta(seconds=lt.seconds) for lt in self.history.lifetimes]
        if not times:
            raise TraceFormatError(",".join(map(str, self.paths)), None, "trace holds no records")
        self.start, self.end = min(times), max(times)
        self.replay: ReplayClock | None = None
        if speed is not None or clock is not None:
            self.replay = ReplayClock.starting_now(start or self.start, speed or 1.0,
                                                   clock or _time.monotonic)

    def now(self) -> datetime:
        """Trace time now: the replay clock's, or the end of the trace."""
        return self.replay.trace_time() if self.replay is not None else self.end

    def _wanted(self, off: Offering, regions: Sequence[str] | None, gpus: set[str] | None) -> bool:
        if regions and off.region not in regions:
            return False
        if gpus is not None:
            spec = self.history.gpus.get(off.instance_type)
            return spec is not None and canonical_gpu(spec.model) in gpus
        return True

    def fetch(self, *, regions: Sequence[str] | None = None, gpus: Sequence[str] | None = None,
              now: datetime | None = None) -> Snapshot:
        """The view at trace time ``now`` (default :meth:`now`); see the module docstring."""
        t = utc(now) if now is not None else self.now()
        want_gpus = {canonical_gpu(g) for g in gpus} if gpus else None
        quotes = []
        for off, times in self._quote_times.items():
            i = bisect.bisect_right(times, t)
            if i and self._wanted(off, regions, want_gpus):
                quotes.append(self._quotes[off][i - 1])
        avail = []
        for off, times in self._avail_times.items():
            i = bisect.bisect_right(times, t)
            if i and self._wanted(off, regions, want_gpus):
                avail.append(self._avail[off][i - 1])
        lifetimes = []
        for lt in self.history.lifetimes:
            if lt.start > t or not self._wanted(lt.offering, regions, want_gpus):
                continue
            seen = (t - lt.start).total_seconds()
            if seen >= lt.seconds:
                lifetimes.append(lt)
            else:
                lifetimes.append(Lifetime(lt.offering, lt.start, seen, False, lt.source))
        quotes, joined = _join_on_demand(quotes)
        notes = self.history.notes
        if joined:
            notes += (f"on-demand price joined from another quote of the same cloud, region and "
                      f"type for {joined} spot quote(s) whose file had none",)
        if t < self.start or t > self.end:
            notes += (f"trace time {t:%Y-%m-%dT%H:%M:%SZ} is outside the trace "
                      f"({self.start:%Y-%m-%d}..{self.end:%Y-%m-%d}); quotes are the last ones before it",)
        return Snapshot(quotes=tuple(sorted(quotes, key=lambda q: q.offering)),
                        availability=tuple(avail), lifetimes=tuple(lifetimes),
                        gpus=dict(self.history.gpus), rejected=self.history.rejected, notes=notes)
