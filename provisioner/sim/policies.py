"""Provisioning policies replayed by the simulator: ours and honest baselines.

Design: a policy is a small object with a ``decide(view) -> Decision`` method; the engine
(:mod:`provisioner.sim.engine`) owns time, money, instances and progress, and calls it at
every decision tick, after every revocation and failed launch, and when the policy asked to
be woken. Policies see only what a real one would: current prices, what they hold, which
zones just failed them, the progress made; never future prices or availability (except
:func:`hindsight`, the offline lower bound, which lives in :mod:`provisioner.sim.engine`).

- ``spotring``: our optimiser with the deadline objective: the user's deadline, else its own
  (the work at the baselines' nominal rate less ``rate_tolerance``), paced uniformly: the
  rate that finishes on time is recomputed at every decision, so spot capacity missing now
  is made up later. A user's deadline is hard: on-demand once the slack falls below the
  safety margin (Uniform Progress' safety net). Its own is soft: on-demand only once spot
  alone can no longer make it (no margin), and then only while every spot zone has failed
  it lately (within ``avoid_s``): on-demand covers spot's gaps, it never replaces spot that
  can be had (same instances, same speed, a third of the price); a target no fleet reaches
  gets the fastest fleet. Among the fleets that keep pace it takes the
  one with the most useful work per dollar: multiples of the pace
  (``work_per_dollar_steps``) and the cheapest fleet per sample of a single offering (one
  big instance can beat many small ones 3x per sample while costing more per hour).
  Hot reconfiguration (a revocation costs the ring one step plus re-form time); hazards
  learned online from the revocations observed so far.
- ``on-demand``: N on-demand instances of the job's type, cheapest region.
- ``cheapest-first``: SkyPilot-like managed spot: N spot instances in the cheapest zone; after
  a preemption or failed launch, back off 60 s and relaunch in the next cheapest zone;
  restart from the last checkpoint.
- ``static-spot``: N spot instances in the zone cheapest at the start, forever; waits there.
- ``uniform-progress``: Can't-Be-Late (Wu et al., NSDI'24): spot while progress is ahead of
  the uniform line work x elapsed / deadline, on-demand when behind and spot is unavailable,
  and on-demand for the rest once the slack falls below the restart overhead.

Rule: ``decide`` must not keep references to ``view``; it returns target counts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Mapping

from pricing.model import Lifetime, Offering
from provisioner.errors import InfeasibleError
from provisioner.plan.build import deadline_floor
from provisioner.plan.model import Candidate, Problem, ring_efficiency
from provisioner.plan.solve import solve

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class View:
    """What a policy may see at one decision."""

    t: float
    start: float
    work: float
    done: float
    deadline_s: float | None
    prices: Mapping[Offering, float]  # current price of every offering
    held: Mapping[Offering, int]  # instances held (booting or ready)
    failed: Mapping[Offering, float]  # offering -> time of its last revocation/failed launch
    speed: Mapping[str, float]
    running: bool
    hazards: Mapping[Offering, float] = field(default_factory=dict)
    revoked: bool = False  # this decision follows a revocation or failed launch


@dataclass(frozen=True)
class Decision:
    target: Mapping[Offering, int]
    wake_at: float | None = None


@dataclass(frozen=True)
class Params:
    """Shared knobs: the job's instance type and size, the restart model, the ring."""

    itype: str
    size: int
    boot_s: float = 180.0
    restart_s: float = 300.0  # restart from a checkpoint (load state, warm up)
    checkpoint_s: float = 1800.0  # checkpoint interval (restart-based policies)
    backoff_s: float = 60.0
    avoid_s: float = 600.0  # a zone that failed us is avoided this long
    retry_s: float = 30.0  # spotring re-plans this soon after a launch found no capacity
    # (the daemon's plan period; a capacity error comes back within seconds)
    step_s: float = 1.0
    reform_s: float = 5.0
    model_mb: float = 100.0
    global_batch: int = 256
    max_zone_share: float = 0.5
    max_size: int = 16
    churn_horizon_hours: float = 1.0
    safety_hours: float = 2.0
    rate_tolerance: float = 0.0  # spotring (no deadline) paces to the nominal rate less this
    work_per_dollar_steps: tuple[float, ...] = (2.0, 4.0)  # also try these x the rate; keep the
    # plan with the lower cost per useful sample (the design's "useful work per dollar")
    ahead_tolerance: float = 1.10  # spotring ahead of its progress line buys only offerings
    # whose cost per sample is within this factor of the best one priced (held or not)
    bank_hours: float | None = None  # while the cheapest hardware per sample is free and
    # dearer spot is the alternative, spotring gets this far ahead of its line with it (within
    # the churn horizon), to wait through its outages. None: learned online from the outages
    # of that hardware seen so far (OutageLog.bank_s); a number fixes it (0: no banking)


