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
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from pricing.model import Offering
from provisioner.errors import InfeasibleError
from provisioner.plan.model import Problem, ring_rate
from provisioner.plan.pipeline import FleetView, MarketView, Planner, PlanSettings, Progress

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
    catch_up_tolerance: float = 1.05  # behind its own pace, spotring catches up only on
    # rings within this factor of the cost per sample of the ring that keeps the pace
    bank_hours: float | None = None  # while the cheapest hardware per sample is free and
    # dearer spot is the alternative, spotring gets this far ahead of its line with it (within
    # the churn horizon), to wait through its outages. None: learned online from the outages
    # of that hardware seen so far (OutageLog.bank_s); a number fixes it (0: no banking)
    default_hazard: float = 0.1
    time_limit_s: float = 1.0
    plan_s: float = 30.0  # the daemon's plan period: a round whose actions the churn limits
    # deferred goes on this soon (as the daemon's next round would)
    max_launches: int = 4  # the daemon's churn limits (daemon.max_launches_per_round, ...)
    max_removals: int = 2

    @classmethod
    def of(cls, plan: PlanSettings, **kw: Any) -> "Params":
        """Params whose spotring knobs are those of ``plan`` (the settings the daemon uses);
        ``kw`` gives the baselines' own (itype, size, restart_s, ...)."""
        mine = {g.name for g in fields(cls)}
        shared = {f.name: getattr(src, f.name) for src in (plan, plan.bounds)
                  for f in fields(src) if f.name in mine}
        return cls(**{**shared, **kw})

    def plan_settings(self) -> PlanSettings:
        """The :class:`PlanSettings` spotring decides with (a job's ring: one region, every
        market priced)."""
        def pick(cls: Any) -> dict[str, Any]:
            names = {f.name for f in fields(cls)}
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}

        bounds = Problem((), max_regions=1, zone_allowance=1, **pick(Problem))
        return PlanSettings(bounds=bounds, **pick(PlanSettings))


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


class Spotring:
    """Our policy: :class:`provisioner.plan.pipeline.Planner`, the decision the daemon runs,
    with hot reconfiguration. Without a user's deadline it paces to its own (soft): the work
    at the baselines' nominal rate less ``rate_tolerance``."""

    name, mode = "spotring", "hot"

    def __init__(self, p: Params) -> None:
        self.p = p
        self.planner = Planner(p.plan_settings())

    def decide(self, v: View) -> Decision:
        p = self.p
        deadline_s, hard = v.deadline_s, True
        if deadline_s is None:
            nominal = ring_rate(p.size, v.speed[p.itype], p.model_mb, p.global_batch, 10.0)
            deadline_s, hard = v.work / (nominal * (1.0 - p.rate_tolerance)), False
        market = MarketView(prices=v.prices, speeds=v.speed, hazards=v.hazards)
        blocked = frozenset(o for o, when in v.failed.items()
                            if o.market == "spot" and v.t - when < p.avoid_s)
        fleet = FleetView(held=v.held, blocked=blocked, failed=v.failed)
        progress = Progress(start=v.start, work=v.work, done=v.done, deadline_s=deadline_s,
                            hard=hard)
        d = self.planner.decide(market, fleet, progress, v.t)
        return Decision(dict(d.target), d.wake_at)


POLICIES = {"spotring": Spotring, "on-demand": OnDemand, "cheapest-first": CheapestFirst,
            "static-spot": StaticSpot, "uniform-progress": UniformProgress}
