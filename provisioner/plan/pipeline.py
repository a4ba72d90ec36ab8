"""THE decision: (market view, fleet held, progress, settings, clock) -> target fleet.

Design: one object, :class:`Planner`, is called by the daemon (``provision run``), by
``provision plan`` and by the simulator's spotring policy alike, so a simulated figure is a
figure of the code that runs. Its inputs are frozen views the caller builds from what it
knows (:class:`MarketView`: prices, speeds, hazards, known capacity; :class:`FleetView`:
instances held, offerings that failed us lately; :class:`Progress`: work done and due,
money spent); its settings and goal come from one function,
:func:`provisioner.plan.objective.planner_input`; its only memory is what it learned from
the decisions it made (the outages it saw, the launches it made).

Two modes, chosen by the progress it is given:

- **paced** (the work is known and a deadline set: the user's, hard, or the job's own pace,
  soft): Uniform Progress' rate that finishes on time, recomputed at every decision, so
  spot capacity missing now is made up later. A hard deadline keeps a safety margin as
  time and phases on-demand in as the slack falls (:func:`~provisioner.plan.pacing.
  deadline_floor`), but not for the minutes spot it holds may not grow (a zone avoided, a
  launch refused) while it is ahead of Uniform Progress' line (:func:`spot_wait`), and
  beside a full pool only to the floor until all spot was once lost at once; the
  job's own pace buys on-demand only to cover spot's gaps (every spot offering failed
  lately): on-demand runs the same instances as fast at 3x the price.
  The job's own pace is late, not dear: its line moves for the outages of spot seen, it
  catches up only on rings near the pace's cost per sample, on on-demand never dearer per
  sample than on-demand alone, and through an outage like those seen it holds the cheapest
  on-demand instance instead of nothing. Ahead of the line only the cheapest hardware per
  sample is bought, and some hours are banked with it; while it is out, a user's deadline
  waits on dearer spot as long as that could still finish by the line
  (:mod:`provisioner.plan.pacing`); among fleets that keep pace the one with most useful
  work per dollar wins. A target no fleet reaches gets the fastest fleet (for the job's own
  pace, on spot).
- **static** (open-ended work): one solve of the settings' objective (``max-throughput``
  under the budget, or ``min-cost`` for a target rate).

Offerings that failed lately (a revocation, a launch refused for capacity) may keep what
they hold but not grow; in static mode, if every spot offering failed, none is held back.
In both modes a fleet whose one zone may lose half the ring in a 3-minute window too often
is spread over zones when that costs little (:mod:`provisioner.plan.spread`), and a budget
stops the buying before it is spent (:mod:`provisioner.plan.budget`).

Rule for callers: build the views fresh for every decision; call :meth:`Planner.decide`
from one thread (the outage and launch logs are its state). Raises InfeasibleError only in static mode
(paced mode always returns a fleet, possibly empty).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from pricing.model import Offering
from pricing.risk import AgeShape
from provisioner.errors import InfeasibleError
from provisioner.plan.model import Candidate, Plan, Problem, gpu_of, gpu_spec
from provisioner.plan import budget, spread, virtual
from provisioner.plan.hysteresis import LaunchLog
from provisioner.plan.pacing import (HeldRate, OutageLog, ahead_offerings, bank_rate,
                                     catch_up_rate, due, fleet_rate, good_offerings,
                                     held_spot_finishes, net_rate, od_capacity, od_rate_kept, pace,
                                     per_sample_fleet, spot_time_target)
from provisioner.plan.solve import fleet_objective, solve

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
    catch_up_tolerance: float = 1.05
    bank_hours: float | None = None
    spot_share: float | None = None  # of the time spot is expected there; None: learned
    share_prior_hours: float = 48.0  # counted as spot time before the job when it is learned
    work_per_dollar_steps: tuple[float, ...] = (2.0, 4.0)
    max_launches: int = 4  # the churn limit per round and the round's period: how long a
    plan_s: float = 30.0  # fleet takes to launch (the ramp a deadline's slack must leave)
    max_removals: int = 2  # (and to take down: a budget's reserve)
    max_spot_price: float | None = None  # a spot offering priced above is not held
    max_half_ring_loss: float = 0.05  # most chance one 3-minute window takes half the ring
    spread_cost_tolerance: float = 1.05  # what spreading for it may cost per useful sample

    @property
    def ramp_h(self) -> float:
        """Hours from deciding on a fleet of ``max_size`` to its ring running: the launch
        rounds the churn limits take, one boot and one re-form."""
        b = self.bounds
        rounds = max(0, -(-b.max_size // max(1, self.max_launches)) - 1)
        return (rounds * self.plan_s + b.boot_s + b.reform_s) / 3600


def plan_settings(settings: "Settings") -> PlanSettings:
    """The :class:`PlanSettings` of validated settings (the only place that maps them)."""
    job, obj, fleet, opt, pace = (settings.job, settings.objective, settings.fleet,
                                  settings.optimizer, settings.pacing)
    caps = [c for c in (obj.budget_per_hour, job.max_hourly_cost) if c is not None]
    bounds = Problem(
        (), objective="max-throughput" if obj.kind == "deadline" else obj.kind,
        target_samples_per_s=obj.target_samples_per_s,
        budget_per_hour=min(caps) if caps else None,
        min_size=fleet.min_size, max_size=fleet.max_size, max_zone_share=fleet.max_zone_share,
        zone_allowance=fleet.zone_allowance,
        region_quota_gpus=MappingProxyType(dict(fleet.region_quota_gpus)),
        family_quota_gpus=MappingProxyType(dict(fleet.family_quota_gpus)),
        max_regions=fleet.max_regions, model_mb=job.model_mb, activation_mb=job.activation_mb,
        global_batch=job.global_batch,
        intra_zone_gbps=fleet.intra_zone_gbps, inter_zone_gbps=fleet.inter_zone_gbps,
        inter_region_gbps=fleet.inter_region_gbps, boot_s=fleet.boot_s, reform_s=fleet.reform_s,
        churn_horizon_hours=fleet.churn_horizon_hours)
    return PlanSettings(
        bounds=bounds, safety_hours=obj.safety_hours, markets=tuple(fleet.markets),
        regions=frozenset(settings.source.regions),
        gpus=frozenset(g.lower() for g in settings.source.gpus), step_s=fleet.step_s,
        default_hazard=opt.default_spot_hazard_per_hour, time_limit_s=opt.time_limit_s,
        ahead_tolerance=pace.ahead_tolerance, catch_up_tolerance=pace.catch_up_tolerance,
        bank_hours=pace.bank_hours, spot_share=pace.spot_share,
        share_prior_hours=pace.share_prior_hours,
        work_per_dollar_steps=tuple(pace.work_per_dollar_steps),
        max_launches=settings.daemon.max_launches_per_round, plan_s=settings.daemon.plan_s,
        max_removals=settings.daemon.max_removals_per_round, max_spot_price=job.max_spot_price,
        max_half_ring_loss=fleet.max_half_ring_loss,
        spread_cost_tolerance=fleet.spread_cost_tolerance)


@dataclass(frozen=True)
class MarketView:
    """The market as the caller knows it now."""

    prices: Mapping[Offering, float]  # USD/h of every offering priced now
    speeds: Mapping[str, float]  # instance type -> samples/s of one instance
    hazards: Mapping[Offering, float] = field(default_factory=dict)  # spot revocations/h (else the default)
    caps: Mapping[Offering, int] = field(default_factory=dict)  # instances available, where known
    gpus: Mapping[str, int] = field(default_factory=dict)  # GPUs per instance type (quotas), default 1
    notes: tuple[str, ...] = ()
    co_fraction: Mapping[Offering, float] = field(default_factory=dict)  # share of its pool
    # one interruption event takes (pricing.risk.co_fractions; else the cloud's default)
    age_shape: AgeShape = AgeShape()  # the hazard by an instance's age (pricing.risk.
    # age_shape; the default, flat, is the same hazard at every age)


@dataclass(frozen=True)
class FleetView:
    """What the job holds, and which offerings failed it lately."""

    held: Mapping[Offering, int] = field(default_factory=dict)  # instances held, booting or ready, not draining
    blocked: frozenset[Offering] = frozenset()  # failed lately: may keep, not grow
    failed: Mapping[Offering, float] = field(default_factory=dict)  # offering -> time of its last failure
    ages: Mapping[Offering, tuple[float, ...]] = field(default_factory=dict)  # seconds since
    # each held instance was launched (unknown: priced as a new one)
    blocked_until: Mapping[Offering, float] = field(default_factory=dict)  # when each offering
    # kept from growing may grow again (its zone's avoidance or its capacity refusal ends;
    # unknown: not waited for)


@dataclass(frozen=True)
class Progress:
    """How far the job is. ``work``/``deadline_s`` None: open-ended (static mode)."""

    start: float = 0.0
    work: float | None = None
    done: float = 0.0
    deadline_s: float | None = None  # from ``start``
    hard: bool = True  # the user's deadline (hard) or the job's own pace (soft)
    spent: float = 0.0  # USD spent since ``start``
    budget_usd: float | None = None  # the job's total budget (None: none)

    @property
    def paced(self) -> bool:
        return self.work is not None and self.deadline_s is not None


@dataclass(frozen=True)
class Goal:
    """What the job is after: ``work`` samples (None: open-ended) by ``deadline_s`` seconds
    from its start (None: no pace), ``hard`` when the deadline is the user's, and the total
    ``budget_usd`` (None: no budget)."""

    work: float | None = None
    deadline_s: float | None = None
    hard: bool = True
    budget_usd: float | None = None

    @property
    def paced(self) -> bool:
        return self.work is not None and self.deadline_s is not None

    def progress(self, start: float, done: float = 0.0, spent: float = 0.0) -> Progress:
        """The :class:`Progress` of one decision: the job started at ``start`` (Unix
        seconds), has done ``done`` samples and spent ``spent`` USD."""
        return Progress(start=start, work=self.work, done=done,
                        deadline_s=self.deadline_s if self.paced else None, hard=self.hard,
                        spent=spent, budget_usd=self.budget_usd)


@dataclass(frozen=True)
class PlannerInput:
    """Everything a :class:`~provisioner.plan.pipeline.Planner` is built from."""

    settings: PlanSettings
    goal: Goal


@dataclass(frozen=True)
class Decision:
    """The target fleet (zeros omitted) and the plan behind it (None: the fleet held is
    kept because nothing worth buying was found while ahead of the line)."""

    target: Mapping[Offering, int]
    plan: Plan | None = None
    notes: tuple[str, ...] = field(default=())
    wake_at: float | None = None  # decide again by then even if nothing happens: the
    # on-demand floor starts, the budget's reserve is reached (a caller that decides on a
    # long period must not miss it)
    stop: str | None = None  # the job must stop buying for good (its budget is spent)
    behind: bool = False  # behind the pace: its slack gone (the on-demand floor positive)
    budget_warning: str | None = None  # the budget left cannot pay for the work left
    # (:func:`provisioner.plan.budget.budget_note`; also among the plan's notes)

    def explain(self) -> str:
        if self.stop is not None:
            return self.stop
        if self.plan is None:
            return "\n".join(["ahead of the progress line: keeping the cheapest hardware held"]
                             + [f"note: {n}" for n in self.notes])
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
    priced_out = 0
    out: list[Candidate] = []
    for o in sorted(market.prices):
        if o.market not in s.markets or (s.regions and o.region not in s.regions):
            continue
        if (o.market == "spot" and s.max_spot_price is not None
                and market.prices[o] > s.max_spot_price):
            priced_out += 1
            continue
        if s.gpus:
            spec = gpu_spec(o.instance_type)
            if spec is None or spec.model.lower() not in s.gpus:
                continue
        speed = market.speeds.get(o.instance_type)
        if speed is None:
            unknown.add(o.instance_type)
            continue
        held = int(fleet.held.get(o, 0))
        hz = 0.0 if o.market == "on-demand" else market.hazards.get(o, s.default_hazard) * (
            age_factor(market.age_shape, fleet.ages.get(o, ()) if held else (),
                       b.churn_horizon_hours))
        c = Candidate(o, market.prices[o], speed, hz, loss_h,
                      market.gpus.get(o.instance_type, 1), market.caps.get(o), held)
        out.append(c.capped_at_held() if o.market == "spot" and o in blocked else c)
    if unknown:
        notes.append(f"skipped {len(unknown)} instance types with no throughput prior: "
                     + ", ".join(sorted(unknown)[:8]))
    if priced_out:
        notes.append(f"skipped {priced_out} spot offerings priced above job.max_spot_price "
                     f"(${s.max_spot_price:g}/h)")
    out, vw_notes = virtual.expand(  # GPUs too small: whole virtual workers
        out, b.model_mb, activation_mb=b.activation_mb, gbps=b.intra_zone_gbps)
    return out, notes + vw_notes


def spot_wait(fleet: FleetView, now: float, pr: Progress, *, slack_s: float) -> float | None:
    """Until when a user's deadline inside its margin may wait for spot it holds in an
    offering kept from growing for a while (None: it may not).

    Such an offering (its zone avoided after a revocation, or a launch there refused for
    capacity) still runs some of the job's spot, and may grow again when that ends
    (``fleet.blocked_until``). The job waits for it if that is within ``slack_s`` (the time
    it may lose before only the fastest on-demand ring finishes) and it is ahead of Uniform
    Progress' line (``work x elapsed / deadline``: Wu et al. buy on-demand only behind it)
    then, even if nothing were done meanwhile. The margin is spotring's, kept while spot
    can be had; this is the line that says the deadline is still safe."""
    if pr.work is None or pr.deadline_s is None:
        return None
    ends = [max(until, now) for o, until in fleet.blocked_until.items()
            if o.market == "spot" and fleet.held.get(o, 0) > 0 and until - now < slack_s
            and pr.done >= due(pr.work, max(until, now) - pr.start, pr.deadline_s)]
    return max(ends) if ends else None


def age_factor(shape: AgeShape, ages_s: tuple[float, ...], horizon_h: float) -> float:
    """An offering's hazard over the churn horizon relative to its average: for the held
    instances of ``ages_s`` (seconds since launch) the mean of theirs, else a new one's
    (age 0). Capacity that has lasted tends to last, so a running instance is priced as
    the safer bet it is and a swap for a new one pays for that (issue 28)."""
    if not ages_s:
        return shape.mean(0.0, horizon_h)
    return sum(shape.mean(a / 3600.0, horizon_h) for a in ages_s) / len(ages_s)


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


def keep(prob: Problem, pins: Mapping[Offering, int], max_regions: int) -> Problem:
    """``prob`` with at least ``pins[o]`` instances of each pinned offering
    (``Candidate.min_count``); a one-region ring is then sought in the pinned region only
    (a ring there cannot drop them for another region). A virtual-worker candidate keeps
    the whole VWs its pinned instances make."""
    cands = [replace(c, min_count=virtual.units(c, pins.get(c.offering, 0)))
             for c in prob.candidates]
    regions = {o.region for o in pins}
    if max_regions == 1 and len(regions) == 1:
        cands = [c for c in cands if c.offering.region in regions]
    return replace(prob, candidates=tuple(cands))


class Planner:
    """Turns the views of one moment into a target fleet (see the module docstring).
    Build it from :func:`provisioner.plan.objective.planner_input` (:meth:`of`)."""

    def __init__(self, settings: PlanSettings, goal: Goal | None = None) -> None:
    
        self.s = settings
        self.goal = goal if goal is not None else Goal()
        self.input = PlannerInput(settings, self.goal)
        self.outages = OutageLog()  # of the cheapest hardware per sample (banking)
        self.spot_outages = OutageLog()  # of all spot (the job's own pace waits for them)
        self.launches = LaunchLog()
        self.spot_held = HeldRate()  # what the spot held gave over the churn horizon

    @classmethod
    def of(cls, inp: PlannerInput) -> "Planner":
        """The planner of one job's :class:`~provisioner.plan.objective.PlannerInput`."""
        return cls(inp.settings, inp.goal)

    def decide(self, market: MarketView, fleet: FleetView, progress: Progress,
               now: float) -> Decision:
        """The target fleet now. Static mode raises InfeasibleError naming the constraint.
        With a budget, the decision stops buying (``Decision.stop``, an empty target) while
        enough is left to take the fleet held down (:mod:`provisioner.plan.budget`)."""
        note = None
        if progress.budget_usd is not None:
            if self._budget_stop(market.prices, fleet.held, progress, now)[0]:
                return self._stopped(progress)
            if progress.work is not None:
                cands, _ = candidates(market, FleetView(), self.s)
                note = budget.budget_note(cands, max(progress.work - progress.done, 0.0),
                                          progress.budget_usd - progress.spent)
        if not progress.paced:
            cands, notes = candidates(market, fleet, self.s, unblock_all=True)
            prob = problem_of(cands, self.s, notes + ([note] if note else []))
            plan = self._spread(prob, solve(prob, time_limit_s=self.s.time_limit_s), market)
            d = Decision(virtual.instances(plan), plan)
        else:
            d = self._paced(market, fleet, progress, now, note)
        if progress.budget_usd is None:
            return d
        # the fleet after this round costs more than the one held while launches are in it:
        # its burn sets the reserve and when to decide again
        after = {o: max(n, fleet.held.get(o, 0)) for o, n in d.target.items()}
        for o, n in fleet.held.items():
            after.setdefault(o, n)
        stop, wake = self._budget_stop(market.prices, after, progress, now)
        if stop:
            return self._stopped(progress)
        if wake is not None and (d.wake_at is None or wake < d.wake_at):
            d = replace(d, wake_at=wake)
        return replace(d, budget_warning=note) if note else d

    def _budget_stop(self, prices: Mapping[Offering, float], fleet: Mapping[Offering, int],
                     pr: Progress, now: float) -> tuple[bool, float | None]:
        """(stop now, when the reserve will be reached) for a ``fleet`` held at ``prices``."""
        assert pr.budget_usd is not None
        burn = sum(prices.get(o, 0.0) * n for o, n in fleet.items() if n > 0)
        left = pr.budget_usd - pr.spent
        reserve = budget.reserve_usd(burn, sum(n for n in fleet.values() if n > 0),
                                     self.s.plan_s, self.s.max_removals)
        # (within a second of the reserve is there: a wake-up cannot come sooner)
        return left <= reserve + burn / 3600.0, budget.stop_time(now, left, burn, reserve)

    @staticmethod
    def _stopped(pr: Progress) -> Decision:
        return Decision({}, stop=f"budget spent: ${pr.spent:,.2f} of job.budget_usd "
                        f"${pr.budget_usd:,.2f} (the rest pays for the fleet while it is "
                        f"taken down)")

    def _paced(self, market: MarketView, fleet: FleetView, pr: Progress,
               now: float, budget_warning: str | None = None) -> Decision:
        s, b = self.s, self.s.bounds
        assert pr.work is not None and pr.deadline_s is not None
        horizon_s = b.churn_horizon_hours * 3600
        self.launches.observe(now, fleet.held)
        young = {o: n for o, n in self.launches.young(now, fleet.held, horizon_s).items()
                 if o.market == "spot"}
        zones = Counter()
        for o, n in fleet.held.items():
            zones[(o.region, o.zone)] += n
        if len(zones) > 1:  # a ring spread over zones (replacements of revoked instances in
            # other zones) may gather into its main zone: keep only the main zone's young
            main = max(zones.values())
            young = {o: n for o, n in young.items() if zones[(o.region, o.zone)] == main}
        cands, notes = candidates(market, fleet, s)
        if budget_warning:
            notes.append(budget_warning)
        deadline_s = pr.deadline_s
        spot_fails = [t for o, t in fleet.failed.items() if o.market == "spot"]
        self.spot_outages.observe(now, any(n > 0 and o.market == "spot"
                                           for o, n in fleet.held.items()),
                                  max(spot_fails) if spot_fails else None)
        if not pr.hard:
            # The job's own pace is the nominal rate while spot can be had: its line moves
            # for the outages of all spot seen so far, and for the one going on up to the
            # typical length (longer, spot may not come back: spot that never came is met
            # with on-demand as before). Behind the moved line it catches up (below); the
            # line that did not move made every outage after a long one "late" (on the
            # 16-late trace, after its first 10.9 h) and bought on-demand for it.
            deadline_s += self.spot_outages.shift_s(now)
        nominal = pr.work / pr.deadline_s  # the pace's own rate (catch-up's reference)
        left = max(pr.work - pr.done, 0.0)
        hours = max((pr.start + deadline_s - now) / 3600, 1e-6)
        od_rate = od_capacity(cands, b.max_size, b.model_mb, b.global_batch, b.intra_zone_gbps)
        running = self.spot_outages.running_s(now)
        long_out = bool(pr.hard or self.spot_outages.lengths) and (
            running > 3600 * s.safety_hours) and (
            running > max(self.spot_outages.lengths, default=0.0))
        if long_out:
            # all spot out longer than the margin and than any outage seen: it may not come
            # back, and the rest on the fastest ring may cost more per sample than
            # on-demand alone (invariant 1); the slack counts on a ring that keeps it. The
            # job's own pace not in its first outage: spot that never came is met with
            # on-demand as before (16-late, out for its first 10.9 h: 1.031x -> 2.120x)
            od_rate = od_rate_kept(cands, od_rate, work=pr.work, left=left, spent=pr.spent,
                                   seconds=pr.deadline_s, max_size=b.max_size,
                                   model_mb=b.model_mb, global_batch=b.global_batch,
                                   gbps=b.intra_zone_gbps)
        spot_rate = fleet_rate([c for c in cands if c.offering.market == "spot"], b.model_mb,
                               b.global_batch, b.links)  # the spot held, as one ring
        run_s = 3600 * (hours - s.ramp_h)  # the time left to work, the ramp's taken out
        self.spot_held.observe(now, spot_rate, horizon_s)
        spot_usual = spot_rate  # what the spot held gives, for the net's rule below
        if spot_rate > 0 and od_rate * (run_s - horizon_s) > left:
            # a pool that lost part of the ring a moment ago has given its hour's mean, and
            # refills tend to come within the churn horizon: the mean counts while the
            # slack outlasts that horizon (a refill that does not come leaves the slack to
            # the net); none of it once all spot is lost (an outage, not a refill)
            spot_usual = max(spot_rate, self.spot_held.mean(now, horizon_s))
        target, floor, safety = pace(left, hours, deadline_s / 3600, od_rate, hard=pr.hard,
                                     safety_hours=s.safety_hours, overhead_h=s.ramp_h)
        behind = floor > 0.0
        released = False  # the on-demand held gives way (it would only keep the margin)
        wake = None
        if floor <= 0.0 and od_rate > 0 and left > 0:  # when the slack reaches the floor's
            # window if nothing is done meanwhile: the ramp must start then, not a tick later
            wake = pr.start + deadline_s - 3600 * (s.ramp_h + safety) - left / od_rate + 1.0
            wake = wake if wake > now else None
        cheap = good_offerings(cands, s.ahead_tolerance)
        fails = [fleet.failed[o] for o in cheap if o in fleet.failed]
        self.outages.observe(now, any(fleet.held.get(o, 0) > 0 for o in cheap),
                             max(fails) if fails else None)
        kept_floor = 0.0  # the floor the on-demand held keeps beside the spot tried
        if floor > 0.0 and any(c.offering.market == "spot" and c.room for c in cands):
            # Spot can be had (some offering has room: not failed lately, not capped at what
            # it holds, whether by the daemon's capacity cache or a known cap): it runs the same
            # instances as fast for a third of the price, so no on-demand floor, and no
            # swap of held spot for on-demand (which a floor made the cheapest fleet once
            # the work left fit one instance: 7 of 7 single-offering deadline runs swapped
            # their last spot instance 2 h before the deadline with plenty of spot). The
            # floor is Uniform Progress' net for when spot cannot be had.
            if long_out and spot_rate <= 0.0 and 0 < sum(
                    n for o, n in fleet.held.items() if o.market == "on-demand") < b.max_size:
                # Spot tried is not spot had, though. Behind, with no spot held and all spot
                # out longer than the margin and than any outage seen (it may not come
                # back), the on-demand held keeps Uniform Progress' floor beside the
                # launches until spot runs: not dropped for them, grown on its types where
                # the floor asks for more (a user's deadline; the job's own pace: the
                # on-demand held does not grow, below); what it does above the floor may
                # still give way. The floor dropped at each retry was bought again minutes
                # later in another shape: four types, 159.4 h at +432 h with all spot gone
                # from 67.0 h, 15 p3.2xlarge -> 9 -> 7 -> 9 at the 10-minute retries (and
                # 1 -> 16 K80 grown at them), 7 minutes past the deadline; on time and
                # 0.46x -> 0.43x on-demand alone now. The whole ring kept (kept and capped
                # at what it held) ran its margin's pace on 8 on-demand of three types to
                # the end where spot is gone from 45.7 h: 0.58x -> 0.71x on-demand alone
                # (0.54x now). None is bought for the spot tried (the floor kept with no
                # on-demand held put a V100 start at 1.19x the bound, 1.09x without), nor
                # kept where the on-demand fills the ring's size: no spot could be tried
                # beside it, and a swap at spot's return is the only way back to it (a
                # pool gone 10 minutes in every 20, 4 on-demand in a ring of at most 4 kept
                # to the end: 6% dearer).
                kept_floor = floor if pr.hard else min(floor, fleet_rate(
                    [c for c in cands if c.offering.market == "on-demand"], b.model_mb,
                    b.global_batch, b.links))
            floor = 0.0
        elif 0.0 < floor < target and (until := spot_wait(
                fleet, now, pr, slack_s=run_s - left / od_rate)) is not None:
            # Inside the margin, spot the job holds may not grow for a while (its zone avoided
            # after a revocation took some of the ring, or a launch refused for capacity); it
            # may grow again before the slack is gone, and until then the job stays ahead of
            # Uniform Progress' own line (the deadline's, not the margin's): the net waits
            # rather than buy on-demand for those minutes (Wu et al.'s rule: on-demand only
            # behind that line), and decides again when they end. On the p3 autoscaling group of
            # Parcae (NSDI'24: 10-32 instances, removals of 1-6 at a time) a 10 h deadline had
            # bought rings of 9 on-demand for 10-15 minutes after each revocation of its last
            # hours: $6-16 of on-demand, 1.14-1.31x the bound (docs/optimizer.md).
            floor = 0.0
            wake = until if wake is None else min(wake, until)  # decide again then
        elif 0.0 < floor < target and held_spot_finishes(
                spot_usual, left, run_s, od_rate):
            # Inside the margin with no spot to be had (every pool full), the spot the job
            # holds (at what its pools gave over the last hour, above) would alone finish the
            # work left by the deadline (less the ramp), and so would the fastest on-demand
            # ring (slack left): on-demand bought now only keeps spotring's margin, at its
            # price for sure, against a revocation that may not come, and if it comes the
            # net decides again with the slack it then has (Wu et al.'s net: on-demand when
            # the deadline, not a margin, needs it). On the T4 group SpotServe replayed
            # (ASPLOS'24: 5-17 instances, 9-12 most hours) 3.5e7 samples in 9 h, a pace the
            # pool keeps to the deadline but not to its margin, bought $6.6-7.9 of on-demand
            # beside a full pool: 1.50-1.58x the bound; with the spot held counted as this
            # minute's ring, 1.17x over 4 seeds, two of 11 just revoked buying 4-8 on-demand
            # the refill made useless; with the hour's, 1.06x (docs/optimizer.md).
            floor = 0.0
            released = True
        elif 0.0 < floor < target and pr.hard and (
                not self.spot_outages.seen() or left < od_rate * horizon_s):
            # Inside the margin with no spot to be had, and the job has never been left with
            # no spot at all (revocations took some of it, never all): on-demand only to the
            # floor, Uniform Progress' net, beside the spot held; the margin's pace above them
            # is left to spot the pools may give later. A sample bought on on-demand costs
            # about the same now or later: later is dearer only if the deadline then needs
            # more than the fastest on-demand ring, which the floor's slack rules out. On
            # SpotServe's T4 group 3.5e7 samples in 9 h bought the pace's whole gap on-demand
            # ($2.0-5.0 of it): 1.31x the bound over 4 seeds, now 1.20x. Once all spot was
            # lost at once, the job keeps the margin's pace: in the tests' group worlds (a
            # pool gone for 10 minutes every 20-30, or half a ring revoked every 20 minutes)
            # the floor alone swapped on-demand for spot at each return, 3 minutes of boot
            # each, and three deadlines were missed by 0.14-1.24 h. Not for the last of the
            # work, though, less than the fastest on-demand ring does in the churn horizon:
            # a swap or two there costs minutes of a slack that is hours. The margin's pace
            # on on-demand had bought the V100 probes' last 7% with $11.5 of it, the floor
            # $9.5 (first start: 1.196x -> 1.176x the bound; Parcae's group, 4e7 in 9 h,
            # seed 1: 1.105x -> 1.060x; the small group worlds still meet every deadline).
            target = max(min(target, spot_rate + floor), floor)
        if not pr.hard:
            # The job's own deadline is soft: late, not dear. Behind it the job catches up
            # only on rings whose cost per sample is within catch_up_tolerance of the ring
            # that keeps its pace, whether spot or, once its slack is gone and spot cannot be
            # had, on-demand (uncapped, 16 on-demand instances at ring efficiency 0.68 were
            # bought for the last hours of the V100 10-minute-probe trace: 1.77x the bound;
            # the floor had been dropped instead during outages like those seen before,
            # leaving the fleet empty while late). A user's deadline keeps its catch-up.
            cap = catch_up_rate(cands, nominal, s.catch_up_tolerance,
                                b.max_size, b.model_mb, b.global_batch, b.intra_zone_gbps)
            if cap is not None:
                target = min(target, cap)
                floor = min(floor, target)
            od_cap = catch_up_rate([c for c in cands if c.offering.market == "on-demand"],
                                   nominal, 1.0, b.max_size,
                                   b.model_mb, b.global_batch, b.intra_zone_gbps)
            if od_cap is not None and floor > 0.0:  # spot cannot be had: on-demand rings no
                # dearer per sample than the one that keeps the pace, so the job never pays
                # more per sample than on-demand alone (a 5-instance catch-up ring on spot
                # that never came cost 1.05x on-demand alone); it finishes later instead
                target = min(target, od_cap)
                floor = min(floor, target)
            if floor > 0.0 and self.outages.running_s(now) <= self.outages.typical_s():
                # ... but through an outage like those spot came back from, late and not
                # dear: the cheapest on-demand per sample, one instance (a ring's efficiency
                # only falls with its size), never an empty fleet; the catch-up above once
                # the outage outlasts those seen (spot that never came first of all). On the
                # 16-late trace on-demand at the catch-up rate after its 10.9 h outage cost
                # 1.19x the bound; the floor dropped altogether (before) left the fleet empty
                # while late.
                od = [c for c in cands if c.offering.market == "on-demand"
                      and c.price_per_hour > 0 and c.useful > 0]
                one = min(od, key=lambda c: c.price_per_hour / c.useful).useful if od else 0.0
                if one > 0:
                    target = floor = min(floor, one)
        pins = dict(young)
        if floor > 0.0 or any(n > 0 and o.market == "on-demand" for o, n in fleet.held.items()):
            # on-demand beside the spot held, never instead of it: the floor's, and with
            # slack the on-demand held (it stays a candidate and may grow toward a pace the
            # spot cannot reach: a pace 1% above what 8 spot instances deliver was met by 7
            # on-demand and 1 spot, the 6 spot held ended for on-demand at 4x their price)
            pins.update({o: n for o, n in fleet.held.items() if o.market == "spot" and n > 0})
        held = {o: n for o, n in fleet.held.items() if n > 0}
        if released:
            # ... and for the same reason the on-demand already held goes: it would fill the
            # margin's pace beside the spot that finishes alone (held with slack, it stays a
            # candidate and may grow toward a pace spot cannot reach, below). On SpotServe's
            # T4 group, 3.5e7 samples in 9 h, seed 2: of 7 on-demand bought when 2 of 11 spot
            # were revoked, 4 stayed 20-50 minutes after the pool refilled and more were
            # bought beside them: $3.67 of on-demand, 1.291x the bound; now all 7 end within
            # 2 minutes of the refill, $2.03 and 1.174x.
            cands = [c for c in cands if c.offering.market != "on-demand"]
            held = {o: n for o, n in held.items() if o.market != "on-demand"}
        held_rate = fleet_rate(cands, b.model_mb, b.global_batch, b.links)
        one_zone = len({(o.region, o.zone) for o, n in fleet.held.items() if n > 0}) == 1
        if (floor <= 0.0 and one_zone and
                0.0 < held_rate < target <= held_rate * s.ahead_tolerance):
            # The ring held, in one zone, keeps the pace within the tolerance: grow it where
            # it is, or not at all, rather than move it for a few percent (on the 4-node
            # preemption traces, zones capped at 4 a region apart, the ring moved every
            # hour for the 5th instance the pace asked for and no region had: 102 launches).
            # A ring spread over zones may still gather into one (the MILP prices the link).
            pins.update(held)
        if floor <= 0.0 and one_zone and held_rate > 0.0 and (
                not pr.hard or target <= held_rate * s.ahead_tolerance) and any(
                n > 0 and o in fleet.blocked for o, n in fleet.held.items()):
            # The ring lost instances to a revocation in its zone, now avoided for a while
            # (it may keep, not grow): keep the survivors and replace the lost ones there
            # once the zone may grow again, rather than rebuild the ring elsewhere (on the AWS
            # price events every revocation of 1 of 4 moved the whole ring, 4 launches instead
            # of 1: 72 launches for 19 revocations, 1.039x the bound; 35 and 1.016x now). With
            # slack (no on-demand floor) a few minutes at the survivors' rate cost only time:
            # always so for the job's own pace (late, not dear), for a user's deadline only
            # while the survivors keep its pace within the tolerance.
            return Decision(held, wake_at=wake, notes=tuple(notes), behind=behind)
        good: set[Offering] | None = None
        banking = False  # good is the cheap hardware for a bank or the spot time, not ahead
        all_cands = cands
        if floor <= 0.0:  # slack enough: wait for spot rather than pay on-demand
            cands = [c for c in cands if c.offering.market == "spot" or c.current] or cands
            if not pr.hard:  # the job's own pace, late not dear: the on-demand held keeps
                # and does not grow while spot may be had (beyond the ring that keeps the pace
                # its samples cost more than on-demand alone's; the floor's catch-up grows it
                # when spot cannot be had). On the 16-late trace with spot gone after 11.1 h,
                # each retry of spot grew the 4 on-demand to 5 and the floor cut it back:
                # a 10-minute instance every 20 minutes, 1.008x on-demand alone
                cands = [c.capped_at_held() if c.offering.market == "on-demand" else c
                         for c in cands]
            line_s = deadline_s - safety * 3600
            # (ahead of the line yet behind by the on-demand slack, in the last hours of a
            # user's deadline: not ahead, or a fleet whose cheapest was just revoked waited
            # empty while behind for its last samples)
            good = None if behind else ahead_offerings(
                cheap, fleet.held, pr.work, pr.done, now - pr.start, line_s, horizon_s)
            bank_s = (self.outages.bank_s(now) if s.bank_hours is None
                      else s.bank_hours * 3600)
            there = line_s > 0 and any(c.room and c.offering in cheap for c in cands)
            dearer_spot = any(c.offering.market == "spot" and c.offering not in cheap
                              for c in cands)
            # the net: dearer spot of another GPU (an outage takes a GPU's other sizes
            # along, p3.16xlarge with p3.2xlarge)
            gone = ({gpu_of(c.offering.instance_type) for c in cands if c.offering in cheap}
                    if dearer_spot else set())
            net = [c for c in cands if dearer_spot and c.offering.market == "spot"
                   and c.offering not in cheap and gpu_of(c.offering.instance_type) not in gone]
            if bank_s > 0 and there and dearer_spot:
                # the cheapest capacity per sample is there, and dearer spot is what an
                # outage of it would leave: bank bank_s of the pace with the cheap one
                # (within the churn horizon), to spend waiting through its outages
                bank = (due(pr.work, now - pr.start, line_s, bank_s) - pr.done) / horizon_s
                net_per = min((c.price_per_hour / 3600.0 / c.useful for c in net
                               if c.useful > 0 and c.price_per_hour > 0), default=None)
                most = None if net_per is None or bank <= target else bank_rate(
                    [c for c in cands if c.offering in cheap and c.room],
                    target, net_per, b.max_size, b.model_mb, b.global_batch,
                    b.intra_zone_gbps)
                if most is not None:
                    bank = min(bank, most)
                if bank > target:
                    target, good, banking = bank, cheap, True
            if pr.hard and there and not dearer_spot:  # on-demand is the fallback
                rate = spot_time_target(
                    [c for c in cands if c.offering in cheap], all_cands, self.outages, now,
                    left=left, line_left_s=pr.start + line_s - now,
                    elapsed_s=now - pr.start, prior_s=s.share_prior_hours * 3600,
                    max_size=b.max_size, model_mb=b.model_mb, global_batch=b.global_batch,
                    gbps=b.intra_zone_gbps, share=s.spot_share)
                if rate > target:
                    target, good, banking = rate, cheap, True
            if pr.hard and not behind and good is None and not there and dearer_spot:
                # the cheapest is out and dearer spot is the net: wait on it while it can
                # still do the work by the line
                rate = net_rate([c for c in net if c.room], target, s.catch_up_tolerance,
                                left=left, line_left_s=pr.start + line_s - now,
                                safety_hours=s.safety_hours, overhead_h=s.ramp_h,
                                max_size=b.max_size, model_mb=b.model_mb,
                                global_batch=b.global_batch, gbps=b.intra_zone_gbps)
                if rate is not None:
                    target = max(rate, 1e-9)
            if good is not None:
                # only the good hardware is bought: the rest pinned (launched lately, or
                # kept) stays at most what is held, never grown (on the four types of
                # aws-10-26-2022 a K80 kept beside a V100 launch that failed grew to 9 at
                # the V100's retries while the net was to be waited on). Nor is dearer spot
                # pinned here, young or part of the ring held: the solver keeps it or drops
                # it at its price, re-form included (pinned, K80 launched for an outage of
                # the V100 ran beside the V100's bank each time it came back: $20.6 of K80
                # from +24 h, $9.5 when the solver may drop it)
                cands = [c if c.offering in good else c.capped_at_held()
                         for c in cands if c.offering in good or c.offering in pins]
                pins = {o: n for o, n in pins.items() if o in good or o.market != "spot"}
        od_floor = max(floor, kept_floor)
        prob = problem_of(cands, s, notes, objective="deadline", target=target, floor=od_floor)
        plan = None
        ahead = good is not None and not banking
        if pins:
            plan = self._reachable(keep(prob, pins, b.max_regions), target, od_floor,
                                   hard=pr.hard, ahead=ahead)
        if plan is None:  # nothing kept, or keeping them makes every fleet infeasible
            plan = self._reachable(prob, target, od_floor, hard=pr.hard, ahead=ahead)
        if plan is None:
            kept = {o: n for o, n in fleet.held.items() if n > 0 and (
                o in pins or (good is not None and o in good))}
            return Decision(kept, wake_at=wake, notes=tuple(notes),
                            behind=behind)  # ahead, nothing good: keep
        base = prob if not pins else keep(prob, pins, b.max_regions)
        if floor <= 0.0:
            plan = self._per_dollar(base, plan, target)
        plan = self._spread(base, plan, market)
        return Decision(virtual.instances(plan), plan, wake_at=wake, behind=behind)

    def _spread(self, prob: Problem, plan: Plan, market: MarketView) -> Plan:
        """``plan``, or the same problem's fleet with every zone below half the ring when
        ``plan`` may lose half its ring in one 3-minute window more often than
        ``max_half_ring_loss`` and the spread fleet does not, at no more than
        ``spread_cost_tolerance`` times the cost per useful sample
        (:mod:`provisioner.plan.spread`); the risk kept is noted."""
        s = self.s
        if s.max_half_ring_loss >= 1.0 or plan.size == 0:
            return plan
        risk = spread.half_loss(plan, market.co_fraction)
        if risk <= s.max_half_ring_loss:
            return plan
        why = "no fleet spread below half a ring per zone meets the target"
        try:
            alt = solve(spread.spread_problem(prob), time_limit_s=s.time_limit_s)
            alt_risk = spread.half_loss(alt, market.co_fraction)
            ratio = spread.per_sample(alt) / spread.per_sample(plan)
            if alt.size > 0 and alt_risk <= s.max_half_ring_loss and (
                    ratio <= s.spread_cost_tolerance):
                return replace(alt, notes=alt.notes + (
                    f"spread over zones: a {risk:.1%} chance that one 3-minute window revokes "
                    f"half the ring in one zone is {alt_risk:.1%} spread, for {ratio:.3f}x the "
                    f"cost per useful sample",))
            why = (f"the spread fleet's chance is {alt_risk:.1%} at {ratio:.3f}x the cost per "
                   f"useful sample (fleet.spread_cost_tolerance {s.spread_cost_tolerance:g})")
        except InfeasibleError:
            pass
        return replace(plan, notes=plan.notes + (
            f"ring-loss risk: a {risk:.1%} chance that one 3-minute window revokes half the "
            f"ring (fleet.max_half_ring_loss {s.max_half_ring_loss:.0%}), kept: {why}",))

    def _reachable(self, prob: Problem, target: float, floor: float, *, hard: bool,
                   ahead: bool) -> Plan | None:
        """The plan for the target, else for a fraction of it (a user's deadline), else
        the fastest fleet (the job's own pace: late whatever it buys; fractions made the
        fleet 15 -> 9 -> 16 as the target grew on the 16-node trace). Ahead of the line, a
        fraction of it from the good offerings only (waiting is free). Not ahead and with
        no on-demand floor, a fraction is never less than the rate of the spot held among
        ``prob``'s candidates (as one ring; at most the target): behind a pace it cannot
        reach, the job keeps the most the pools gave it. On SpotServe's T4 group a launch
        of 4 that found room for 2 was planned again with the pool capped at the 9 then
        held; half the target was met by 7, and the 2 just launched ended at once (7 held
        of the 9 the group had, for the 10 minutes of each refusal; 4e7 samples in 9 h,
        4 seeds: 1.69x -> 1.50x the bound)."""
        held = fleet_rate([c for c in prob.candidates if c.offering.market == "spot"],
                          prob.model_mb, prob.global_batch, prob.links)
        scales: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25, 0.0) if hard else (1.0, 0.0)
        if ahead:
            scales = (1.0, 0.75, 0.5, 0.25)
        for scale in scales:
            if scale == 0.0:  # nothing reachable: the most throughput the caps allow (for
                # the job's own pace, late not dear: on spot, and the on-demand held)
                q = replace(prob, objective="max-throughput", target_samples_per_s=None,
                            ondemand_floor_samples_per_s=0.0)
                if not hard:
                    q = replace(q, candidates=tuple(c for c in q.candidates if c.current or
                                                    c.offering.market == "spot"))
            else:
                rate = target * scale
                if hard and not ahead and floor <= 0.0:
                    rate = max(rate, min(held, target))
                q = replace(prob, target_samples_per_s=rate,
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

        def per_sample(p: Plan) -> float:  # USD per useful sample, the change priced: a
            # fleet of the same size in a pool a little less revoked (more useful samples)
            # moved 5 running instances for 4.5% per sample that did not pay back the
            # boots and the re-form (16-late: revoked 10 minutes later)
            return fleet_objective(prob, p.counts) / max(p.throughput, 1e-9)

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
            if bigger.throughput > 0 and (per_sample(bigger) < 0.98 * per_sample(plan)):
                plan = bigger
        return plan