def _cheapest(prices: Mapping[Offering, float], itype: str, market: str,
              exclude: set[Offering] = frozenset()) -> list[Offering]:
    offs = [o for o in prices if o.instance_type == itype and o.market == market
            and o not in exclude]
    return sorted(offs, key=lambda o: (prices[o], o))


class OnDemand:
    name, mode = "on-demand", "restart"

    def __init__(self, p: Params) -> None:
        self.p = p

    def decide(self, v: View) -> Decision:
        if v.held:
            return Decision(dict(v.held))
        best = _cheapest(v.prices, self.p.itype, "on-demand")
        if not best:
            raise InfeasibleError(f"on-demand: no on-demand price for {self.p.itype}")
        return Decision({best[0]: self.p.size})


class CheapestFirst:
    """SkyPilot-like: cheapest zone; on failure back off, then the next cheapest zone."""

    name, mode = "cheapest-first", "restart"

    def __init__(self, p: Params) -> None:
        self.p = p
        self.tried: list[Offering] = []
        self.retry_at: float | None = None

    def decide(self, v: View) -> Decision:
        if v.revoked:  # preempted or no capacity: tear down, back off, then the next zone
            self.tried += [o for o, when in v.failed.items() if when >= v.t and o not in self.tried]
            self.retry_at = v.t + self.p.backoff_s
            return Decision({}, self.retry_at)
        if v.held:
            return Decision(dict(v.held))
        if self.retry_at is not None and v.t < self.retry_at:
            return Decision({}, self.retry_at)
        order = _cheapest(v.prices, self.p.itype, "spot")
        if not order:
            return Decision({})
        fresh = [o for o in order if o not in self.tried]
        if not fresh:  # every zone tried: start over from the cheapest
            self.tried = []
            fresh = order
        return Decision({fresh[0]: self.p.size})


class StaticSpot:
    """A fixed spot fleet in the zone cheapest at the start; it waits there for capacity."""

    name, mode = "static-spot", "restart"

    def __init__(self, p: Params) -> None:
        self.p = p
        self.zone: Offering | None = None

    def decide(self, v: View) -> Decision:
        if self.zone is None:
            order = _cheapest(v.prices, self.p.itype, "spot")
            if not order:
                return Decision({})
            self.zone = order[0]
        if v.revoked:
            return Decision({}, v.t + self.p.backoff_s)
        return Decision({self.zone: self.p.size})


class UniformProgress:
    """Can't-Be-Late's Uniform Progress with its safety net (deadline runs)."""

    name, mode = "uniform-progress", "restart"

    def __init__(self, p: Params) -> None:
        self.p = p
        self.locked_od = False

    def decide(self, v: View) -> Decision:
        if v.deadline_s is None:
            raise InfeasibleError("uniform-progress needs --deadline")
        od = _cheapest(v.prices, self.p.itype, "on-demand")
        rate = self.p.size * v.speed[self.p.itype]
        left_s = v.work - v.done
        time_left = v.start + v.deadline_s - v.t
        overhead = self.p.boot_s + self.p.restart_s
        if od and (self.locked_od or time_left - left_s / rate < 2 * overhead):
            self.locked_od = True
            return Decision({od[0]: self.p.size})
        line = v.work * (v.t - v.start) / v.deadline_s
        on_spot = {o: n for o, n in v.held.items() if o.market == "spot"}
        if on_spot and not v.revoked:
            return Decision(dict(on_spot))
        recent = {o for o, when in v.failed.items() if v.t - when < self.p.avoid_s}
        spot = _cheapest(v.prices, self.p.itype, "spot", recent)
        on_od = {o: n for o, n in v.held.items() if o.market == "on-demand"}
        if v.done >= line:  # ahead: spot if we can, else wait (idle costs nothing)
            if spot:  # make before break: on-demand is kept until spot is held
                return Decision({spot[0]: self.p.size, **on_od})
            return Decision(dict(on_od))
        if on_od:
            return Decision(dict(on_od))  # behind and already on on-demand: stay
        if spot and not v.revoked:
            return Decision({spot[0]: self.p.size})
        return Decision({od[0]: self.p.size} if od else {})


