"""The fleet optimiser's solve: a Problem in, a Plan out (the MILP is written out below).

Design: a pure function over frozen data (SkyPilot's ``optimizer.py`` writes its ILP out the
same way, but here nothing is printed or mutated). :func:`build_problem` turns settings,
quotes and risk estimates into a :class:`Problem`; :func:`solve` returns a :class:`Plan` that
explains itself. A solve is one ``scipy.optimize.milp`` call (HiGHS) per region tried, each
with a time limit (the MILP machinery is in :mod:`provisioner.plan.milp`);
if it yields no integer solution in time, the LP relaxation is rounded and repaired, so a
decision always comes back. An impossible configuration raises
:class:`~provisioner.errors.InfeasibleError` naming the constraint that cannot be met.

The MILP. For each offering o (cloud, region, zone, type, market) that survives pruning:

    x_o in Z, lb_o <= x_o <= ub_o     instances to hold (ub_o: availability, max_size; an
                                      avoided zone may keep what it has but not grow;
                                      lb_o: Candidate.min_count, instances the planner keeps:
                                      launched within the churn horizon, or spot kept while
                                      an on-demand floor is bought beside it)
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
    size                 min_size <= sum n_o x_o <= max_size
    quotas               sum_{o in region r} g_o x_o <= Q_r;  same per instance family
    zone share           sum_{spot o in zone z} n_o x_o <= share * sum n_o x_o + allowance
                         (n_o: instances per unit, a virtual worker's n, else 1:
                         provisioner.plan.virtual.per_unit)
    regions              sum_{o in r} x_o <= max_size * y_r,  sum y_r <= max_regions (y binary,
                         only when the offerings span more regions than allowed)
    churn                for offerings held now (x0_o > 0): a_o >= x_o - x0_o, d_o >= x0_o - x_o;
                         each added instance costs its boot time, each change one re-form of
                         the ring; the cost is spread over churn_horizon_hours, so a change is
                         made only when it pays back within that horizon. A spot instance
                         held is relaunched h_o times an hour (each revocation: a boot and a
                         re-form), so its hourly cost is c_o + h_o (boot c_o + re-form): an
                         instance whose expected lifetime does not pay back its boot and
                         the recovery after it is not worth a swap (the objective says so,
                         no constant).

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

import math
import time
from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

import numpy as np

from provisioner.errors import InfeasibleError
from provisioner.plan.milp import (Model, binding_rows, build_model, current_fleet, link_of,
                                   prune, row_ok, run_highs, solve_model)
from pricing.model import Offering
from provisioner.plan.model import Candidate, Plan, Problem, ring_efficiency

__all__ = ["fleet_objective", "solve"]


def solve(problem: Problem, *, time_limit_s: float = 1.0) -> Plan:
    """Solve ``problem`` (see :func:`_solve`); a target met by a ring spread over zones is
    checked against the same target in each of those zones alone (see :func:`_one_zone`)."""
    plan = _solve(problem, time_limit_s=time_limit_s)
    return _one_zone(problem, plan, time_limit_s)


def fleet_objective(p: Problem, counts: Mapping[Offering, int]) -> float:
    """The min-cost objective of a fleet, churn included (as the MILP prices it): USD an
    hour, each launch and removal spread over the churn horizon, each expected revocation
    priced as a relaunch."""
    cur_cost = sum(c.current * c.price_per_hour for c in p.candidates)
    boot_h, reform_h, horizon = p.boot_s / 3600, p.reform_s / 3600, p.churn_horizon_hours
    total = 0.0
    for c in p.candidates:
        x = counts.get(c.offering, 0)
        change = boot_h * c.price_per_hour + reform_h * cur_cost
        total += x * (c.price_per_hour + c.hazard_per_hour * change)
        total += max(0, x - c.current) * change / horizon
        total += max(0, c.current - x) * reform_h * cur_cost / horizon
    return total


def _one_zone(p: Problem, plan: Plan, time_limit_s: float) -> Plan:
    """The ring's link is guessed, and a fleet found across zones is solved again at the
    slower link for every candidate, so a fleet inside one zone (the faster link) was
    never priced at its own speed: a ring spread over three zones stayed there at 0.80
    efficiency where five instances in one zone gave 0.89 for the same price. For a
    throughput target with no zone cap, each zone of the fleet is solved alone too, and the
    fleet with the lowest objective (churn included) is taken."""
    if (p.objective == "max-throughput" or p.max_zone_share < 1.0 or p.model_mb <= 0
            or plan.link != "inter-zone"):
        return plan
    zones = {c.zone_key for c in plan.chosen}
    best, best_obj = plan, fleet_objective(p, plan.counts)
    for z in sorted(zones):
        inside = tuple(c for c in p.candidates if c.zone_key == z)
        if any(c.min_count > 0 and c.zone_key != z for c in p.candidates):
            continue  # it would drop instances the planner keeps
        try:
            alt = _solve(replace(p, candidates=inside), time_limit_s=time_limit_s)
        except InfeasibleError:
            continue
        obj = fleet_objective(p, alt.counts)
        if obj < best_obj - 1e-9:
            best, best_obj = replace(alt, considered=plan.considered), obj
    return best


def _solve(problem: Problem, *, time_limit_s: float = 1.0) -> Plan:
    """Solve ``problem`` within ``time_limit_s`` per pass (a pass: one region search).

    Returns a :class:`Plan`; its ``status`` is ``"optimal"``, ``"time-limit"`` (best integer
    fleet found in time), ``"fallback-lp"`` (rounded LP relaxation) or ``"empty"`` (nothing
    to buy and nothing required). Raises :class:`InfeasibleError` naming the constraint that
    cannot be met (e.g. the budget is too small for the throughput target).
    """
    t0 = time.perf_counter()
    cands, pruned = prune(problem)
    if not cands:
        if problem.min_size > 0 or problem.target_samples_per_s:
            raise InfeasibleError(
                f"no usable offering: {len(problem.candidates)} offered, all without useful "
                f"throughput, availability or within budget (check source.regions/gpus, "
                f"fleet.markets and objective.budget_per_hour)")
        return Plan({}, 0.0, 0.0, 0.0, (), "empty", problem.objective,
                    considered=len(problem.candidates), pruned=pruned, notes=problem.notes)
    link, gbps = link_of(problem, cands, None)
    ring_matters = problem.model_mb > 0 and bool(problem.target_samples_per_s or
                                                 problem.ondemand_floor_samples_per_s > 0)
    n_guess = problem.max_size
    if ring_matters:  # optimistic first guess: the fewest of the fastest instances
        fastest = max(c.useful for c in cands)
        n_guess = min(problem.max_size, max(1, problem.min_size, math.ceil(
            (problem.target_samples_per_s or 0.0) / fastest)))
    best: tuple[Model, np.ndarray, str] | None = None
    attempt = 0
    while best is None:  # after attempt 3 only a slower link can ask for another pass
        if attempt == 3:
            n_guess = problem.max_size  # always a valid bound on 2(N-1)/N
        found = solve_model(problem, cands, n_guess, gbps, time_limit_s)
        if found is None:
            if n_guess < problem.max_size and ring_matters:
                n_guess = problem.max_size
                attempt += 1
                continue
            # a pass can run out of time on a loaded machine before HiGHS has a fleet (the
            # repaired LP may fail too): once more with more time before calling it infeasible
            found = solve_model(problem, cands, n_guess, gbps, RETRY_FACTOR * time_limit_s)
        if found is None:
            raise InfeasibleError(_diagnose(problem, cands, problem.max_size, gbps,
                                            RETRY_FACTOR * time_limit_s))
        model, x, status = found
        n_found = int(round(x[:model.n].sum()))
        _, new_gbps = link_of(problem, model.cands, x[:model.n])  # the model's own order
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
            again = build_model(problem, model.cands, n_guess, gbps, current=current_fleet(cands))
        except InfeasibleError:  # the ring cannot carry the target: the next pass says so
            continue
        if n_found <= n_guess and row_ok(again, x):
            best = (again, x, status)
    assert best is not None
    model, x, status = best
    return _plan(problem, model, x, status, pruned, (time.perf_counter() - t0) * 1000)


def _plan(p: Problem, model: Model, x: np.ndarray, status: str, pruned: int,
          ms: float) -> Plan:
    counts = {c.offering: int(v) for c, v in zip(model.cands, x[:model.n]) if v > 0.5}
    chosen = tuple(c for c in model.cands if c.offering in counts)
    raw = sum(c.useful * counts[c.offering] for c in chosen)
    link, gbps = link_of(p, model.cands, x[:model.n])
    eff = ring_efficiency(sum(counts.values()), raw, p.model_mb, p.global_batch, gbps)
    return Plan(
        counts=MappingProxyType(counts),
        cost_per_hour=sum(c.price_per_hour * counts[c.offering] for c in chosen),
        throughput=raw * eff,
        hazard_per_hour=sum(c.hazard_per_hour * counts[c.offering] for c in chosen),
        binding=tuple(binding_rows(model, x)), status=status, objective=p.objective,
        raw_throughput=raw, ring_efficiency=eff, link=link, solve_ms=ms,
        considered=len(p.candidates), pruned=pruned, chosen=chosen, notes=p.notes)


#: How much longer the one retry of a pass that found no fleet may run (and the diagnosis).
RETRY_FACTOR = 4.0

_GROUPS = ("budget", "target", "availability", "quotas", "zone-share", "ondemand-floor",
           "max_regions")


def _diagnose(p: Problem, cands: list[Candidate], n_guess: int, gbps: float,
              limit: float) -> str:
    """Name the constraint whose removal makes the problem feasible, with figures."""
    def feasible(drop: frozenset[str], **changes) -> np.ndarray | None:
        q = replace(p, **changes) if changes else p
        try:
            res = run_highs(build_model(q, cands, n_guess, gbps, drop), limit)
        except InfeasibleError:
            return None
        return res.x if res.x is not None and res.status in (0, 1) else None

    if feasible(frozenset()) is not None:  # as posed it has a fleet: the pass timed out
        return (f"no fleet found within the solver's time limit ({limit:g} s per pass) on a "
                f"problem that has one: raise optimizer.time_limit_s or give the solver more CPU")
    for g in _GROUPS:
        if g == "budget" and p.budget_per_hour is None:
            continue  # no budget row to relax
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
