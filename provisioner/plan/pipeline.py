"""THE decision: (market view, fleet held, progress, settings, clock) -> target fleet.

Design: one object, :class:`Planner`, is called by the daemon (``provision run``), by
``provision plan`` and by the simulator's spotring policy alike, so a simulated figure is a
figure of the code that runs. Its inputs are frozen views the caller builds from what it
knows (:class:`MarketView`: prices, speeds, hazards, known capacity; :class:`FleetView`:
instances held, offerings that failed us lately; :class:`Progress`: work done and due);
its only memory is the :class:`~provisioner.plan.pacing.OutageLog` it learns banking from.

Two modes, chosen by the progress it is given:

- **paced** (the work is known and a deadline set: the user's, hard, or the job's own pace,
  soft): Uniform Progress' rate that finishes on time, recomputed at every decision, so
  spot capacity missing now is made up later. A hard deadline keeps a safety margin as
  time and phases on-demand in as the slack falls (:func:`~provisioner.plan.pacing.
  deadline_floor`); the job's own pace buys on-demand only to cover spot's gaps (every
  spot offering failed lately): on-demand runs the same instances as fast at 3x the price.
  Ahead of the line only the cheapest hardware per sample is bought, and some hours are
  banked with it (:mod:`provisioner.plan.pacing`); among fleets that keep pace the one with
  most useful work per dollar wins. A target no fleet reaches gets the fastest fleet.
- **static** (open-ended work): one solve of the settings' objective (``max-throughput``
  under the budget, or ``min-cost`` for a target rate).

Offerings that failed lately (a revocation, a launch refused for capacity) may keep what
they hold but not grow; in static mode, if every spot offering failed, none is held back.

Rule for callers: build the views fresh for every decision; call :meth:`Planner.decide`
from one thread (the OutageLog is its state). Raises InfeasibleError only in static mode
(paced mode always returns a fleet, possibly empty).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from pricing.model import Offering
from provisioner.errors import InfeasibleError
from provisioner.plan.model import Candidate, Plan, Problem, gpu_spec
from provisioner.plan.pacing import (OutageLog, ahead_offerings, due, good_offerings, pace,
                                     per_sample_fleet)
from provisioner.plan import virtual
from provisioner.plan.solve import solve

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.config import Settings

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class PlanSettings:
    """Every knob of a decision (from :func:`plan_settings`). ``bounds`` is a Problem with
    no candidates: the objective and every constraint a decision's Problem gets."""

    bounds: Problem = Problem(())
    safety_hours: float = 2.0
    markets: tuple[str, ...] = ("spot", "on-demand")
    regions: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()  # GPU models to use (lowercase); empty: any
    step_s: float = 1.0
    default_hazard: float = 0.1
    time_limit_s: float = 1.0
    ahead_tolerance: float = 1.10
    bank_hours: float | None = None
    work_per_dollar_steps: tuple[float, ...] = (2.0, 4.0)


def plan_settings(settings: "Settings") -> PlanSettings:
    """The :class:`PlanSettings` of validated settings (the only place that maps them)."""
    job, obj, fleet, opt, pace = (settings.job, settings.objective, settings.fleet,
                                  settings.optimizer, settings.pacing)
    bounds = Problem(
        (), objective="max-throughput" if obj.kind == "deadline" else obj.kind,
        target_samples_per_s=obj.target_samples_per_s, budget_per_hour=obj.budget_per_hour,
        min_size=fleet.min_size, max_size=fleet.max_size, max_zone_share=fleet.max_zone_share,
        zone_allowance=fleet.zone_allowance,
        region_quota_gpus=MappingProxyType(dict(fleet.region_quota_gpus)),
        family_quota_gpus=MappingProxyType(dict(fleet.family_quota_gpus)),
        max_regions=fleet.max_regions, model_mb=job.model_mb, global_batch=job.global_batch,
        intra_zone_gbps=fleet.intra_zone_gbps, inter_zone_gbps=fleet.inter_zone_gbps,
        inter_region_gbps=fleet.inter_region_gbps, boot_s=fleet.boot_s, reform_s=fleet.reform_s,
        churn_horizon_hours=fleet.churn_horizon_hours)
    return PlanSettings(
        bounds=bounds, safety_hours=obj.safety_hours, markets=tuple(fleet.markets),
        regions=frozenset(settings.source.regions),
        gpus=frozenset(g.lower() for g in settings.source.gpus), step_s=fleet.step_s,
        default_hazard=opt.default_spot_hazard_per_hour, time_limit_s=opt.time_limit_s,
        ahead_tolerance=pace.ahead_tolerance, bank_hours=pace.bank_hours,
        work_per_dollar_steps=tuple(pace.work_per_dollar_steps))