@dataclass
class OutageLog:
    """The outages of the cheapest hardware per sample, as a policy sees them (pure).

    An outage starts at a failure of that hardware (a revocation or a launch that found no
    capacity) while none of it is held, and ends at the next decision that holds some again.
    Only what was observable by then is used: the online counterpart of a fixed knob.
    """

    since: float | None = None
    back: float = float("-inf")  # when the last outage ended: older failures are its own
    lengths: list[float] = field(default_factory=list)

    def observe(self, t: float, held: bool, last_failure: float | None) -> None:
        """One decision at ``t``: whether the hardware is held, and its newest failure."""
        if held:
            if self.since is not None:
                self.lengths.append(t - self.since)
                self.since, self.back = None, t
        elif self.since is None and last_failure is not None and last_failure > self.back:
            self.since = last_failure

    def bank_s(self, t: float) -> float:
        """How far ahead to bank: the length-biased mean outage, sum(d^2) / sum(d) over the
        outages seen (the one still running counted at its length so far): the expected
        length of the outage that a moment spent out of the hardware belongs to, which is
        what a bank spent waiting has to cover. 0 before any outage is seen."""
        ds = self.lengths + ([t - self.since] if self.since is not None else [])
        total = sum(ds)
        return sum(d * d for d in ds) / total if total > 0 else 0.0


