"""Revocation hazard per offering: maximum likelihood from observations, then priors.

Design: a pure function of data, no I/O (Spot Advisor files are read by
:func:`pricing.sources.advisor.load_spot_advisor`). Revocations are
modelled as a Poisson process with a constant hazard ``h`` per hour for each offering (the
exponential lifetime model). Given lifetimes, some revoked (events) and some censored (still
alive when observation stopped), the likelihood is ``h^d * exp(-h * T)`` with ``d`` events and
``T`` the total exposure in hours, so the MLE is ``h = d / T``. Censored lifetimes add exposure
only. The exact 95% interval for a Poisson rate is
``[chi2(0.025, 2d) / 2T, chi2(0.975, 2d + 2) / 2T]`` (Garwood).

:func:`estimate` picks, for each offering, the first basis with data:

1. ``mle``: its own observations (same cloud, region, zone, instance type; an offering with
   zone ``"*"`` uses every zone of its region);
2. ``pooled``: the same cloud and instance type in any zone, then the same cloud and GPU model
   (pools are correlated by design: the same hardware in the same market);
3. ``spot-advisor``: the AWS Spot Advisor interruption band for the region and type
   (:func:`advisor_hazard` documents the conversion);
4. ``default``: :data:`DEFAULT_HAZARD_PER_HOUR` for the cloud, itself an MLE over real traces.

What the clouds say refines the priors (:func:`with_signals`): GCP ``capacityHistory``
preemption rates, AWS spot placement scores, AWS rebalance recommendations. How much of a
pool one interruption takes (:func:`co_fractions`) and the chance a ring loses half of
itself in one 3-minute window (:func:`half_ring_loss`) price correlated revocations.

On-demand offerings get hazard 0 (basis ``default``): they are not revoked.

Rule for callers: give ``availability`` only for offerings whose lifetimes you did not also
derive from it (the trace loader already turns availability runs into lifetimes); it is used
only for offerings with no lifetimes, so nothing is counted twice.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Iterable, Mapping

from pricing.catalog import gpu_for
from pricing.model import Availability, Lifetime, Offering, RiskEstimate, Signals

#: A basis is used only with at least this many revocations (one event gives an interval
#: spanning two orders of magnitude; below that the next basis is better informed).
MIN_EVENTS = 1

#: Per-cloud hazard (per hour) when nothing else is known. Each is an MLE over real traces in
#: ../shared/data, computed 2026-11-21 (tests/pricing/test_risk.py recomputes them):
#: - gcp 0.0104: all 152 GCP preemptible K80/P100/V100 lifetimes of Feb 2019
#:   (cake-lab/transient-deep-learning): 33 revocations in 3,181.1 exposure hours.
#: - aws 0.229: Can't-Be-Late 1-node and 4-node *preemption* traces of p3.2xlarge
#:   (skypilot-org/spot-traces, 2023): 802 revocations in 3,497.1 instance-hours.
#: - local 0.1: the embedded cloud's generator; a mean lifetime of 10 h.
DEFAULT_HAZARD_PER_HOUR = {"gcp": 0.0104, "aws": 0.229, "local": 0.1}

#: AWS Spot Advisor bands (fraction of instances interrupted in the last month): the
#: advisor's ranges are <5%, 5-10%, 10-15%, 15-20%, >20% (its "max" values 5, 11, 16, 22,
#: 100). We take each band's midpoint, and 30% for the open band ">20%" (the feed gives no
#: upper figure; 30% is a round value in the band, not a measured one: where real
#: observations exist they take precedence).
ADVISOR_BAND_FRACTION = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.30}
#: Caveat, measured on the shared data: p3.2xlarge is in band 4 in us-east-1 in both advisor
#: snapshots (2021, 2025), i.e. 0.0005/h by this conversion, while the Can't-Be-Late p3.2xlarge
#: preemption traces of 2023 give an MLE of 0.229/h: the advisor prior is optimistic by two to
#: three orders of magnitude for scarce GPU types, which is why any observation outranks it.
#: The advisor's window: one month, taken as 30 days.
ADVISOR_WINDOW_HOURS = 30 * 24.0


@dataclass(frozen=True)
class _Obs:
    samples: int = 0
    events: int = 0
    hours: float = 0.0

    def __add__(self, other: "_Obs") -> "_Obs":
        return _Obs(self.samples + other.samples, self.events + other.events, self.hours + other.hours)


def poisson_interval(events: int, exposure_hours: float, level: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) interval on a Poisson rate with ``events`` in ``exposure_hours``."""
    from scipy.stats import chi2  # lazy: scipy import costs ~0.3 s

    alpha = 1.0 - level
    low = 0.0 if events == 0 else chi2.ppf(alpha / 2, 2 * events) / (2 * exposure_hours)
    high = chi2.ppf(1 - alpha / 2, 2 * events + 2) / (2 * exposure_hours)
    return float(low), float(high)