@dataclass(frozen=True)
class MarketView:
    """The market as the caller knows it now."""

    prices: Mapping[Offering, float]  # USD/h of every offering priced now
    speeds: Mapping[str, float]  # instance type -> samples/s of one instance
    hazards: Mapping[Offering, float] = field(default_factory=dict)  # spot revocations/h (else the default)
    caps: Mapping[Offering, int] = field(default_factory=dict)  # instances available, where known
    gpus: Mapping[str, int] = field(default_factory=dict)  # GPUs per instance type (quotas), default 1
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetView:
    """What the job holds, and which offerings failed it lately."""

    held: Mapping[Offering, int] = field(default_factory=dict)  # instances held, booting or ready, not draining
    blocked: frozenset[Offering] = frozenset()  # failed lately: may keep, not grow
    failed: Mapping[Offering, float] = field(default_factory=dict)  # offering -> time of its last failure


@dataclass(frozen=True)
class Progress:
    """How far the job is. ``work``/``deadline_s`` None: open-ended (static mode)."""

    start: float = 0.0
    work: float | None = None
    done: float = 0.0
    deadline_s: float | None = None  # from ``start``
    hard: bool = True  # the user's deadline (hard) or the job's own pace (soft)

    @property
    def paced(self) -> bool:
        return self.work is not None and self.deadline_s is not None


@dataclass(frozen=True)
class Decision:
    """The target fleet (zeros omitted) and the plan behind it (None: the fleet held is
    kept because nothing worth buying was found while ahead of the line)."""

    target: Mapping[Offering, int]
    plan: Plan | None = None
    notes: tuple[str, ...] = field(default=())

    def explain(self) -> str:
        if self.plan is None:
            return "ahead of the progress line: keeping the cheapest hardware held"
        return self.plan.explain()


def candidates(market: MarketView, fleet: FleetView, s: PlanSettings, *,
               unblock_all: bool = False) -> tuple[list[Candidate], list[str]]:
    """The solver's candidates of one decision, and notes. Offerings in ``fleet.blocked``
    (spot only) are capped at what they hold; with ``unblock_all`` none is when every spot
    offering is blocked."""
    notes: list[str] = list(market.notes)
    blocked = fleet.blocked
    spot = [o for o in market.prices if o.market == "spot" and o.market in s.markets]
    if unblock_all and blocked and spot and all(o in blocked for o in spot):
        notes.append("every spot zone was to be avoided; avoiding none")
        blocked = frozenset()
    b = s.bounds
    n_ref = max(1, sum(fleet.held.values()), b.min_size)
    loss_h = (b.boot_s + (s.step_s + b.reform_s) * n_ref) / 3600.0
    unknown: set[str] = set()
    out: list[Candidate] = []
    for o in sorted(market.prices):
        if o.market not in s.markets or (s.regions and o.region not in s.regions):
            continue
        if s.gpus:
            spec = gpu_spec(o.instance_type)
            if spec is None or spec.model.lower() not in s.gpus:
                continue
        speed = market.speeds.get(o.instance_type)
        if speed is None:
            unknown.add(o.instance_type)
            continue
        hz = 0.0 if o.market == "on-demand" else market.hazards.get(o, s.default_hazard)
        held = int(fleet.held.get(o, 0))
        cap = market.caps.get(o)
        if o.market == "spot" and o in blocked:
            cap = held if cap is None else min(cap, held)
        out.append(Candidate(o, market.prices[o], speed, hz, loss_h,
                             market.gpus.get(o.instance_type, 1), cap, held))
    if unknown:
        notes.append(f"skipped {len(unknown)} instance types with no throughput prior: "
                     + ", ".join(sorted(unknown)[:8]))
    out, vw_notes = virtual.expand(out, b.model_mb)  # GPUs too small: whole virtual workers
    return out, notes + vw_notes


def problem_of(cands: list[Candidate], s: PlanSettings, notes: list[str], *,
               objective: str | None = None, target: float | None = None,
               floor: float = 0.0) -> Problem:
    """A :class:`Problem` over ``cands`` with every constraint of the settings; the
    settings' own objective unless ``objective`` (and its ``target``) is given."""
    if objective is None:
        return replace(s.bounds, candidates=tuple(cands), notes=tuple(notes))
    return replace(s.bounds, candidates=tuple(cands), objective=objective,
                   target_samples_per_s=target, ondemand_floor_samples_per_s=floor,
                   notes=tuple(notes))