class Spotring:
    """Our optimiser with hot reconfiguration."""

    name, mode = "spotring", "hot"

    def __init__(self, p: Params, default_hazard: float = 0.1) -> None:
        self.p = p
        self.default_hazard = default_hazard
        self.outages = OutageLog()

    def decide(self, v: View) -> Decision:
        p = self.p
        loss_h = (p.boot_s + (p.step_s + p.reform_s) * max(1, sum(v.held.values()))) / 3600
        cands = []
        for o, price in v.prices.items():
            s = v.speed.get(o.instance_type)
            if s is None:
                continue
            hz = 0.0 if o.market == "on-demand" else v.hazards.get(o, self.default_hazard)
            held = v.held.get(o, 0)
            recent = o.market == "spot" and v.t - v.failed.get(o, -1e18) < p.avoid_s
            cands.append(Candidate(o, price, s, hz, loss_h, 1, held if recent else None, held))
        nominal = p.size * v.speed[p.itype]
        nominal *= ring_efficiency(p.size, nominal, p.model_mb, p.global_batch, 10.0)
        # Without a deadline, the job's own pace sets one: the work at the nominal rate less
        # the tolerance. Progress is then kept uniformly (Can't-Be-Late's Uniform Progress):
        # the rate that finishes on time, recomputed at every decision, so spot capacity
        # missing now is made up later; on-demand is bought only as the safety net.
        deadline_s = v.deadline_s
        if deadline_s is None:
            deadline_s = v.work / (nominal * (1.0 - p.rate_tolerance))
        left = max(v.work - v.done, 0.0)
        hours = max((v.start + deadline_s - v.t) / 3600, 1e-6)
        od_rate = max((c.useful for c in cands if c.offering.market == "on-demand"),
                      default=0.0) * p.max_size
        # The user's deadline is hard: keep Uniform Progress' on-demand safety margin, as
        # time: the pace aims at the deadline less the margin, so a run on pace never eats
        # into it (pacing to the deadline itself made the margin buy on-demand in the last
        # hours of every run). The job's own pace is soft: no margin, on-demand only once
        # spot alone can no longer make it.
        safety = (0.0 if v.deadline_s is None
                  else min(p.safety_hours, 0.25 * deadline_s / 3600))  # short jobs: a quarter
        target = max(left / (max(hours - safety, 0.5 * hours) * 3600), 1e-9)
        floor = deadline_floor(target, left, hours, od_rate, safety)
        if v.deadline_s is None and floor > 0.0 and any(
                c.offering.market == "spot" and c.max_count is None for c in cands):
            # The job's own pace can no longer be kept even by on-demand at max_size (the
            # soft floor is all or nothing at slack 0), but some spot zone has not failed
            # us lately: spot runs the same instances as fast for a third of the price, so
            # on-demand would buy no time, only cost. On-demand covers spot's gaps only:
            # once every spot zone failed within avoid_s.
            floor = 0.0
        kind = "deadline"
        good: set | None = None
        if floor <= 0.0:  # slack enough: wait for spot rather than pay on-demand
            spot_only = tuple(c for c in cands if c.offering.market == "spot" or c.current)
            cands = [c for c in spot_only] or cands
            line_s = deadline_s - safety * 3600
            cheap = _good_offerings(cands, p.ahead_tolerance)
            good = _ahead_offerings(cheap, v, line_s, p.churn_horizon_hours * 3600)
            fails = [v.failed[o] for o in cheap if o in v.failed]
            self.outages.observe(v.t, any(v.held.get(o, 0) > 0 for o in cheap),
                                 max(fails) if fails else None)
            bank_s = (self.outages.bank_s(v.t) if p.bank_hours is None
                      else p.bank_hours * 3600)
            if bank_s > 0 and line_s > 0 and any(
                    c.max_count is None and c.offering in cheap for c in cands) and any(
                    c.offering.market == "spot" and c.offering not in cheap for c in cands):
                # the cheapest capacity per sample is there, and dearer spot is what an
                # outage of it would leave: bank bank_s of the pace with the cheap one
                # (within the churn horizon), to spend waiting through its outages
                bank = ((_due(v, line_s, bank_s) - v.done)
                        / (p.churn_horizon_hours * 3600))
                if bank > target:
                    target, good = bank, cheap
            if good is not None:
                cands = [c for c in cands if c.offering in good]
        prob = Problem(tuple(cands), objective=kind, target_samples_per_s=target,
                       ondemand_floor_samples_per_s=floor, max_size=p.max_size,
                       max_zone_share=p.max_zone_share, zone_allowance=1, max_regions=1,
                       model_mb=p.model_mb, global_batch=p.global_batch, boot_s=p.boot_s,
                       reform_s=p.reform_s, churn_horizon_hours=p.churn_horizon_hours)
        plan = None
        # Without a user's deadline, a target no fleet reaches (past its own deadline, or
        # every spot zone capped after failing) gets the fastest fleet, not a fraction of the
        # target (the job is late whatever it buys; the fractions made the fleet 15 -> 9 -> 16
        # as the target grew on the 16-node trace). A user's deadline keeps the fractions.
        scales = (1.0, 0.0) if v.deadline_s is None else (1.0, 0.75, 0.5, 0.25, 0.0)
        if good is not None:  # ahead: nothing reachable from the good offerings -> keep those
            scales = (1.0, 0.75, 0.5, 0.25)  # held, buy no worse ones (waiting is free)
        for scale in scales:
            try:
                if scale == 0.0:  # nothing reachable: the most throughput the caps allow
                    prob = replace(prob, objective="max-throughput", target_samples_per_s=None,
                                   ondemand_floor_samples_per_s=0.0)
                else:
                    prob = replace(prob, target_samples_per_s=target * scale,
                                   ondemand_floor_samples_per_s=floor * scale)
                plan = solve(prob, time_limit_s=1.0)
                break
            except InfeasibleError:
                continue
        if plan is None and good is not None:
            return Decision({o: n for o, n in v.held.items() if o in good})
        if plan is not None and floor <= 0.0:
            # most useful work per dollar: a bigger fleet is taken when it is cheaper per sample;
            # the rates tried are multiples of the pace and the rate of the cheapest fleet per
            # sample of one offering that keeps the pace (e.g. one 8-GPU instance whose
            # samples cost a third of what the cheapest-per-hour small fleet's do)
            tries = [(target * k, prob) for k in p.work_per_dollar_steps]
            best_one = _per_sample_fleet(prob.candidates, target, p)
            if best_one is not None:  # priced in that offering's region (the ring is in one
                # region anyway; the held fleet stays in the problem for the churn term)
                rate, region = best_one
                tries.append((rate, replace(prob, candidates=tuple(
                    c for c in prob.candidates if c.offering.region == region or c.current))))
            for rate, base in sorted(tries, key=lambda rp: rp[0]):
                try:
                    bigger = solve(replace(base, target_samples_per_s=rate), time_limit_s=1.0)
                except InfeasibleError:
                    continue
                if bigger.throughput > 0 and (bigger.cost_per_hour / bigger.throughput
                                              < 0.98 * plan.cost_per_hour / max(plan.throughput, 1e-9)):
                    plan = bigger
        return Decision(dict(plan.counts))