def _hazard(obs: _Obs) -> tuple[float, int, int, float, float]:
    if obs.hours <= 0:
        raise ValueError("no exposure: lifetimes total 0 hours, so no hazard can be estimated")
    low, high = poisson_interval(obs.events, obs.hours)
    return obs.events / obs.hours, obs.samples, obs.events, low, high


def hazard_from_lifetimes(lifetimes: Iterable[Lifetime]) -> tuple[float, int, int, float, float]:
    """Exponential MLE of the revocation hazard: ``(hazard_per_hour, samples, events, low, high)``.

    ``hazard = events / exposure hours``; censored lifetimes count exposure only; ``low`` and
    ``high`` bound a 95% interval. Raises ``ValueError`` when the total exposure is zero.
    """
    obs = _Obs()
    for lt in lifetimes:
        obs = obs + _Obs(1, int(lt.revoked), lt.seconds / 3600.0)
    return _hazard(obs)


def observations_from_availability(records: Iterable[Availability]) -> dict[Offering, _Obs]:
    """Events = falls in the available count (1->0 for one node), exposure = count x hours.

    Records are taken per offering in time order; the value holds until the next record, so
    the last record of each offering adds no exposure (its end is unknown).
    """
    by_off: dict[Offering, list[Availability]] = defaultdict(list)
    for a in records:
        by_off[a.offering].append(a)
    out: dict[Offering, _Obs] = {}
    for off, recs in by_off.items():
        recs.sort(key=lambda a: a.time)
        obs = _Obs()
        for a, b in zip(recs, recs[1:]):
            hours = (b.time - a.time).total_seconds() / 3600.0
            obs = obs + _Obs(int(a.available > 0), max(0, a.available - b.available),
                             a.available * hours)
        out[off] = obs
    return out


def advisor_hazard(band: int) -> float:
    """Hazard per hour of an advisor band: ``-ln(1 - f) / 720`` with ``f`` the band's
    fraction per month (:data:`ADVISOR_BAND_FRACTION`): the constant hazard under which a
    fraction ``f`` of instances is interrupted within 30 days."""
    f = ADVISOR_BAND_FRACTION[band]
    return -math.log(1.0 - f) / ADVISOR_WINDOW_HOURS


def _estimate(off: Offering, obs: _Obs, basis: str) -> RiskEstimate:
    h, n, d, low, high = _hazard(obs)
    return RiskEstimate(off, h, basis, n, d, low, high)


def _bases(offerings: Iterable[Offering], lifetimes: Iterable[Lifetime],
           availability: Iterable[Availability] = (),
           advisor: Mapping[tuple[str, str], float] | None = None
           ) -> Iterable[tuple[Offering, str, _Obs | float]]:
    """(offering, basis, observations or a hazard) by the first basis with data."""
    own: dict[Offering, _Obs] = defaultdict(_Obs)
    for lt in lifetimes:
        own[lt.offering.with_market("spot")] += _Obs(1, int(lt.revoked), lt.seconds / 3600.0)
    for off, obs in observations_from_availability(availability).items():
        key = off.with_market("spot")
        if key not in own:
            own[key] = obs
    by_region_type: dict[tuple, _Obs] = defaultdict(_Obs)
    by_type: dict[tuple, _Obs] = defaultdict(_Obs)
    by_gpu: dict[tuple, _Obs] = defaultdict(_Obs)
    for off, obs in own.items():
        by_region_type[(off.cloud, off.region, off.instance_type)] += obs
        by_type[(off.cloud, off.instance_type)] += obs
        spec = gpu_for(off.instance_type)
        if spec is not None:
            by_gpu[(off.cloud, spec.model)] += obs
    for off in offerings:
        if off.market == "on-demand":
            yield off, "default", 0.0
            continue
        if off.zone == "*":
            mine = by_region_type.get((off.cloud, off.region, off.instance_type), _Obs())
        else:
            mine = own.get(off, _Obs())
        if mine.events >= MIN_EVENTS and mine.hours > 0:
            yield off, "mle", mine
            continue
        spec = gpu_for(off.instance_type)
        pooled = by_type.get((off.cloud, off.instance_type), _Obs())
        if not (pooled.events >= MIN_EVENTS and pooled.hours > 0) and spec is not None:
            pooled = by_gpu.get((off.cloud, spec.model), _Obs())
        if pooled.events >= MIN_EVENTS and pooled.hours > 0:
            yield off, "pooled", pooled
            continue
        if advisor and off.cloud == "aws" and (off.region, off.instance_type) in advisor:
            yield off, "spot-advisor", advisor[(off.region, off.instance_type)]
            continue
        yield off, "default", DEFAULT_HAZARD_PER_HOUR.get(off.cloud, 0.1)