class Planner:
    """Turns the views of one moment into a target fleet (see the module docstring)."""

    def __init__(self, settings: PlanSettings) -> None:
        self.s = settings
        self.outages = OutageLog()

    def decide(self, market: MarketView, fleet: FleetView, progress: Progress,
               now: float) -> Decision:
        """The target fleet now. Static mode raises InfeasibleError naming the constraint."""
        if not progress.paced:
            cands, notes = candidates(market, fleet, self.s, unblock_all=True)
            plan = solve(problem_of(cands, self.s, notes), time_limit_s=self.s.time_limit_s)
            return Decision(virtual.instances(plan), plan)
        return self._paced(market, fleet, progress, now)

    def _paced(self, market: MarketView, fleet: FleetView, pr: Progress,
               now: float) -> Decision:
        s = self.s
        assert pr.work is not None and pr.deadline_s is not None
        cands, notes = candidates(market, fleet, s)
        deadline_s = pr.deadline_s
        left = max(pr.work - pr.done, 0.0)
        hours = max((pr.start + deadline_s - now) / 3600, 1e-6)
        od_rate = max((c.useful for c in cands if c.offering.market == "on-demand"),
                      default=0.0) * s.bounds.max_size
        target, floor, safety = pace(left, hours, deadline_s / 3600, od_rate, hard=pr.hard,
                                     safety_hours=s.safety_hours)
        if not pr.hard and floor > 0.0 and any(
                c.offering.market == "spot" and c.max_count is None for c in cands):
            # The job's own pace can no longer be kept even by on-demand at max_size (the
            # soft floor is all or nothing at slack 0), but some spot offering has not
            # failed lately: spot runs the same instances as fast for a third of the price,
            # so on-demand would buy no time, only cost. On-demand covers spot's gaps only.
            floor = 0.0
        good: set[Offering] | None = None
        if floor <= 0.0:  # slack enough: wait for spot rather than pay on-demand
            cands = [c for c in cands if c.offering.market == "spot" or c.current] or cands
            line_s = deadline_s - safety * 3600
            cheap = good_offerings(cands, s.ahead_tolerance)
            horizon_s = s.bounds.churn_horizon_hours * 3600
            good = ahead_offerings(cheap, fleet.held, pr.work, pr.done, now - pr.start,
                                   line_s, horizon_s)
            fails = [fleet.failed[o] for o in cheap if o in fleet.failed]
            self.outages.observe(now, any(fleet.held.get(o, 0) > 0 for o in cheap),
                                 max(fails) if fails else None)
            bank_s = (self.outages.bank_s(now) if s.bank_hours is None
                      else s.bank_hours * 3600)
            if bank_s > 0 and line_s > 0 and any(
                    c.max_count is None and c.offering in cheap for c in cands) and any(
                    c.offering.market == "spot" and c.offering not in cheap for c in cands):
                # the cheapest capacity per sample is there, and dearer spot is what an
                # outage of it would leave: bank bank_s of the pace with the cheap one
                # (within the churn horizon), to spend waiting through its outages
                bank = (due(pr.work, now - pr.start, line_s, bank_s) - pr.done) / horizon_s
                if bank > target:
                    target, good = bank, cheap
            if good is not None:
                cands = [c for c in cands if c.offering in good]
        prob = problem_of(cands, s, notes, objective="deadline", target=target, floor=floor)
        plan = self._reachable(prob, target, floor, hard=pr.hard, ahead=good is not None)
        if plan is None:
            if good is not None:  # ahead, nothing reachable from the good offerings: keep
                return Decision({o: n for o, n in fleet.held.items() if o in good and n > 0})
            return Decision({})
        if floor <= 0.0:
            plan = self._per_dollar(prob, plan, target)
        return Decision(virtual.instances(plan), plan)

    def _reachable(self, prob: Problem, target: float, floor: float, *, hard: bool,
                   ahead: bool) -> Plan | None:
        """The plan for the target, else for a fraction of it (a user's deadline), else
        the fastest fleet (the job's own pace: late whatever it buys; fractions made the
        fleet 15 -> 9 -> 16 as the target grew on the 16-node trace). Ahead of the line, a
        fraction of it from the good offerings only (waiting is free)."""
        scales: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25, 0.0) if hard else (1.0, 0.0)
        if ahead:
            scales = (1.0, 0.75, 0.5, 0.25)
        for scale in scales:
            if scale == 0.0:  # nothing reachable: the most throughput the caps allow
                q = replace(prob, objective="max-throughput", target_samples_per_s=None,
                            ondemand_floor_samples_per_s=0.0)
            else:
                q = replace(prob, target_samples_per_s=target * scale,
                            ondemand_floor_samples_per_s=floor * scale)
            try:
                return solve(q, time_limit_s=self.s.time_limit_s)
            except InfeasibleError:
                continue
        return None

    def _per_dollar(self, prob: Problem, plan: Plan, target: float) -> Plan:
        """Most useful work per dollar: a bigger fleet is taken when it is cheaper per sample.
        The rates tried are multiples of the pace and the rate of the cheapest fleet per
        sample of one offering that keeps the pace (e.g. one 8-GPU instance whose samples
        cost a third of what the cheapest-per-hour small fleet's do), priced in that
        offering's region (the held fleet stays in the problem for the churn term)."""
        s = self.s
        tries = [(target * k, prob) for k in s.work_per_dollar_steps]
        b = s.bounds
        best_one = per_sample_fleet(prob.candidates, target, b.max_size, b.model_mb,
                                    b.global_batch, b.intra_zone_gbps)
        if best_one is not None:
            rate, region = best_one
            tries.append((rate, replace(prob, candidates=tuple(
                c for c in prob.candidates if c.offering.region == region or c.current))))
        for rate, base in sorted(tries, key=lambda rp: rp[0]):
            try:
                bigger = solve(replace(base, target_samples_per_s=rate),
                               time_limit_s=s.time_limit_s)
            except InfeasibleError:
                continue
            if bigger.throughput > 0 and (bigger.cost_per_hour / bigger.throughput
                                          < 0.98 * plan.cost_per_hour / max(plan.throughput,
                                                                            1e-9)):
                plan = bigger
        return plan