def _due(v: View, line_s: float, lead_s: float = 0.0) -> float:
    """Samples due ``lead_s`` from now on the progress line that reaches ``v.work`` at
    ``line_s`` after the start (Uniform Progress' line)."""
    return v.work * min(1.0, (max(v.t - v.start, 0.0) + lead_s) / line_s)


def _ahead_offerings(good: set, v: View, line_s: float, lead_s: float) -> set | None:
    """``good`` (the offerings worth buying while ahead of the progress line, from
    :func:`_good_offerings`) when ahead, else None (behind).

    Ahead: done >= work x elapsed / ``line_s`` (Uniform Progress' line to the deadline less
    the safety margin; for the job's own pace, to its own deadline). Then the work due now is
    done, and waiting for the cheapest capacity per sample costs nothing, so only offerings
    whose cost per sample is within the tolerance of the best priced one (held, free
    or out of capacity) are worth buying: on aws-10-26-2022 p2.xlarge ($0.94 per 1M samples)
    kept the pace while p3.2xlarge ($0.64) was out, and its boots and premium were a third of
    spotring's excess over hindsight. Behind the line, every offering may help catch up."""
    if not good or line_s <= 0:
        return None
    # hysteresis: a fleet holding worse offerings (bought while behind) lets them go only
    # once ``lead_s`` ahead of the line, else they would go and be booted again every tick
    lead = lead_s if any(n > 0 and o not in good for o, n in v.held.items()) else 0.0
    if v.done < _due(v, line_s, lead):
        return None
    return good


def _good_offerings(cands, tolerance: float) -> set:
    """Offerings whose cost per sample (at full speed) is within ``tolerance`` of the best
    priced one (held, free or out of capacity alike). Full speed, not the hazard-discounted
    one: this sorts out dearer hardware; the optimiser weighs each zone's revocations."""
    per = {c.offering: c.price_per_hour / c.samples_per_s for c in cands
           if c.samples_per_s > 0 and c.price_per_hour > 0}
    if not per:
        return set()
    best = min(per.values())
    return {o for o, x in per.items() if x <= tolerance * best}


def _per_sample_fleet(cands, target: float, p: Params) -> tuple[float, str] | None:
    """(rate, region) of the fleet of one offering with the lowest cost per useful sample
    that keeps ``target`` (its smallest such ring: ring efficiency only falls with size), or
    None when no single offering can. Pure; the optimiser then prices that rate with every
    constraint (zone share, churn, mixes)."""
    best: tuple[float, float, str] | None = None
    for c in cands:
        s = c.useful
        if s <= 0 or c.price_per_hour <= 0:
            continue
        most = p.max_size if c.max_count is None else min(p.max_size, c.max_count)
        for n in range(1, most + 1):
            rate = n * s * ring_efficiency(n, n * s, p.model_mb, p.global_batch, 10.0)
            if rate >= target:
                per_sample = n * c.price_per_hour / rate
                if best is None or per_sample < best[0]:
                    best = (per_sample, rate, c.offering.region)
                break
    return None if best is None else (best[1], best[2])


def online_hazards(lifetimes: tuple[Lifetime, ...], offerings, t: float,
                   default: float) -> dict[Offering, float]:
    """Hazards learned from the lifetimes observable by time ``t``: the exponential MLE
    (revocations / exposure hours, as :mod:`pricing.risk`), running lifetimes censored at
    ``t``; an offering with no revocation seen yet gets ``default``. Computed inline rather
    than through ``pricing.risk.estimate`` because the simulator calls it every hour of trace
    and the confidence intervals it also computes are not needed here."""
    events: dict[Offering, int] = {}
    hours: dict[Offering, float] = {}
    for lt in lifetimes:
        s = lt.start.timestamp()
        if s >= t:
            continue
        o = lt.offering
        end = s + lt.seconds
        hours[o] = hours.get(o, 0.0) + (min(end, t) - s) / 3600.0
        if end <= t and lt.revoked:
            events[o] = events.get(o, 0) + 1
    out = {}
    for o in offerings:
        d, h = events.get(o, 0), hours.get(o, 0.0)
        out[o] = d / h if d > 0 and h > 0 else default
    return out


POLICIES = {"spotring": Spotring, "on-demand": OnDemand, "cheapest-first": CheapestFirst,
            "static-spot": StaticSpot, "uniform-progress": UniformProgress}
