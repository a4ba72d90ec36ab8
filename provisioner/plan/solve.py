"""The fleet optimiser: offerings, prices, risk and throughput in; a target fleet out.

Design: a pure function over frozen data (SkyPilot's ``optimizer.py`` writes its ILP out the
same way, but here nothing is printed or mutated). :func:`build_problem` turns settings,
quotes and risk estimates into a :class:`Problem`; :func:`solve` returns a :class:`Plan` that
explains itself. A solve is one ``scipy.optimize.milp`` call (HiGHS) per region tried, each
with a time limit (the MILP machinery is in :mod:`provisioner.plan.milp`);
if it yields no integer solution in time, the LP relaxation is rounded and repaired, so a
decision always comes back. An impossible configuration raises
:class:`~provisioner.errors.InfeasibleError` naming the constraint that cannot be met.

The MILP. For each offering o (cloud, region, zone, type, market) that survives pruning:

    x_o in Z, 0 <= x_o <= ub_o        instances to hold (ub_o: availability, max_size; an
                                      avoided zone may keep what it has but not grow)
    c_o   price, USD/h                s_o   samples/s of one instance (ThroughputModel)
    h_o   revocation hazard, 1/h      g_o   GPUs of one instance
    L_o   hours of work lost per revocation
          = (boot_s + (step_s + reform_s) * n_ref) / 3600
          (the replacement boots while the ring runs on; the whole ring, about n_ref
          workers, loses the unfinished step and the re-form)
    u_o   = s_o * max(0, 1 - h_o * L_o)                useful samples/s of one instance

Ring scaling: one step all-reduces the gradient (M bits) over the ring: t_comm(N) =
2(N-1)/N * M / bw, bw the slowest link (inside a zone, across zones or across regions).
The global batch B is constant and split so all workers finish together, so with S =
sum u_o x_o the ring delivers  R = B / (B/S + t_comm) = S / (1 + S * t_comm / B).
R is increasing in S, so "R >= T" is the *linear* constraint S >= T / (1 - T t_comm / B)
(impossible when T t_comm >= B: the ring's communication caps it). t_comm depends on N;
we solve with the fewest instances that could reach T as the guess for N and re-solve
with a larger guess until the fleet found is no bigger than the guess (then the term used
bounds the real one); the last resort, N = max_size, is always valid. A re-solve is skipped
when the fleet found already meets the next guess's (stricter) row: optimal under the
looser row, it is optimal under that one too, so the pass would return it again. The link is guessed
from the zone cap and max_regions and checked on the answer the same way.

Objectives (all minimise):
    min-cost, deadline:  sum (c_o + churn$_o) x_o + churn terms        s.t. S >= T'
    max-throughput:      sum (-u_o + churnS_o) x_o + eps * c_o x_o     (budget if set)
    deadline: T = work left / time left (Uniform Progress: the rate that finishes exactly
    on time, recomputed at every decision); as the slack (time left minus the time the
    largest on-demand fleet would need) falls below safety_hours, an on-demand floor
    sum_{on-demand} u_o x_o >= T * (1 - slack / safety_hours) phases on-demand in.

Constraints:
    budget               sum c_o x_o <= budget_per_hour
    size                 min_size <= sum x_o <= max_size
    quotas               sum_{o in region r} g_o x_o <= Q_r;  same per instance family
    zone share           sum_{spot o in zone z} x_o <= share * sum x_o + allowance
    regions              sum_{o in r} x_o <= max_size * y_r,  sum y_r <= max_regions (y binary,
                         only when the offerings span more regions than allowed)
    churn                for offerings held now (x0_o > 0): a_o >= x_o - x0_o, d_o >= x0_o - x_o;
                         each added instance costs its boot time, each change one re-form of
                         the ring; the cost is spread over churn_horizon_hours, so a change is
                         made only when it pays back within that horizon.

Pruning: inside a group that every constraint treats alike (region, zone, family, market,
GPUs), an offering is dropped when another costs no more, yields no less useful
throughput, is no riskier and is no scarcer; offerings with no useful throughput or
priced above the whole budget are dropped too. Held offerings are never pruned.

Tightening (same integer fleets, a tighter LP, so fewer region MILPs): in the target and
on-demand floor rows u_o is replaced by min(u_o, T') (one instance that alone meets the
row meets it either way), and HiGHS gets x_o <= floor(budget / c_o), floor(Q / g_o).

Rule for callers: never build a Problem from unchecked quotes: pass them through
``pricing.sanity.check`` first.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Collection, Mapping, Sequence

import numpy as np

from pricing.model import Offering, PriceQuote, RiskEstimate, utc
from provisioner.errors import InfeasibleError
from provisioner.plan.milp import (_block_lp_bounds, _build, _binding, _current,  # noqa: F401
                                        _link, _Model, _prune, _repair, _row_ok, _run,
                                        _solve_model, family_of)
from provisioner.plan.throughput import ThroughputModel

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.config import Settings

__all__ = ["Candidate", "Problem", "Plan", "ThroughputModel", "solve", "build_problem",
           "family_of", "ring_efficiency"]

log = logging.getLogger(__name__)

KINDS = ("max-throughput", "min-cost", "deadline")


@dataclass(frozen=True)
class Candidate:
    """One offering as the solver sees it (see the module docstring for the symbols)."""

    offering: Offering
    price_per_hour: float
    samples_per_s: float
    hazard_per_hour: float = 0.0
    loss_hours: float = 0.0
    gpus: int = 1
    max_count: int | None = None
    current: int = 0

    def __post_init__(self) -> None:
        # computed once: the solver reads it a few times per candidate per pass (not a
        # field, so equality, hashing and replace() are those of the fields alone)
        object.__setattr__(self, "_useful", self.samples_per_s * max(
            0.0, 1.0 - self.hazard_per_hour * self.loss_hours))

    @property
    def useful(self) -> float:
        """Useful samples/s of one instance: raw minus the expected loss to revocations."""
        return self._useful  # type: ignore[attr-defined]

    @property
    def zone_key(self) -> str:
        o = self.offering
        return f"{o.region}/{o.zone}" if o.zone != "*" else o.region

    @property
    def family(self) -> str:
        return family_of(self.offering.instance_type)


@dataclass(frozen=True)
class Problem:
    """Everything one solve needs. Build it with :func:`build_problem` or by hand (tests)."""

    candidates: tuple[Candidate, ...]
    objective: str = "max-throughput"
    target_samples_per_s: float | None = None
    budget_per_hour: float | None = None
    ondemand_floor_samples_per_s: float = 0.0
    min_size: int = 0
    max_size: int = 8
    max_zone_share: float = 1.0
    zone_allowance: int = 1
    region_quota_gpus: Mapping[str, int] = field(default_factory=dict)
    family_quota_gpus: Mapping[str, int] = field(default_factory=dict)
    max_regions: int = 1000
    model_mb: float = 0.0
    global_batch: int = 256
    intra_zone_gbps: float = 10.0
    inter_zone_gbps: float = 5.0
    inter_region_gbps: float = 1.0
    boot_s: float = 0.0
    reform_s: float = 0.0
    churn_horizon_hours: float = 1.0
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.objective not in KINDS:
            raise ValueError(f"Problem.objective={self.objective!r}: one of {', '.join(KINDS)}")
        if self.objective != "max-throughput" and not self.target_samples_per_s:
            raise ValueError(f"Problem.target_samples_per_s is needed for {self.objective!r}")


@dataclass(frozen=True)
class Plan:
    """The target fleet and why. ``counts`` omits zeros; figures are for the whole fleet."""

    counts: Mapping[Offering, int]
    cost_per_hour: float
    throughput: float  # useful samples/s after the ring's scaling efficiency
    hazard_per_hour: float  # expected revocations per hour across the fleet
    binding: tuple[str, ...]
    status: str  # "optimal" | "time-limit" | "fallback-lp" | "empty"
    objective: str = "max-throughput"
    raw_throughput: float = 0.0
    ring_efficiency: float = 1.0
    link: str = "intra-zone"
    solve_ms: float = 0.0
    considered: int = 0
    pruned: int = 0
    chosen: tuple[Candidate, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return sum(self.counts.values())

    def explain(self) -> str:
        """A few lines: what is chosen, what it costs and yields, and what bound it."""
        lines = [f"objective {self.objective}: status {self.status}, {self.size} instances, "
                 f"${self.cost_per_hour:.3f}/h, {self.throughput:.1f} useful samples/s "
                 f"(ring efficiency {self.ring_efficiency:.3f} over the {self.link} link), "
                 f"{self.hazard_per_hour:.3f} expected revocations/h"]
        for c in self.chosen:
            n = self.counts.get(c.offering, 0)
            lines.append(f"  {n:>3} x {c.offering.key}  ${c.price_per_hour:.3f}/h each, "
                         f"{c.samples_per_s:.1f} samples/s ({c.useful:.1f} useful), "
                         f"hazard {c.hazard_per_hour:.3f}/h" + (f", held now {c.current}"
                                                                if c.current else ""))
        lines.append("bound by: " + (", ".join(self.binding) if self.binding else "nothing"))
        lines.append(f"considered {self.considered} offerings, pruned {self.pruned} dominated; "
                     f"solved in {self.solve_ms:.1f} ms")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def ring_efficiency(n: int, raw_samples_per_s: float, model_mb: float, global_batch: int,
                    gbps: float) -> float:
    """R / S for a ring of ``n`` workers delivering ``raw_samples_per_s`` in compute."""
    if n <= 1 or raw_samples_per_s <= 0 or model_mb <= 0:
        return 1.0
    t_comm = 2.0 * (n - 1) / n * model_mb * 8e6 / (gbps * 1e9)
    return 1.0 / (1.0 + raw_samples_per_s * t_comm / global_batch)


def solve(problem: Problem, *, time_limit_s: float = 1.0) -> Plan:
    """Solve ``problem`` within ``time_limit_s`` per pass (a pass: one region search).

    Returns a :class:`Plan`; its ``status`` is ``"optimal"``, ``"time-limit"`` (best integer
    fleet found in time), ``"fallback-lp"`` (rounded LP relaxation) or ``"empty"`` (nothing
    to buy and nothing required). Raises :class:`InfeasibleError` naming the constraint that
    cannot be met (e.g. the budget is too small for the throughput target).
    """
    t0 = time.perf_counter()
    cands, pruned = _prune(problem)
    if not cands:
        if problem.min_size > 0 or problem.target_samples_per_s:
            raise InfeasibleError(
                f"no usable offering: {len(problem.candidates)} offered, all without useful "
                f"throughput, availability or within budget (check source.regions/gpus, "
                f"fleet.markets and objective.budget_per_hour)")
        return Plan({}, 0.0, 0.0, 0.0, (), "empty", problem.objective,
                    considered=len(problem.candidates), pruned=pruned, notes=problem.notes)
    link, gbps = _link(problem, cands, None)
    ring_matters = problem.model_mb > 0 and bool(problem.target_samples_per_s or
                                                 problem.ondemand_floor_samples_per_s > 0)
    n_guess = problem.max_size
    if ring_matters:  # optimistic first guess: the fewest of the fastest instances
        fastest = max(c.useful for c in cands)
        n_guess = min(problem.max_size, max(1, problem.min_size, math.ceil(
            (problem.target_samples_per_s or 0.0) / fastest)))
    best: tuple[_Model, np.ndarray, str] | None = None
    attempt = 0
    while best is None:  # after attempt 3 only a slower link can ask for another pass
        if attempt == 3:
            n_guess = problem.max_size  # always a valid bound on 2(N-1)/N
        found = _solve_model(problem, cands, n_guess, gbps, time_limit_s)
        if found is None:
            if n_guess < problem.max_size and ring_matters:
                n_guess = problem.max_size
                attempt += 1
                continue
            raise InfeasibleError(_diagnose(problem, cands, problem.max_size, gbps, time_limit_s))
        model, x, status = found
        n_found = int(round(x[:model.n].sum()))
        _, new_gbps = _link(problem, model.cands, x[:model.n])  # the model's own order
        if not ring_matters or (n_found <= n_guess and new_gbps >= gbps):
            best = (model, x, status)  # the ring term used bounds the one of this fleet
            break
        attempt += 1
        n_guess = problem.max_size if attempt >= 3 else max(n_guess + 1, n_found)
        gbps = min(gbps, new_gbps)
        if problem.max_regions == 1:  # re-solve in the region found (and where we hold)
            keep = {c.offering.region for c in model.cands}
            cands = [c for c in cands if c.offering.region in keep or c.current]
        # The next pass asks for more (a larger ring, maybe a slower link), so the fleet just
        # found, optimal under a looser target row, is optimal for it too if it meets it:
        # keep it instead of solving again (the same fleet, up to ties and the MIP gap).
        try:
            again = _build(problem, model.cands, n_guess, gbps, current=_current(cands))
        except InfeasibleError:  # the ring cannot carry the target: the next pass says so
            continue
        if n_found <= n_guess and _row_ok(again, x):
            best = (again, x, status)
    assert best is not None
    model, x, status = best
    return _plan(problem, model, x, status, pruned, (time.perf_counter() - t0) * 1000)


def _plan(p: Problem, model: _Model, x: np.ndarray, status: str, pruned: int,
          ms: float) -> Plan:
    counts = {c.offering: int(v) for c, v in zip(model.cands, x[:model.n]) if v > 0.5}
    chosen = tuple(c for c in model.cands if c.offering in counts)
    raw = sum(c.useful * counts[c.offering] for c in chosen)
    link, gbps = _link(p, model.cands, x[:model.n])
    eff = ring_efficiency(sum(counts.values()), raw, p.model_mb, p.global_batch, gbps)
    return Plan(
        counts=MappingProxyType(counts),
        cost_per_hour=sum(c.price_per_hour * counts[c.offering] for c in chosen),
        throughput=raw * eff,
        hazard_per_hour=sum(c.hazard_per_hour * counts[c.offering] for c in chosen),
        binding=tuple(_binding(model, x)), status=status, objective=p.objective,
        raw_throughput=raw, ring_efficiency=eff, link=link, solve_ms=ms,
        considered=len(p.candidates), pruned=pruned, chosen=chosen, notes=p.notes)


_GROUPS = ("budget", "target", "availability", "quotas", "zone-share", "ondemand-floor",
           "max_regions")


def _diagnose(p: Problem, cands: list[Candidate], n_guess: int, gbps: float,
              limit: float) -> str:
    """Name the constraint whose removal makes the problem feasible, with figures."""
    def feasible(drop: frozenset[str], **changes) -> np.ndarray | None:
        q = replace(p, **changes) if changes else p
        try:
            res = _run(_build(q, cands, n_guess, gbps, drop), limit)
        except InfeasibleError:
            return None
        return res.x if res.x is not None and res.status in (0, 1) else None

    for g in _GROUPS:
        x = feasible(frozenset({g}))
        if x is None:
            continue
        if g == "budget":
            need = sum(c.price_per_hour * v for c, v in zip(cands, np.round(x)))
            what = ("the throughput target" if p.objective == "min-cost" else
                    "the deadline's rate" if p.objective == "deadline" else "fleet.min_size")
            return (f"objective.budget_per_hour = {p.budget_per_hour:.2f} $/h is too small for "
                    f"{what}: the cheapest fleet that meets it costs {need:.2f} $/h "
                    f"(raise the budget or lower the target)")
        names = {"target": f"throughput target {p.target_samples_per_s or 0:.1f} samples/s "
                           f"cannot be reached within fleet.max_size = {p.max_size} and the quotas",
                 "availability": "not enough capacity is available in the offerings",
                 "quotas": "fleet.region_quota_gpus / family_quota_gpus are too small",
                 "zone-share": f"fleet.max_zone_share = {p.max_zone_share} cannot be met "
                               f"with the zones available",
                 "ondemand-floor": "the deadline's on-demand safety floor cannot be bought",
                 "max_regions": f"fleet.max_regions = {p.max_regions} is too few"}
        return f"infeasible: {names[g]} (relaxing it makes a fleet possible)"
    if p.min_size > 0 and feasible(frozenset(), min_size=0) is not None:
        return (f"infeasible: fleet.min_size = {p.min_size} cannot be met "
                f"with the offerings and constraints")
    return ("infeasible: no fleet satisfies the constraints together (budget, size, quotas, "
            "zone share); relax several of them")


# ----------------------------------------------------------------------------- building

def build_problem(settings: "Settings", quotes: Sequence[PriceQuote],
                  risks: Mapping[Offering, RiskEstimate], *,
                  current: Mapping[Offering, int] = MappingProxyType({}),
                  throughput: ThroughputModel | None = None, now: datetime | None = None,
                  avoid: Collection[str] = (), available: Mapping[Offering, int] =
                  MappingProxyType({}), work_done: float = 0.0,
                  elapsed_hours: float = 0.0) -> Problem:
    """Turn settings, checked quotes and risk estimates into a :class:`Problem`.

    The latest quote per offering at ``now`` (default: the newest quote) no older than
    ``optimizer.max_quote_age_hours`` is used; a spot quote that carries its on-demand price
    also yields the on-demand offering. ``avoid`` names zones (``zone`` or ``region/zone``)
    that just revoked: their spot offerings may keep what they hold but not grow, unless
    every spot zone is avoided. ``available`` caps counts (availability traces).
    ``work_done``/``elapsed_hours`` give progress for the deadline objective.
    Raises InfeasibleError when the deadline has passed.
    """
    job, obj, fleet, opt = settings.job, settings.objective, settings.fleet, settings.optimizer
    model = throughput or ThroughputModel(priors=job.throughput_priors,
                                          unit=job.samples_per_s_per_unit)
    if now is None:
        now = max((q.time for q in quotes), default=None)
    now = utc(now) if now is not None else None
    max_age = timedelta(hours=opt.max_quote_age_hours)
    latest: dict[Offering, PriceQuote] = {}
    for q in quotes:
        if now is not None and (q.time > now or now - q.time > max_age):
            continue
        if q.offering not in latest or q.time > latest[q.offering].time:
            latest[q.offering] = q
    prices: dict[Offering, float] = {o: q.price_per_hour for o, q in latest.items()}
    for o, q in latest.items():
        od = o.with_market("on-demand")
        if o.market == "spot" and q.on_demand_per_hour and od not in prices:
            prices[od] = q.on_demand_per_hour
    regions = set(settings.source.regions)
    gpus = {g.lower() for g in settings.source.gpus}
    notes: list[str] = []
    unknown: set[str] = set()
    n_ref = max(1, sum(current.values()), fleet.min_size)
    loss_h = (fleet.boot_s + (fleet.step_s + fleet.reform_s) * n_ref) / 3600.0
    avoid_set = set(avoid)
    spot_zones = {(o.zone, f"{o.region}/{o.zone}") for o in prices if o.market == "spot"}
    if spot_zones and all(z in avoid_set or rz in avoid_set for z, rz in spot_zones):
        notes.append("every spot zone was to be avoided; avoiding none")
        avoid_set = set()
    cands = []
    for o in sorted(prices):
        if o.market not in fleet.markets or (regions and o.region not in regions):
            continue
        spec = _gpu_spec(o.instance_type)
        if gpus and (spec is None or spec.model.lower() not in gpus):
            continue
        try:
            s = model.samples_per_s(o.instance_type)
        except KeyError:
            unknown.add(o.instance_type)
            continue
        r = risks.get(o)
        if r is not None:
            hz = r.hazard_per_hour
        else:
            hz = 0.0 if o.market == "on-demand" else opt.default_spot_hazard_per_hour
        cap = available.get(o)
        held = int(current.get(o, 0))
        if o.market == "spot" and (o.zone in avoid_set or f"{o.region}/{o.zone}" in avoid_set):
            cap = held if cap is None else min(cap, held)
        cands.append(Candidate(o, prices[o], s, hz, loss_h, spec.count if spec else 1,
                               cap, held))
    if unknown:
        notes.append(f"skipped {len(unknown)} instance types with no throughput prior: "
                     + ", ".join(sorted(unknown)[:8]))
    target = obj.target_samples_per_s
    floor = 0.0
    if obj.kind == "deadline":
        left = max(0.0, (obj.work_samples or 0.0) - work_done)
        hours = (obj.deadline_hours or 0.0) - elapsed_hours
        if left > 0 and hours <= 0:
            raise InfeasibleError(f"objective.deadline_hours = {obj.deadline_hours}: the deadline "
                                  f"has passed with {left:.0f} samples left")
        target = max(left / (hours * 3600.0), 1e-9) if left > 0 else 1e-9
        od_rate = max((c.useful for c in cands if c.offering.market == "on-demand"),
                      default=0.0) * fleet.max_size
        floor = deadline_floor(target, left, hours, od_rate, obj.safety_hours)
    return Problem(
        candidates=tuple(cands), objective=obj.kind, target_samples_per_s=target,
        budget_per_hour=obj.budget_per_hour, ondemand_floor_samples_per_s=floor,
        min_size=fleet.min_size, max_size=fleet.max_size, max_zone_share=fleet.max_zone_share,
        zone_allowance=fleet.zone_allowance, region_quota_gpus=dict(fleet.region_quota_gpus),
        family_quota_gpus=dict(fleet.family_quota_gpus), max_regions=fleet.max_regions,
        model_mb=job.model_mb, global_batch=job.global_batch,
        intra_zone_gbps=fleet.intra_zone_gbps, inter_zone_gbps=fleet.inter_zone_gbps,
        inter_region_gbps=fleet.inter_region_gbps, boot_s=fleet.boot_s,
        reform_s=fleet.reform_s, churn_horizon_hours=fleet.churn_horizon_hours,
        notes=tuple(notes))


def deadline_floor(rate: float, work_left: float, hours_left: float, od_rate: float,
                   safety_hours: float) -> float:
    """On-demand samples/s to keep for a deadline (Uniform Progress' safety net).

    slack = hours left - hours the largest on-demand fleet (``od_rate``) would need; the
    floor is ``rate * (1 - slack / safety_hours)`` clipped to [0, rate] (all on-demand when
    the slack is gone; none while it exceeds ``safety_hours``).
    """
    if work_left <= 0:
        return 0.0
    if od_rate <= 0:
        return 0.0
    slack = hours_left - work_left / (od_rate * 3600.0)
    if safety_hours <= 0:
        return rate if slack <= 0 else 0.0
    return rate * min(1.0, max(0.0, 1.0 - slack / safety_hours))


def _gpu_spec(instance_type: str):
    try:
        from pricing import catalog
        return catalog.gpu_for(instance_type)
    except (ImportError, KeyError, ValueError, LookupError):
        return None
