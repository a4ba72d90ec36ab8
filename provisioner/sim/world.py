"""The simulated world: price and availability step functions built from real traces.

Design: a :class:`World` is immutable after :func:`build_world` and answers three questions
fast (numpy, bisect): the price of an offering at a time, the integral of that price over an
interval (so cost = sum of instance-seconds x price at that time, exactly), and how many
instances an offering can hold at a time. Traces are parsed only by
:func:`pricing.sources.trace.load_trace`; this module combines what they hold:

- an offering with availability but no price takes the price series of the same instance
  type (same region first, else any region), shifted so it starts at the availability
  trace's start; after its end the last price holds. Each such combination is a note.
- a 1-node availability trace (``capacity == 1``) says whether the zone had spot capacity;
  a 1 is read as "up to ``max_size`` instances", a 0 as none. N-node traces cap at the count.
- on-demand prices come from the quotes (``on_demand_per_hour``), else from ``on_demand``
  overrides (instance type -> USD/h, e.g. a published list price), else the type has no
  on-demand offering (a note says so).
- revocations come from the same records as the hazards a policy learns
  (:mod:`provisioner.sim.revocations`): an availability series' falls are removals that hit
  held instances with the probability the group's size implies (:attr:`World.reclaims`),
  beside the capacity cap; with no availability trace, instances live an exponential
  lifetime at the hazard :func:`pricing.risk.hazard_rates` estimates from the traces'
  lifetimes (:attr:`World.hazard`), drawn with an injected seed, together: an interruption
  event of a (type, zone) pool takes the share :func:`pricing.risk.co_fractions` estimates
  (:attr:`World.co_fraction`) of the instances held there within minutes; the report says so.
- every availability series is known over its observed span only: past its end an
  offering has no capacity (its last value is never held), and spans that differ are noted.

Bad input is never silently used: non-positive or NaN prices and spot prices above
on-demand are dropped and listed in ``World.notes`` with the record's source (file:line).
Rule for callers: times are Unix seconds (floats) throughout the simulator.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Mapping, Sequence

import numpy as np

from pricing.model import Offering, PriceQuote, Snapshot
from pricing.risk import CO_WINDOW_S, co_fractions, hazard_rates
from pricing.sources.trace_io import MAX_PRICE_PER_HOUR
from pricing.series import Step
from provisioner.errors import UserError
from provisioner.plan.throughput import ThroughputModel
from provisioner.sim.revocations import Reclaims, reclaims_of

log = logging.getLogger(__name__)

UNLIMITED = 10 ** 6


def ts(dt: datetime) -> float:
    return dt.timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


@dataclass
class World:
    """Offerings with price and availability step functions over [start, end]."""

    start: float
    end: float
    price: dict[Offering, Step]
    avail: dict[Offering, Step | None]
    speed: dict[str, float]  # instance type -> samples/s of one instance
    hazard: dict[Offering, float] = field(default_factory=dict)  # drawn revocations/h
    lifetimes: tuple = ()
    notes: list[str] = field(default_factory=list)
    reclaims: dict[Offering, Reclaims] = field(default_factory=dict)  # removals of the series
    observed: dict[Offering, list[tuple[float, float]]] = field(default_factory=dict)  # spans
    co_fraction: dict[Offering, float] = field(default_factory=dict)  # share of a pool one
    # drawn revocation event takes (offerings without an availability series)

    @property
    def offerings(self) -> list[Offering]:
        return sorted(self.price)

    def cost(self, o: Offering, a: float, b: float) -> float:
        """USD for one instance of ``o`` held from ``a`` to ``b`` (prices are per hour)."""
        return self.price[o].between(a, b) / 3600.0

    def available(self, o: Offering, t: float) -> int:
        s = self.avail.get(o)
        return UNLIMITED if s is None else int(s.at(t))

    def spot_shares(self) -> dict[str, float]:
        """Per instance type whose spot offerings all have an availability series: the
        share of [start, end] some spot offering of it had capacity, what ``[pacing]
        spot_share`` asks of a market, read from its history. A type priced only (no
        series: the simulator assumes capacity and draws revocations) is not measured, so
        it is left out."""
        out: dict[str, float] = {}
        span = self.end - self.start
        if span <= 0:
            return out
        by_type: dict[str, list[Offering]] = defaultdict(list)
        for o in self.price:
            if o.market == "spot":
                by_type[o.instance_type].append(o)
        for itype, offs in sorted(by_type.items()):
            if any(self.avail.get(o) is None for o in offs):
                continue
            cuts = sorted({self.start, self.end} | {float(t) for o in offs
                                                    for t in self.avail[o].t
                                                    if self.start < t < self.end})
            up = sum(b - a for a, b in zip(cuts, cuts[1:])
                     if any(self.available(o, a) > 0 for o in offs))
            out[itype] = float(up / span)
        return out


def _plausible(q: PriceQuote, notes: list[str]) -> bool:
    p = q.price_per_hour
    if not (isinstance(p, float) or isinstance(p, int)) or not math.isfinite(p) or p <= 0:
        notes.append(f"{q.source or q.offering.key}: price {p!r} is not a positive number: dropped")
        return False
    if p > MAX_PRICE_PER_HOUR:
        notes.append(f"{q.source or q.offering.key}: price {p!r} above ${MAX_PRICE_PER_HOUR:g}/h "
                     "is not believable: dropped")
        return False
    od = q.on_demand_per_hour
    if q.offering.market == "spot" and od and p > od * 1.0001:
        notes.append(f"{q.source or q.offering.key}: spot {p:.4f} above on-demand {od:.4f}: dropped")
        return False
    return True


def build_world(snapshot: Snapshot, throughput: ThroughputModel, *, max_size: int,
                on_demand: Mapping[str, float] | None = None,
                types: Sequence[str] = (), regions: Sequence[str] = (),
                start: datetime | None = None, hours: float | None = None,
                seed: int = 0) -> World:
    """Combine a loaded trace into a :class:`World` (see the module docstring).

    ``types``/``regions`` restrict the offerings; ``start``/``hours`` the period (default:
    where prices and availability overlap). Raises UserError when nothing usable remains
    (no price for the available offerings, unknown instance types, empty period).
    """
    notes = list(snapshot.notes) + [f"{r.location}: {r.reason}" for r in snapshot.rejected]
    want_t, want_r = set(types), set(regions)

    def wanted(o: Offering) -> bool:
        return (not want_t or o.instance_type in want_t) and (not want_r or o.region in want_r)

    series: dict[Offering, list[tuple[float, float]]] = defaultdict(list)
    for q in snapshot.quotes:
        if not wanted(q.offering) or not _plausible(q, notes):
            continue
        series[q.offering].append((ts(q.time), float(q.price_per_hour)))
        if q.offering.market == "spot" and q.on_demand_per_hour:
            series[q.offering.with_market("on-demand")].append(
                (ts(q.time), float(q.on_demand_per_hour)))
    avail: dict[Offering, list[tuple[float, int]]] = defaultdict(list)
    caps: dict[Offering, int | None] = {}
    for a in snapshot.availability:
        if wanted(a.offering):
            avail[a.offering].append((ts(a.time), a.available))
            caps[a.offering] = a.capacity
    speed: dict[str, float] = {}
    unknown = set()
    types_seen = {o.instance_type for o in list(series) + list(avail)}
    for t in sorted(types_seen):
        try:
            speed[t] = throughput.samples_per_s(t)
        except KeyError:
            unknown.add(t)
    if unknown:
        notes.append(f"no throughput prior for {len(unknown)} instance types, left out: "
                     + ", ".join(sorted(unknown)[:10]))

    price: dict[Offering, Step] = {}
    if avail:
        # availability given: the world is the offerings it covers, priced from the series
        keep = [o for o in avail if o.instance_type in speed]
        if not keep:
            raise UserError("the availability traces cover no instance type with a throughput "
                            "prior (add job.throughput_priors)")
        av_start = min(v[0][0] for v in avail.values())
        for o in keep:
            pts = sorted(series.get(o, []))
            if not pts:
                donor = _donor(o, series)
                if donor is None:
                    src = next((sp.source for sp in snapshot.spans if sp.offering == o),
                               o.key)
                    raise UserError(
                        f"{src}: the availability of {o.instance_type} ({o.cloud}) has no spot "
                        f"price in any price trace: pass a price trace with it too (the AWS "
                        f"spot price events, describe-spot-price-history JSON, or a user CSV "
                        f"with {o.instance_type} rows)")
                src = sorted(series[donor])
                shift = av_start - src[0][0]
                pts = [(t + shift, p) for t, p in src]
                notes.append(f"availability of {o.key} combined with the spot prices of "
                             f"{donor.key} shifted by {shift / 86400:.1f} days to the "
                             f"availability trace's start; the last price holds after "
                             f"{iso(pts[-1][0])}")
            price[o] = Step(*zip(*_dedupe(pts)))
        dropped = len([o for o in series if o.market == "spot" and o not in price])
        if dropped:
            notes.append(f"{dropped} spot offerings with prices but no availability trace left "
                         f"out (the availability traces define the spot world)")
    else:
        for o, pts in series.items():
            if o.market == "spot" and o.instance_type in speed:
                price[o] = Step(*zip(*_dedupe(sorted(pts))))
    # on-demand offerings for the spot types present
    od_types = {o.instance_type for o in price}
    for o, pts in series.items():
        if o.market == "on-demand" and o.instance_type in od_types:
            price[o] = Step(*zip(*_dedupe(sorted(pts))))
    t_lo = min(s.t[0] for s in price.values())
    for itype, usd in sorted((on_demand or {}).items()):
        regions_of = {(o.cloud, o.region) for o in price if o.instance_type == itype}
        for cloud, region in sorted(regions_of):
            od = Offering(cloud, region, "*", itype, "on-demand")
            if not any(p.market == "on-demand" and p.cloud == cloud and p.region == region
                       and p.instance_type == itype for p in price):  # (a spot offering of
                # zone "*" is od's spot twin: it does not price it)
                price[od] = Step([t_lo], [float(usd)])
        notes.append(f"on-demand price of {itype} given as ${usd}/h (--on-demand)")
    for itype in sorted(od_types):
        if not any(o.market == "on-demand" and o.instance_type == itype for o in price):
            notes.append(f"no on-demand price for {itype}: pass --on-demand {itype}=USD")
    if not price:
        raise UserError("the traces hold no usable spot price for any instance type with a "
                        "throughput prior")
    spans = _spans(snapshot, {o: pts for o, pts in avail.items() if o in price})
    avail_steps: dict[Offering, Step | None] = {}
    reclaims: dict[Offering, Reclaims] = {}
    revoked_ends: dict[Offering, list[float]] = defaultdict(list)
    for lt in snapshot.lifetimes:
        if lt.revoked and lt.offering in avail:
            revoked_ends[lt.offering].append(ts(lt.start) + lt.seconds)
    for o in price:
        pts = avail.get(o)
        if not pts:
            avail_steps[o] = None
            continue
        scale = max_size if caps.get(o) == 1 else 1
        steps = _within(pts, spans[o])
        avail_steps[o] = Step([t for t, _ in steps], [n * scale for _, n in steps])
        inside = [e for e in revoked_ends.get(o, ()) if any(a <= e <= b for a, b in spans[o])]
        reclaims[o] = reclaims_of(inside, pts, scale)
    spot_starts = [s.t[0] for o, s in price.items() if o.market == "spot"]
    lo = max([min(spot_starts)] + [v.t[0] for v in avail_steps.values() if v is not None])
    ends = {o: spans[o][-1][1] for o in avail_steps if avail_steps[o] is not None}
    hi = max(ends.values()) if ends else max(s.t[-1] for s in price.values())
    if start is not None:
        lo = ts(start)
    if hours is not None:
        hi = lo + hours * 3600.0
    elif not ends:
        hi = max(hi, lo + 30 * 86400.0)  # price-only traces: prices hold after the last one
        notes.append(f"price-only traces: the period is 30 days from {iso(lo)} (the last prices "
                     "held); pass --hours to set it")
    if hi <= lo:
        raise UserError(f"empty simulation period ({iso(lo)} .. {iso(hi)} UTC): the traces "
                        f"overlap nowhere there; pass --start and --hours inside the traces")
    for o, end in sorted(ends.items()):
        if end < hi - 1.0 and end > lo:
            notes.append(f"the availability of {o.key} ends at {iso(end)} UTC, "
                         f"{(hi - end) / 3600:.1f} h before the period's end: no capacity after "
                         "it (a trace's last value is never held)")
    hazard: dict[Offering, float] = {}
    co: dict[Offering, float] = {}
    if not avail:
        spot = [o for o in price if o.market == "spot"]
        hazard = hazard_rates(spot, snapshot.lifetimes)
        co = co_fractions(spot, snapshot.lifetimes)
        basis = "lifetimes in the traces" if snapshot.lifetimes else "the default hazard"
        shares = ", ".join(f"{v:.2f}" for v in sorted(set(co.values())))
        notes.append(f"no availability trace: spot revocations drawn at random (seed {seed}) "
                     f"with hazards from {basis}, together: each interruption event of a "
                     f"(type, zone) pool takes a share ({shares}) of the instances held there "
                     f"within {CO_WINDOW_S / 60:g} minutes")
    else:
        removals = sum(len(r.times) for r in reclaims.values())
        notes.append(f"revocations: {removals} removals in the availability traces, each hitting "
                     "a held instance with the probability its group's size implies, and the "
                     "count as a capacity cap")
    return World(lo, hi, price, avail_steps, speed, hazard, tuple(snapshot.lifetimes), notes,
                 reclaims, dict(spans), co)


def _spans(snapshot: Snapshot, avail: Mapping[Offering, list[tuple[float, int]]]
           ) -> dict[Offering, list[tuple[float, float]]]:
    """Where each availability series was observed: the loader's spans, else (records built
    by hand) from its first record to its last record or censored lifetime. Raises
    UserError for a series with a single time."""
    out: dict[Offering, list[tuple[float, float]]] = defaultdict(list)
    for sp in snapshot.spans:
        if sp.offering in avail:
            if sp.end <= sp.start:
                raise UserError(f"{sp.source}: the availability of {sp.offering.key} has a single "
                                f"time ({iso(ts(sp.start))} UTC): a trace needs at least two, its "
                                "start and its end (add a row at the end of the period observed)")
            out[sp.offering].append((ts(sp.start), ts(sp.end)))
    for o, pts in avail.items():
        if o in out:
            out[o].sort()
            continue
        ends = [ts(lt.start) + lt.seconds for lt in snapshot.lifetimes if lt.offering == o]
        end = max([pts[-1][0]] + ends)
        if end <= pts[0][0]:
            raise UserError(f"the availability of {o.key} has a single time ({iso(end)} UTC): a "
                            "trace needs at least two, its start and its end")
        out[o] = [(pts[0][0], end)]
    return out


def _within(pts: list[tuple[float, int]], spans: list[tuple[float, float]]
            ) -> list[tuple[float, int]]:
    """The records of a series with a 0 at the end of each span not followed by another
    (no capacity where nothing was observed)."""
    out: list[tuple[float, int]] = []
    for k, (a, b) in enumerate(spans):
        out += [(t, n) for t, n in pts if a <= t < b]
        if k + 1 == len(spans) or spans[k + 1][0] > b:
            out.append((b, 0))
    return _dedupe(out) if out else [(pts[0][0], 0)]


def _dedupe(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for t, v in pts:
        if out and out[-1][0] == t:
            out[-1] = (t, v)
        elif not out or out[-1][1] != v:
            out.append((t, v))
    return out


def _donor(o: Offering, series: Mapping[Offering, list]) -> Offering | None:
    same_type = sorted(d for d in series if d.market == "spot" and d.instance_type == o.instance_type)
    same_region = [d for d in same_type if d.region == o.region]
    pool = same_region or same_type
    if not pool:
        return None
    # the most commonly quoted price level of the region: the donor with the lowest median
    return min(pool, key=lambda d: (float(np.median([p for _, p in series[d]])), d))
