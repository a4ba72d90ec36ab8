"""The built-in market generator: prices and availability for the embedded local cloud.

Design: when ``provision run`` gets no ``--trace``, it still needs a market that moves. This
module generates one, seeded and reproducible, as an ordinary
:class:`~pricing.model.Snapshot` (quotes and availability records), so the daemon replays it
through the same :class:`pricing.sources.trace.TraceSource` as a real trace. The parameters
(all in :class:`GeneratorParams`, documented in docs/daemon.md) are:

- ``offerings``: instance type, zone, spot base price and on-demand price. The defaults are
  two AWS types with real prices: p3.2xlarge (V100; spot $0.918/h in us-east, 2021 spot
  snapshot in ../shared/data/aws_prices; on-demand $3.06/h) and p2.xlarge (K80; on-demand
  $0.90/h from the 2017 price list there; spot at the same 70% discount, $0.27/h), each in
  three zones of one local region.
- prices: a mean-reverting random walk in log space every ``price_tick_s`` (Ornstein-
  Uhlenbeck: ``x += reversion·(0 - x) + volatility·N(0,1)``, price = base·e^x), clipped to
  [``floor_frac``, ``cap_frac``] of on-demand.
- availability: each offering holds up to ``capacity`` instances; outages start as a Poisson
  process of ``outages_per_hour`` per offering, take away ``1..capacity`` instances and last
  an exponential time of mean ``outage_mean_s``.
- job-time outages (``job_outages``): revocations placed in the JOB'S OWN TIME, as fractions
  of its epochs, not at simulated hours: the Poisson outages above fall wherever the clock
  puts them, so a fast machine that finishes the job in half a simulated hour may see none.
  By default a notice at 20% of the job, a kill without notice at 45% and a notice at 70%.
  (The local run's clock is paced by the ring, :mod:`pricing.sources.pace`, so on a machine
  slower than the reference the Poisson outages too meet the job at the same samples; the
  job-time ones are exact on any machine, faster ones included.)
  They need a run whose length is known (``--until-epochs``); :func:`next_job_outage` says
  which one is due, and :mod:`provisioner.daemon.run.outages` carries them out on the fleet.

:func:`fill_prices` gives the same price process to offerings of a real trace that carry
availability but no prices (the Can't-Be-Late traces), and says so in the snapshot's notes.

Rule for callers: times are trace (simulated) times; pass ``start`` and ``horizon_s`` covering
the whole run (the view after the horizon keeps the last values).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Sequence

from pricing.model import Availability, Offering, PriceQuote, Snapshot
from pricing.series import Step

DEFAULT_START = datetime(2026, 1, 1, tzinfo=timezone.utc)
REGION = "local-1"


@dataclass(frozen=True)
class OfferingSpec:
    instance_type: str
    zone: str
    spot_base: float
    on_demand: float


def _default_offerings() -> tuple[OfferingSpec, ...]:
    out = []
    for z in ("a", "b", "c"):
        out.append(OfferingSpec("p3.2xlarge", f"{REGION}{z}", 0.918, 3.06))
        out.append(OfferingSpec("p2.xlarge", f"{REGION}{z}", 0.27, 0.90))
    return tuple(out)


@dataclass(frozen=True)
class JobOutage:
    """One revocation placed in the job's own time: at ``at`` (a fraction of the job's
    epochs, 0 < at < 1), with a notice (``notice``) or a kill without one."""

    at: float
    notice: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.at < 1.0:
            raise ValueError(f"JobOutage.at={self.at}: a fraction of the job, 0 < at < 1")


#: The built-in market's job-time outages: two notices and a kill, spread over the job so
#: each replacement can boot and join before the next one.
JOB_OUTAGES = (JobOutage(0.2), JobOutage(0.45, notice=False), JobOutage(0.7))


def next_job_outage(schedule: Sequence[JobOutage], progress: float,
                    fired: int) -> JobOutage | None:
    """The outage due at ``progress`` (the job's done fraction, 0..1) once ``fired`` of the
    ``schedule`` (taken in order of ``at``) were carried out; None while none is due.

    One at a time: an outage deferred (no instance could take it) stays due, and the next
    one waits behind it, so none is skipped and their order holds.
    """
    pending = sorted(schedule, key=lambda o: o.at)[fired:]
    if pending and progress >= pending[0].at:
        return pending[0]
    return None


@dataclass(frozen=True)
class GeneratorParams:
    """Parameters of the generated market (see the module docstring)."""

    seed: int = 7
    offerings: tuple[OfferingSpec, ...] = field(default_factory=_default_offerings)
    horizon_s: float = 48 * 3600.0
    price_tick_s: float = 300.0
    volatility: float = 0.08
    reversion: float = 0.1
    floor_frac: float = 0.2
    cap_frac: float = 0.95
    capacity: int = 2
    outages_per_hour: float = 0.3
    outage_mean_s: float = 1200.0
    job_outages: tuple[JobOutage, ...] = JOB_OUTAGES

    def __post_init__(self) -> None:
        if self.horizon_s <= 0 or self.price_tick_s <= 0 or self.capacity < 1:
            raise ValueError("GeneratorParams: horizon_s, price_tick_s > 0 and capacity >= 1")
        if not 0 < self.floor_frac <= self.cap_frac <= 1:
            raise ValueError("GeneratorParams: need 0 < floor_frac <= cap_frac <= 1")
        if self.outages_per_hour < 0 or self.outage_mean_s <= 0:
            raise ValueError("GeneratorParams: outages_per_hour >= 0, outage_mean_s > 0")


def offering_of(spec: OfferingSpec) -> Offering:
    return Offering("local", REGION, spec.zone, spec.instance_type, "spot")


def price_walk(rng: random.Random, base: float, on_demand: float, start: datetime,
               p: GeneratorParams, offering: Offering, source: str) -> list[PriceQuote]:
    """One offering's quotes, one per tick over the horizon (see the module docstring)."""
    quotes = []
    x = 0.0
    n = int(p.horizon_s // p.price_tick_s) + 1
    for k in range(n):
        if k:
            x += p.reversion * (0.0 - x) + p.volatility * rng.gauss(0.0, 1.0)
        price = min(max(base * math.exp(x), p.floor_frac * on_demand), p.cap_frac * on_demand)
        quotes.append(PriceQuote(offering, start + timedelta(seconds=k * p.price_tick_s),
                                 round(price, 5), on_demand, source))
    return quotes


def _outages(rng: random.Random, offering: Offering, start: datetime,
             p: GeneratorParams) -> list[Availability]:
    """Availability changes: full capacity, minus overlapping outages."""
    changes: list[tuple[float, int]] = []
    t = 0.0
    rate = p.outages_per_hour / 3600.0
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= p.horizon_s:
            break
        lost = rng.randint(1, p.capacity)
        dur = rng.expovariate(1.0 / p.outage_mean_s)
        changes.append((t, -lost))
        changes.append((t + dur, lost))
    changes.sort()
    level = p.capacity
    recs = [Availability(offering, start, level, p.capacity, "generator")]
    for dt, delta in changes:
        level += delta
        recs.append(Availability(offering, start + timedelta(seconds=dt),
                                 max(0, min(p.capacity, level)), p.capacity, "generator"))
    return recs


def generate(params: GeneratorParams = GeneratorParams(), start: datetime = DEFAULT_START
             ) -> Snapshot:
    """The generated market from ``start`` over ``params.horizon_s`` (pure, seeded)."""
    rng = random.Random(params.seed)
    quotes: list[PriceQuote] = []
    avail: list[Availability] = []
    for spec in params.offerings:
        off = offering_of(spec)
        quotes += price_walk(rng, spec.spot_base, spec.on_demand, start, params, off, "generator")
        avail += _outages(rng, off, start, params)
    from pricing.catalog import gpu_for

    gpus = {s.instance_type: g for s in params.offerings if (g := gpu_for(s.instance_type))}
    note = (f"generated market: seed {params.seed}, {len(params.offerings)} offerings, "
            f"{params.outages_per_hour}/h outages of mean {params.outage_mean_s:g} s")
    return Snapshot(quotes=tuple(sorted(quotes, key=lambda q: q.time)),
                    availability=tuple(sorted(avail, key=lambda a: a.time)), gpus=gpus,
                    notes=(note,))


#: Spot prices used for availability-only traces: instance type -> (spot base, on-demand).
FILL_PRICES = {"p3.2xlarge": (0.918, 3.06), "p3.16xlarge": (7.344, 24.48),
               "p2.xlarge": (0.27, 0.90), "p2.8xlarge": (2.16, 7.20),
               "p2.16xlarge": (4.32, 14.40)}


def fill_prices(snapshot: Snapshot, params: GeneratorParams = GeneratorParams()) -> Snapshot:
    """Add generated quotes for offerings with availability but no quotes.

    Only instance types in :data:`FILL_PRICES` are filled; others stay unpriced (and the
    optimiser will not use them). Returns ``snapshot`` unchanged when nothing needs filling.
    """
    priced = {q.offering for q in snapshot.quotes}
    needs = sorted({a.offering for a in snapshot.availability} - priced)
    if not needs:
        return snapshot
    start = min(a.time for a in snapshot.availability)
    end = max(a.time for a in snapshot.availability)
    p = replace(params, horizon_s=max(params.price_tick_s, (end - start).total_seconds()))
    rng = random.Random(params.seed)
    quotes = list(snapshot.quotes)
    filled: list[str] = []
    for off in needs:
        base = FILL_PRICES.get(off.instance_type)
        if base is None:
            continue
        quotes += price_walk(rng, base[0], base[1], start, p, off, "generator-fill")
        filled.append(off.key)
    if not filled:
        return snapshot
    note = (f"{len(filled)} offerings had availability but no prices; prices generated "
            f"(seed {params.seed}) from {', '.join(sorted({Offering.from_key(k).instance_type for k in filled}))} bases")
    return replace(snapshot, quotes=tuple(sorted(quotes, key=lambda q: q.time)),
                   notes=snapshot.notes + (note,))


class AvailabilityIndex:
    """Availability in force at a time, per offering (for the local driver's feed): one
    :class:`pricing.series.Step` per offering."""

    def __init__(self, records: Sequence[Availability]) -> None:
        points: dict[Offering, list[tuple[float, float]]] = {}
        for a in sorted(records, key=lambda a: a.time):
            points.setdefault(a.offering, []).append((a.time.timestamp(), float(a.available)))
        self._steps = {o: Step.of(pts) for o, pts in points.items()}

    def __call__(self, offering: Offering, now: datetime) -> int | None:
        """Instances available at ``now``; None when the trace says nothing about it."""
        step = self._steps.get(offering)
        return None if step is None else int(step.at(now.timestamp()))