def estimate(offerings: Iterable[Offering], lifetimes: Iterable[Lifetime],
             availability: Iterable[Availability] = (),
             advisor: Mapping[tuple[str, str], float] | None = None) -> dict[Offering, RiskEstimate]:
    """A :class:`RiskEstimate` for every offering, by the first basis with data (see the
    module docstring). Pure: inputs are not modified; the result has one entry per offering.
    """
    offerings = list(offerings)
    lifetimes = list(lifetimes)
    result: dict[Offering, RiskEstimate] = {}
    co = co_fractions(offerings, lifetimes)
    for off, basis, data in _bases(offerings, lifetimes, availability, advisor):
        if isinstance(data, _Obs):
            est = _estimate(off, data, basis)
        else:
            est = RiskEstimate(off, data, basis)
        result[off] = replace(est, co_fraction=co.get(off))
    return result


def hazard_rates(offerings: Iterable[Offering], lifetimes: Iterable[Lifetime]) -> dict[Offering, float]:
    """The hazard per hour :func:`estimate` gives each offering (same bases, same data),
    without the confidence intervals: cheap enough to recompute every simulated hour."""
    return {off: (data.events / data.hours if isinstance(data, _Obs) else data)
            for off, _basis, data in _bases(offerings, lifetimes)}


# --- the hazard by age: capacity that has lasted tends to last ---------------------------

#: Age bands (hours) of :class:`AgeShape`, log-spaced: the hazard is constant inside each
#: band and the last is open. Not fitted: wide enough that a week of traces fills each.
AGE_BANDS_H = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_AGE_EDGES_H = (0.0,) + AGE_BANDS_H + (math.inf,)  # each band's [start, end)


@dataclass(frozen=True)
class AgeShape:
    """The revocation hazard by an instance's age relative to its average (a proportional
    hazards model with a piecewise-constant baseline): ``relative[k]`` applies to ages in
    band ``k`` (:data:`AGE_BANDS_H`, the last open). All ones (the default) is the
    exponential model, the hazard the same at every age.

    Measured on the shared traces (``tests/pricing/test_risk.py``): the capacity runs of
    the Can't-Be-Late p3.2xlarge availability traces are revoked 2-5x more often in their
    first hour than on average and several times less after 4 h, so a running instance
    is a safer bet than a new one in the same pool, and a swap is priced so."""

    relative: tuple[float, ...] = (1.0,) * (len(AGE_BANDS_H) + 1)

    def mean(self, age_h: float, horizon_h: float) -> float:
        """The mean relative hazard over ages [``age_h``, ``age_h + horizon_h``]: times an
        offering's hazard, the revocations an hour expected over the horizon of an instance
        of that age."""
        if horizon_h <= 0:
            return self.at(age_h)
        lo, hi, total = max(0.0, age_h), max(0.0, age_h) + horizon_h, 0.0
        for k, r in enumerate(self.relative):
            a, b = max(lo, _AGE_EDGES_H[k]), min(hi, _AGE_EDGES_H[k + 1])
            if b > a:
                total += r * (b - a)
        return total / horizon_h

    def at(self, age_h: float) -> float:
        """The relative hazard at ``age_h``."""
        return self.relative[bisect.bisect_right(AGE_BANDS_H, age_h)]


def age_shape(lifetimes: Iterable[Lifetime]) -> AgeShape:
    """The :class:`AgeShape` of ``lifetimes`` (all spot pools together: the shape is
    shared, each offering keeps its own level). Each band's rate is revocations over the
    exposure at those ages, with one pseudo-event at the overall rate so a band with little
    exposure stays near 1; no revocation at all gives the flat shape."""
    events = [0] * (len(_AGE_EDGES_H) - 1)
    exposure = [0.0] * (len(_AGE_EDGES_H) - 1)
    for lt in lifetimes:
        if lt.offering.market != "spot":
            continue
        hours = lt.seconds / 3600.0
        for k, (a, b) in enumerate(zip(_AGE_EDGES_H, _AGE_EDGES_H[1:])):
            if hours > a:
                exposure[k] += min(hours, b) - a
        if lt.revoked:
            events[bisect.bisect_right(AGE_BANDS_H, hours)] += 1
    total_e, total_t = sum(events), sum(exposure)
    if total_e == 0 or total_t <= 0:
        return AgeShape()
    rate = total_e / total_t
    return AgeShape(tuple(((d + 1.0) / (t + 1.0 / rate)) / rate
                          for d, t in zip(events, exposure)))


