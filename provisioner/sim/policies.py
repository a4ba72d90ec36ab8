"""Provisioning policies replayed by the simulator: ours and honest baselines.

Design: a policy is a small object with a ``decide(view) -> Decision`` method; the engine
(:mod:`provisioner.sim.engine`) owns time, money, instances and progress, and calls it at
every decision tick, after every revocation and failed launch, and when the policy asked to
be woken. Policies see only what a real one would: current prices, what they hold, which
zones just failed them, the progress made; never future prices or availability (except
:func:`hindsight`, the offline lower bound, which lives in :mod:`provisioner.sim.engine`).

- ``spotring``: our optimiser with the deadline objective: the user's deadline, else its own
  (the work at the baselines' nominal rate), paced uniformly: the
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

Rule: ``decide`` must not keep references to ``view``; it returns target counts. A policy is
made with :func:`make_policy` (spotring needs the job's planner input, the others only
``Params``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

from pricing.model import Offering
from pricing.risk import AgeShape
from provisioner.config import Settings
from provisioner.errors import InfeasibleError
from provisioner.plan.model import ring_rate
from provisioner.plan.objective import PlannerInput, planner_input, sim_objective
from provisioner.plan.pipeline import FleetView, MarketView, Planner, PlanSettings

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
    spent: float = 0.0  # USD spent so far
    co_fraction: Mapping[Offering, float] = field(default_factory=dict)  # share of a pool
    # one interruption event takes, learned as the hazards are
    age_shape: AgeShape = AgeShape()  # the hazard by age, learned as the hazards are
    ages: Mapping[Offering, tuple[float, ...]] = field(default_factory=dict)  # seconds
    # since each held instance was launched


@dataclass(frozen=True)
class Decision:
    target: Mapping[Offering, int]
    wake_at: float | None = None
    stop: str | None = None  # stop buying for good (a budget spent): the run ends once empty
    behind: bool = False  # the policy is behind its pace (spotring: its slack is gone)
    budget_warning: str | None = None  # the budget left cannot pay for the work left


@dataclass(frozen=True)
class Params:
    """The simulated job: the daemon's settings, whole, and the baselines' own knobs.

    Spotring decides with the planner input of ``settings``
    (:func:`provisioner.plan.objective.planner_input`, the daemon's own); the execution
    model (boot, re-form, the step a revocation loses, the ring's gradient, batch and links),
    the churn limits, the zone avoidance and the plan period, and the bound's size and zone
    share are read from the same settings, so every figure of a run is one of the config
    the daemon would run. ``itype`` and ``size`` are the baselines' fleet (and the job's
    own pace: the nominal ring of ``size`` x ``itype``); ``restart_s``, ``checkpoint_s`` and
    ``backoff_s`` model the restart-based baselines."""

    settings: Settings
    itype: str
    size: int
    restart_s: float = 300.0  # restart from a checkpoint (load state, warm up)
    checkpoint_s: float = 1800.0  # checkpoint interval (restart-based policies)
    backoff_s: float = 60.0

    @cached_property
    def plan(self) -> PlanSettings:
        """The planner settings of ``settings`` (without the objective: see :meth:`goal`)."""
        return planner_input(self.settings).settings

    # the execution model, read from the planner's own settings
    boot_s = property(lambda self: self.plan.bounds.boot_s)
    reform_s = property(lambda self: self.plan.bounds.reform_s)
    step_s = property(lambda self: self.plan.step_s)
    model_mb = property(lambda self: self.plan.bounds.model_mb)
    global_batch = property(lambda self: self.plan.bounds.global_batch)
    max_size = property(lambda self: self.plan.bounds.max_size)
    max_zone_share = property(lambda self: self.plan.bounds.max_zone_share)
    zone_allowance = property(lambda self: self.plan.bounds.zone_allowance)
    links = property(lambda self: self.plan.bounds.links)
    # the daemon's loop: zone avoidance, the plan period (a launch refused for capacity is
    # retried a plan period later, a round the churn limits deferred goes on then)
    avoid_s = property(lambda self: self.settings.daemon.zone_avoid_ttl_s)
    retry_s = property(lambda self: self.settings.daemon.plan_s)
    plan_s = property(lambda self: self.settings.daemon.plan_s)
    max_launches = property(lambda self: self.settings.daemon.max_launches_per_round)
    max_removals = property(lambda self: self.settings.daemon.max_removals_per_round)

    def nominal_rate(self, speed: Mapping[str, float]) -> float:
        """Samples/s of the baselines' ring (``size`` x ``itype`` in one zone): the job's own
        pace when the user gives no deadline."""
        return ring_rate(self.size, speed[self.itype], self.model_mb, self.global_batch,
                         self.links[0])

    def goal_input(self, *, work: float, deadline_h: float | None,
                   speed: Mapping[str, float]) -> PlannerInput:
        """Spotring's planner input for a run of ``work`` samples: the user's deadline, else
        the job's own pace (:func:`provisioner.plan.objective.sim_objective`)."""
        return planner_input(sim_objective(self.settings, work=work, deadline_h=deadline_h,
                                           pace_samples_per_s=self.nominal_rate(speed)))


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
    built from the daemon's own planner input (:meth:`Params.goal_input`), with hot
    reconfiguration. Without a user's deadline it paces to its own (soft): the work at the
    baselines' nominal rate."""

    name, mode = "spotring", "hot"

    def __init__(self, p: Params, inp: PlannerInput) -> None:
        self.p = p
        self.planner = Planner.of(inp)

    @classmethod
    def for_job(cls, p: Params, *, work: float, deadline_h: float | None,
                speed: Mapping[str, float]) -> "Spotring":
        return cls(p, p.goal_input(work=work, deadline_h=deadline_h, speed=speed))

    def decide(self, v: View) -> Decision:
        p = self.p
        market = MarketView(prices=v.prices, speeds=v.speed, hazards=v.hazards,
                            co_fraction=v.co_fraction, age_shape=v.age_shape)
        blocked = frozenset(o for o, when in v.failed.items()
                            if o.market == "spot" and v.t - when < p.avoid_s)
        fleet = FleetView(held=v.held, blocked=blocked, failed=v.failed, ages=v.ages,
                          blocked_until={o: v.failed[o] + p.avoid_s for o in blocked})
        progress = self.planner.goal.progress(v.start, v.done, spent=v.spent)
        d = self.planner.decide(market, fleet, progress, v.t)
        return Decision(dict(d.target), d.wake_at, d.stop, d.behind, d.budget_warning)


POLICIES = {"spotring": Spotring, "on-demand": OnDemand, "cheapest-first": CheapestFirst,
            "static-spot": StaticSpot, "uniform-progress": UniformProgress}


def make_policy(name: str, p: Params, *, work: float, deadline_h: float | None,
                speed: Mapping[str, float]):
    """The policy ``name`` for one run (spotring with the job's planner input)."""
    cls = POLICIES[name]
    if hasattr(cls, "for_job"):
        return cls.for_job(p, work=work, deadline_h=deadline_h, speed=speed)
    return cls(p)