# --- co-revocations: how much of a pool one event takes -------------------------------------

#: Revocations of one pool (cloud, region, zone, instance type) within this many seconds of
#: each other are one event: Spot-and-Scoot measured that over 92% of interruptions of one
#: type in one zone come within 3 minutes of each other. It is also the window of the
#: planner's ring-loss risk (:func:`half_ring_loss`).
CO_WINDOW_S = 180.0

#: Per-cloud share of a pool's instances one event revokes when the pool shows none of its
#: own, each an estimate over real traces in ../shared/data (tests/pricing/test_risk.py
#: recomputes them; events grouped within CO_WINDOW_S, revoked / alive just before):
#: - aws 0.54: the Can't-Be-Late 4-node p3.2xlarge preemption traces (2023), among the
#:   traces of the AWS default hazard the ones whose groups hold more than one instance:
#:   600 revoked of 1,118 alive (a 1-node probe takes its one instance: 1.0 by design);
#: - gcp 0.17: the 152 GCP preemptible lifetimes of 2019: 33 revoked of 197 alive (16 of
#:   the 33 revocations come within 3 minutes of another in the same zone and type);
#: - local 1.0: the embedded cloud's generator takes a zone's capacity at once.
DEFAULT_CO_FRACTION = {"aws": 0.54, "gcp": 0.17, "local": 1.0}


def _co_events(lts: list[Lifetime]) -> tuple[int, int]:
    """(revoked, alive just before) summed over the events of one pool's lifetimes."""
    ends = sorted(lt.start.timestamp() + lt.seconds for lt in lts if lt.revoked)
    spans = [(lt.start.timestamp(), lt.start.timestamp() + lt.seconds) for lt in lts]
    revoked = alive = 0
    i = 0
    while i < len(ends):
        j = i
        while j + 1 < len(ends) and ends[j + 1] - ends[i] <= CO_WINDOW_S:
            j += 1
        t = ends[i]
        k = j - i + 1
        n = sum(1 for a, b in spans if a < t <= b)
        revoked += k
        alive += max(n, k)
        i = j + 1
    return revoked, alive


def co_fractions(offerings: Iterable[Offering], lifetimes: Iterable[Lifetime]
                 ) -> dict[Offering, float]:
    """Per spot offering, the share of its pool's instances one revocation event takes:
    revoked / alive over the events of its own lifetimes (an event: revocations within
    :data:`CO_WINDOW_S`), else of the same cloud and type in any zone, else
    :data:`DEFAULT_CO_FRACTION`. On-demand offerings: 0."""
    by_off: dict[Offering, list[Lifetime]] = defaultdict(list)
    for lt in lifetimes:
        by_off[lt.offering.with_market("spot")].append(lt)
    own = {o: _co_events(lts) for o, lts in by_off.items()}
    by_type: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for o, (k, n) in own.items():
        by_type[(o.cloud, o.instance_type)][0] += k
        by_type[(o.cloud, o.instance_type)][1] += n
    out: dict[Offering, float] = {}
    for off in offerings:
        if off.market == "on-demand":
            out[off] = 0.0
            continue
        k, n = own.get(off.with_market("spot"), (0, 0))
        if k < MIN_EVENTS or n <= 0:
            k, n = by_type.get((off.cloud, off.instance_type), (0, 0))
        out[off] = k / n if k >= MIN_EVENTS and n > 0 else DEFAULT_CO_FRACTION.get(off.cloud, 1.0)
    return out


def _binom_tail(n: int, q: float, k: int) -> float:
    """P(Binomial(n, q) >= k)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(k, n + 1))


def half_ring_loss(pools: Mapping[Any, tuple[int, float, float]],
                   window_s: float = CO_WINDOW_S) -> float:
    """The chance that one ``window_s`` window takes at least half the ring.

    ``pools`` maps each pool the ring uses to (instances held there, revocation hazard per
    instance per hour, share of the pool one event takes). Events of a pool come at rate
    ``hazard / share`` (so each instance is revoked at its hazard) and each takes every
    instance of the pool with probability ``share``; the window loses half the ring through
    one pool's event, or two pools' events in the same window (three are far rarer).
    On-demand pools (hazard 0) never lose anything."""
    w = window_s / 3600.0
    live = [(n, h / q, q) for n, h, q in pools.values() if n > 0 and h > 0 and q > 0]
    total = sum(n for n, _, _ in pools.values() if n > 0)
    if total == 0 or not live:
        return 0.0
    need = math.ceil(total / 2)
    p = sum((1 - math.exp(-lam * w)) * _binom_tail(n, q, need) for n, lam, q in live)
    for a in range(len(live)):
        for b in range(a + 1, len(live)):
            na, la, qa = live[a]
            nb, lb, qb = live[b]
            both = (1 - math.exp(-la * w)) * (1 - math.exp(-lb * w))
            joint = sum(math.comb(na, i) * qa ** i * (1 - qa) ** (na - i) * _binom_tail(
                nb, qb, need - i) for i in range(0, na + 1) if need - i > 0)
            p += both * max(0.0, joint - _binom_tail(na, qa, need) - _binom_tail(nb, qb, need))
    return min(1.0, p)


# --- what the clouds say: placement scores, capacity history, rebalance recommendations -------

#: A GCP ``capacityHistory`` preemption rate ``f`` is the share of the spot VMs that stopped
#: in an interval which were preempted; the others ran until their user stopped them. With a
#: VM run this long when not preempted, the hazard that gives ``f`` is ``f / ((1 - f) D)``
#: (preemption and the user's stop competing). D is the 24 h GCP preemptible cap, the runs of
#: the 2019 lifetimes in ../shared/data: an assumption, so the zone's own observations
#: outrank it.
GCP_RUN_HOURS = 24.0

#: Bases a cloud signal may refine: the zone's own observations ("mle") are never replaced.
_PRIOR_BASES = ("pooled", "spot-advisor", "default")


def with_signals(risks: Mapping[Offering, RiskEstimate], signals: Signals, *,
                 now: datetime, horizon_h: float) -> dict[Offering, RiskEstimate]:
    """``risks`` refined by what the clouds say (pure; each change names its basis):

    - GCP ``capacityHistory``: a spot offering whose hazard is a prior takes the hazard its
      zone's (else region's) preemption rate implies (:data:`GCP_RUN_HOURS`), basis
      ``capacity-history``;
    - AWS spot placement scores: a prior hazard (one figure for the type in every zone) is
      shared out between the region's zones in inverse proportion to the type's scores
      there (the mean score kept: a zone scored 9 gets a third of what one scored 3 gets),
      ``+placement-score``;
    - an AWS rebalance recommendation within ``horizon_h`` hours: the offering is expected
      to be revoked within the planning horizon, so its hazard is at least ``1 /
      horizon_h``, ``+rebalance``.

    A zone with its own revocations keeps its estimate (observations outrank signals), except
    for a rebalance recommendation, which is news about now."""
    out = dict(risks)
    scores: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for (region, zone, itype), score in signals.placement.items():
        if 1 <= score <= 10:
            scores[(region, itype)][zone] = float(score)
    for off, r in risks.items():
        if off.market != "spot":
            continue
        est = r
        if off.cloud == "gcp" and r.basis in _PRIOR_BASES:
            f = signals.preemption_rate.get((off.region, off.zone, off.instance_type),
                                            signals.preemption_rate.get(
                                                (off.region, "*", off.instance_type)))
            if f is not None and 0.0 <= f <= 1.0:
                f = min(f, 0.999)
                est = replace(est, hazard_per_hour=f / ((1.0 - f) * GCP_RUN_HOURS),
                              basis="capacity-history", low=None, high=None)
        zone_scores = scores.get((off.region, off.instance_type), {})
        if off.cloud == "aws" and r.basis in _PRIOR_BASES and off.zone in zone_scores:
            mean = sum(zone_scores.values()) / len(zone_scores)
            est = replace(est, hazard_per_hour=est.hazard_per_hour * mean / zone_scores[off.zone],
                          basis=est.basis + "+placement-score", low=None, high=None)
        seen = signals.rebalance.get(off)
        if seen is not None and horizon_h > 0 and (
                0 <= (now - seen).total_seconds() <= horizon_h * 3600):
            est = replace(est, hazard_per_hour=max(est.hazard_per_hour, 1.0 / horizon_h),
                          basis=est.basis + "+rebalance")
        out[off] = est
    return out
