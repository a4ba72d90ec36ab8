"""The MILP machinery of the optimiser: pruning, the model, HiGHS calls, LP fallback.

Design: everything here is private to :mod:`provisioner.plan.solve`, whose docstring writes
the MILP out; this module only builds the sparse model of a :class:`Problem` (one row dict
per constraint, so rows can be named, dropped for diagnosis and checked for binding), runs
``scipy.optimize.milp`` with a time limit, repairs a rounded LP relaxation when no integer
solution came back in time, and splits a one-region ring into per-region MILPs ordered by
one block LP. Pure functions of their arguments.

Rule: callers outside the optimiser use :func:`provisioner.plan.solve.solve`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from provisioner.errors import InfeasibleError
from provisioner.plan.model import Candidate, Problem, family_of
from provisioner.plan.virtual import most_units, per_unit


# ----------------------------------------------------------------------------- pruning

def prune(p: Problem) -> tuple[list[Candidate], int]:
    keep: list[tuple[tuple[str, ...], Candidate]] = []
    dropped = 0
    budget = math.inf if p.budget_per_hour is None else p.budget_per_hour
    max_size = p.max_size
    families: dict[str, str] = {}
    # (price, -useful, hazard, ub, candidate): each property read once per candidate (this
    # loop is a few ms of a 1,000-offering solve, so it avoids repeated property calls)
    groups: dict[tuple, list[tuple[float, float, float, int, Candidate]]] = defaultdict(list)
    for c in p.candidates:
        ub = most_units(c, max_size)
        u = c.useful
        price = c.price_per_hour
        if c.current == 0 and (u <= 0 or ub <= 0 or price > budget):
            dropped += 1
            continue
        o = c.offering
        t = o.instance_type
        fam = families.get(t)
        if fam is None:
            fam = families[t] = family_of(t)
        groups[(o.region, o.zone, fam, o.market, c.gpus)].append(
            (price, -u, c.hazard_per_hour, ub, c))
    for members in groups.values():
        if len(members) > 1:
            members.sort(key=lambda t: t[:3])
        frontier: list[tuple[float, float, float, int, Candidate]] = []
        for t in members:
            price, neg_u, hz, ub, c = t
            if c.current == 0 and frontier and any(
                    f[0] <= price and f[1] <= neg_u and f[2] <= hz and f[3] >= ub
                    for f in frontier):
                dropped += 1
                continue
            frontier.append(t)
        for t in frontier:
            o = t[4].offering
            keep.append(((o.cloud, o.region, o.zone, o.instance_type, o.market), t[4]))
    keep.sort(key=lambda kc: kc[0])
    return [kc[1] for kc in keep], dropped


def _ub(p: Problem, c: Candidate) -> int:
    return most_units(c, p.max_size)


# ----------------------------------------------------------------------------- the MILP

@dataclass
class Model:
    cands: list[Candidate]
    c: np.ndarray
    integrality: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    rows: list[tuple[str, dict[int, float], float, float]]  # name, coefs, lo, hi
    n: int
    #: ub tightened by single-row implications (x_o <= budget / c_o, quota / g_o): the same
    #: integer fleets, a tighter LP; HiGHS gets these, while ``ub`` stays what binding_rows reads
    run_ub: np.ndarray | None = None

    @property
    def solver_ub(self) -> np.ndarray:
        return self.ub if self.run_ub is None else self.run_ub


def current_fleet(cands: Sequence[Candidate]) -> tuple[float, float]:
    """Cost per hour and useful samples/s of the fleet held now."""
    held = [c for c in cands if c.current]
    return (sum(c.current * c.price_per_hour for c in held),
            sum(c.current * c.useful for c in held))


def _removal(p: Problem, current: tuple[float, float]) -> float:
    """Objective cost of removing one held instance (one ring re-form, over the horizon)."""
    scale = current[0] if p.objective != "max-throughput" else current[1]
    return p.reform_s / 3600 * scale / p.churn_horizon_hours


def _t_comm(n: int, p: Problem, gbps: float) -> float:
    if n <= 1 or p.model_mb <= 0:
        return 0.0
    return 2.0 * (n - 1) / n * p.model_mb * 8e6 / (gbps * 1e9)


def _raw_target(target: float, t_comm: float, p: Problem, name: str) -> float:
    k = t_comm / p.global_batch
    if target * k >= 1.0:
        raise InfeasibleError(
            f"{name}: {target:.1f} samples/s is beyond what the ring can carry "
            f"(all-reduce of {p.model_mb} MB caps it below {1 / k:.1f} samples/s; raise "
            f"job.global_batch or lower the target)")
    return target / (1.0 - target * k)


def build_model(p: Problem, cands: list[Candidate], n_guess: int, gbps: float,
           drop: frozenset[str] = frozenset(),
           current: tuple[float, float] | None = None) -> Model:
    n = len(cands)
    held = [i for i, c in enumerate(cands) if c.current > 0]
    m = len(held)
    regions = sorted({c.offering.region for c in cands})
    use_y = len(regions) > p.max_regions and "max_regions" not in drop
    nv = n + 2 * m + (len(regions) if use_y else 0)
    cost = np.zeros(nv)
    integ = np.zeros(nv)
    integ[:n] = 1
    lb = np.zeros(nv)
    ub = np.full(nv, np.inf)
    no_avail = "availability" in drop
    max_size = p.max_size
    for i, c in enumerate(cands):
        ub[i] = most_units(c, max_size, capped=not no_avail)
        lb[i] = min(c.min_count, ub[i])  # kept instances (Candidate.min_count)
    horizon = p.churn_horizon_hours
    cur_cost, cur_rate = current or current_fleet(cands)
    prices = [c.price_per_hour for c in cands]  # each property computed once
    useful = [c.useful for c in cands]
    mean_c = (sum(prices) / n if n else 0.0) or 1.0
    mean_u = (sum(useful) / n if n else 0.0) or 1.0
    boot_h, reform_h = p.boot_s / 3600, p.reform_s / 3600
    hz = np.array([c.hazard_per_hour for c in cands])
    if p.objective != "max-throughput":  # minimise cost: the per-instance terms at once
        change = boot_h * np.array(prices) + reform_h * cur_cost  # one launch (a boot, a re-form)
        launch = change / horizon
        remove = reform_h * cur_cost / horizon
        # every revocation is a relaunch: h of them an hour held (the replacement's boot and
        # the ring's re-form), priced like the launch itself
        base = np.array(prices) + hz * change - 1e-4 * (mean_c / mean_u) * np.array(useful)
    else:
        change = boot_h * np.array(useful) + reform_h * cur_rate
        launch = change / horizon
        remove = reform_h * cur_rate / horizon
        base = -np.array(useful) + hz * change + 1e-4 * (mean_u / mean_c) * np.array(prices)
    if n:
        cost[:n] = base + launch
    for j, i in enumerate(held):  # held: launches and removals are the aux columns' cost
        cost[i] = base[i]
        cost[n + j] = launch[i]
        cost[n + m + j] = remove
    rows: list[tuple[str, dict[int, float], float, float]] = []
    weight = [float(per_unit(c)) for c in cands]  # instances per unit (a VW's n)
    every = dict(enumerate(weight))
    rows.append(("fleet size (min_size/max_size)", every, float(p.min_size), float(p.max_size)))
    if p.budget_per_hour is not None and "budget" not in drop:
        rows.append(("budget", dict(enumerate(prices)),
                     -np.inf, p.budget_per_hour))
    tc = _t_comm(n_guess, p, gbps)
    if p.target_samples_per_s and "target" not in drop:
        raw = _raw_target(p.target_samples_per_s, tc, p, "throughput target")
        # min(u, raw): the same integer fleets (one such instance alone meets the row), but
        # an LP that cannot buy a fraction of an instance bigger than the target
        rows.append(("throughput target", {i: min(u, raw) for i, u in enumerate(useful)},
                     raw, np.inf))
    if p.ondemand_floor_samples_per_s > 0 and "ondemand-floor" not in drop:
        raw = _raw_target(p.ondemand_floor_samples_per_s, tc, p, "on-demand floor")
        od = {i: min(useful[i], raw) for i, c in enumerate(cands)
              if c.offering.market == "on-demand"}
        rows.append(("on-demand floor (deadline safety)", od, raw, np.inf))
    if "quotas" not in drop:
        for region, q in sorted(p.region_quota_gpus.items()):
            co = {i: float(c.gpus) for i, c in enumerate(cands) if c.offering.region == region}
            if co:
                rows.append((f"region quota {region} ({q} GPUs)", co, -np.inf, float(q)))
        for fam, q in sorted(p.family_quota_gpus.items()):
            co = {i: float(c.gpus) for i, c in enumerate(cands) if c.family == fam}
            if co:
                rows.append((f"family quota {fam} ({q} GPUs)", co, -np.inf, float(q)))
    if p.max_zone_share < 1.0 and "zone-share" not in drop:
        zones: dict[str, list[int]] = defaultdict(list)
        for i, c in enumerate(cands):
            if c.offering.market == "spot":
                zones[c.zone_key].append(i)
        others = {i: -p.max_zone_share * w for i, w in enumerate(weight)}
        for z, idx in sorted(zones.items()):
            co = others.copy()
            for i in idx:
                co[i] = (1.0 - p.max_zone_share) * weight[i]
            rows.append((f"zone share {z}", co, -np.inf, float(p.zone_allowance)))
    for j, i in enumerate(held):
        x0 = float(cands[i].current)
        rows.append(("churn+", {n + j: 1.0, i: -1.0}, -x0, np.inf))
        rows.append(("churn-", {n + m + j: 1.0, i: 1.0}, x0, np.inf))
    if use_y:
        base = n + 2 * m
        for k, r in enumerate(regions):
            co = {i: 1.0 for i, c in enumerate(cands) if c.offering.region == r}
            co[base + k] = -float(p.max_size)
            rows.append((f"region use {r}", co, -np.inf, 0.0))
            integ[base + k] = 1
            ub[base + k] = 1
        rows.append((f"max_regions ({p.max_regions})",
                     {base + k: 1.0 for k in range(len(regions))}, -np.inf, float(p.max_regions)))
    run_ub = ub.copy()
    for _, co, lo, hi in rows:
        if (lo == -np.inf and math.isfinite(hi) and hi >= 0
                and all(w >= 0 for w in co.values())):  # every x >= 0: valid one by one
            for j, w in co.items():
                if j < n and w > 0:
                    run_ub[j] = min(run_ub[j], math.floor(hi / w + 1e-9))
    return Model(cands, cost, integ, lb, ub, rows, n, run_ub)


def run_highs(model: Model, time_limit_s: float, relax: bool = False,
         cutoff: float | None = None):
    """One HiGHS call. ``cutoff``: only fleets with an objective below it are of interest
    (HiGHS prunes every node whose bound reaches it, so a model that cannot beat it is
    settled fast; what it returns then is some fleet at or above the cutoff, or none)."""
    data: list[float] = []
    ri: list[int] = []
    ci: list[int] = []
    for r, (_, co, _, _) in enumerate(model.rows):  # whole rows at a time
        ci.extend(co)
        data.extend(co.values())
        ri.extend([r] * len(co))
    lo = [row[2] for row in model.rows]
    hi = [row[3] for row in model.rows]
    nv = len(model.c)
    a = coo_matrix((data, (ri, ci)), shape=(len(model.rows), nv)).tocsr()
    cons = [LinearConstraint(a, np.array(lo), np.array(hi))] if model.rows else []
    options = {"time_limit": max(time_limit_s, 1e-3), "disp": False, "mip_rel_gap": MIP_GAP}
    bounds = Bounds(model.lb, model.solver_ub)
    if relax:  # an LP: HiGHS's presolve costs more than it saves on these (block LP of
        # 1,000 offerings 11.5 -> 8.8 ms CPU, 10,000: 133 -> 93 ms; the same optimum)
        return milp(model.c, constraints=cons, bounds=bounds, integrality=np.zeros(nv),
                    options={**options, "presolve": False})
    options.update(_MIP_OPTIONS)
    if cutoff is not None:
        options["objective_bound"] = float(cutoff)
    with warnings.catch_warnings():  # scipy passes HiGHS's own options on, with a warning
        warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
        return milp(model.c, constraints=cons, bounds=bounds, integrality=model.integrality,
                    options=options)


#: HiGHS's relative MIP gap: a MILP stops once its fleet is proven within 0.1% of that
#: MILP's optimum (with 1e-4 HiGHS spent a third more time closing the last 0.1%, with
#: sub-MIPs and restarts, on the benchmark's region MILPs: max 57 -> 32 ms CPU).
MIP_GAP = 1e-3

#: HiGHS options for every MILP. Feasibility jump is a primal heuristic only (it finds a
#: first incumbent; the search and its proof of optimality do not depend on it); on the
#: region MILPs here (~40 integers, 5-20 rows, solved at the root) it was half of HiGHS's
#: time: 1,000-offering benchmark models, median 18 -> 9 ms per MILP, same optima.
_MIP_OPTIONS = {"mip_heuristic_run_feasibility_jump": False}


def row_ok(model: Model, x: np.ndarray, tol: float = 1e-6) -> bool:
    for _, co, l, h in model.rows:
        v = sum(x[j] * w for j, w in co.items())
        if v < l - tol * max(1.0, abs(l)) or v > h + tol * max(1.0, abs(h)):
            return False
    return True


def repair(model: Model, x_lp: np.ndarray) -> np.ndarray | None:
    """Round an LP solution down, then add instances greedily until every row holds."""
    x = np.floor(x_lp + 1e-9)
    x = np.minimum(np.maximum(x, model.lb), model.ub)
    n = model.n

    def fix_aux(v: np.ndarray) -> None:
        for name, co, l, _ in model.rows:
            if name in ("churn+", "churn-"):
                aux = next(j for j in co if j >= n)
                xi = next(j for j in co if j < n)
                v[aux] = max(0.0, l - co[xi] * v[xi])
            elif name.startswith("region use"):
                y = next(j for j in co if j >= n)
                v[y] = 1.0 if any(v[j] > 0.5 for j in co if j < n) else 0.0

    order = sorted(range(n), key=lambda i: model.c[i] / max(model.cands[i].useful, 1e-9))
    for _ in range(int(sum(model.ub[:n])) + 1):
        fix_aux(x)
        if row_ok(model, x):
            return x
        for i in order:
            if x[i] + 1 <= model.ub[i]:
                y = x.copy()
                y[i] += 1
                fix_aux(y)
                if all(v <= h + 1e-6 * max(1.0, abs(h)) for v, h in (
                        (sum(y[j] * w for j, w in co.items()), h) for _, co, _, h in model.rows)):
                    x = y
                    break
        else:
            return None
    return None


def binding_rows(model: Model, x: np.ndarray) -> list[str]:
    """Constraints that bind in the integer sense: one instance more (for an upper bound)
    or one fewer (for a lower bound) would break them."""
    out = []
    n = model.n
    for name, co, l, h in model.rows:
        if name.startswith(("churn", "region use")):
            continue
        v = sum(x[j] * w for j, w in co.items())
        tol = 1e-6 * max(1.0, abs(v))
        if math.isfinite(h):
            steps = [w for j, w in co.items() if j < n and w > 0 and x[j] < model.ub[j] - 0.5]
            if not steps or v + min(steps) > h + tol:
                out.append("max_size" if name.startswith("fleet size") else name)
                continue
        if math.isfinite(l) and l > 0:
            steps = [w for j, w in co.items() if j < n and w > 0 and x[j] > 0.5]
            if steps and v - min(steps) < l - tol:
                out.append("min_size" if name.startswith("fleet size") else name)
    for i, c in enumerate(model.cands):
        if (c.max_count is not None and model.ub[i] == c.max_count > 0
                and x[i] >= model.ub[i] - 0.5):
            out.append(f"availability {c.offering.key} ({c.max_count})")
    return sorted(set(out), key=out.index)


def link_of(p: Problem, cands: Sequence[Candidate], x: np.ndarray | None) -> tuple[str, float]:
    if x is None:
        if p.max_regions > 1 and len({c.offering.region for c in cands}) > 1:
            return "inter-region", p.inter_region_gbps
        if p.max_zone_share < 1.0:
            return "inter-zone", p.inter_zone_gbps
        return "intra-zone", p.intra_zone_gbps
    used = [c for c, v in zip(cands, x) if v > 0.5]
    if sum(v for v in x if v > 0.5) <= 1.5:
        return "none (one instance)", p.intra_zone_gbps
    if len({c.offering.region for c in used}) > 1:
        return "inter-region", p.inter_region_gbps
    if len({c.zone_key for c in used}) > 1:  # a region-wide offering ("*") beside a zone of
        # its region is two zones; alone, one (as the pacing's rings and the simulator have
        # it: a 4-ring of on-demand in "*" read at the inter-zone link fell 7.9% short of
        # the job's own pace, and the 5th instance bought cost its catch-up 3% per sample)
        return "inter-zone", p.inter_zone_gbps
    return "intra-zone", p.intra_zone_gbps


def _solve_one(model: Model, limit: float,
               cutoff: float | None = None) -> tuple[Model, np.ndarray, str] | None:
    """One MILP; on a time-out without a solution, the repaired LP relaxation.

    With ``cutoff`` (see :func:`run_highs`) None also means "nothing below the cutoff", and a
    fleet returned may be any fleet at or above it (callers compare its objective).
    """
    res = run_highs(model, limit, cutoff=cutoff)
    if res.x is not None and res.status in (0, 1):
        return model, np.round(res.x), "optimal" if res.status == 0 else "time-limit"
    if res.status == 2 or (cutoff is not None and res.status != 1):
        return None
    lp = run_highs(model, limit, relax=True)
    x = repair(model, lp.x) if lp.x is not None else None
    return None if x is None else (model, x, "fallback-lp")


#: The region search stops when no region left can beat the best fleet by more than this
#: fraction of its objective (each MILP costs ~10 ms of HiGHS set-up on small problems).
#: With :data:`MIP_GAP` the fleet returned is within 0.5% of the optimum.
REGION_GAP = 0.004


def solve_model(p: Problem, cands: list[Candidate], n_guess: int, gbps: float,
                 limit: float) -> tuple[Model, np.ndarray, str] | None:
    """Solve the MILP; a ring confined to one region is solved region by region.

    With ``max_regions == 1`` the problem splits into one small MILP per region (held
    instances elsewhere are then removed, a constant churn cost). Regions are visited in
    the order of their LP bounds (one block LP), and the search stops when the next bound
    cannot beat the best fleet found by more than :data:`REGION_GAP`: with each MILP within
    :data:`MIP_GAP` of its own optimum, within 0.5% of the optimum, and far faster than
    region binaries with big-M links. A re-solve for the ring term (see
    :func:`provisioner.plan.solve.solve`) stays in the region found first.
    """
    regions: dict[str, list[Candidate]] = defaultdict(list)
    for c in cands:
        regions[c.offering.region].append(c)
    if p.max_regions != 1 or len(regions) == 1:
        return _solve_one(build_model(p, cands, n_guess, gbps), limit)
    cur = current_fleet(cands)
    remove = _removal(p, cur)
    deadline = time.perf_counter() + limit
    if p.target_samples_per_s and p.objective != "max-throughput":
        try:  # a target no fleet can reach: the caller reports the infeasible row
            _raw_target(p.target_samples_per_s, _t_comm(n_guess, p, gbps), p, "target")
        except InfeasibleError:
            return None

    models = {r: build_model(p, m, n_guess, gbps, current=cur) for r, m in regions.items()}
    held_total = sum(c.current for c in cands)  # held elsewhere than r: removed, a constant
    outside = {r: (held_total - sum(c.current for c in m)) * remove for r, m in regions.items()}
    bounds = block_lp_bounds(models, limit)
    order = sorted((b + outside[r], r) for r, b in bounds.items() if b is not None)
    best: tuple[float, tuple[Model, np.ndarray, str]] | None = None
    timed_out = False
    for bound, region in order:
        if best is not None and bound >= best[0] - REGION_GAP * max(1.0, abs(best[0])):
            break
        left = deadline - time.perf_counter()
        if left <= 0 and best is not None:
            timed_out = True
            break
        cutoff = (None if best is None else
                  best[0] - REGION_GAP * max(1.0, abs(best[0])) - outside[region])
        found = _solve_one(models[region], max(left, 0.05), cutoff)
        if found is None:
            continue
        model, x, status = found
        value = float(model.c @ x) + outside[region]
        if best is None or value < best[0] - 1e-9 * max(1.0, abs(value)):
            best = (value, found)
    if best is None:
        return None
    model, x, status = best[1]
    return model, x, ("time-limit" if timed_out and status == "optimal" else status)


def block_lp_bounds(models: Mapping[str, Model], limit: float) -> dict[str, float | None]:
    """LP relaxation bound of every region's MILP in ONE LP call.

    The regions' models are independent blocks, so minimising their sum minimises each;
    a penalised slack on every lower-bounded row keeps an infeasible block from making the
    whole LP infeasible (a block that needs its slack gets bound None: infeasible).
    """
    cs, lbs, ubs, rows = [], [], [], []
    off = 0
    big = 1e6 * (1.0 + max((float(np.abs(m.c).max()) for m in models.values()), default=1.0))
    keys = list(models)
    spans = {}
    for r in keys:
        m = models[r]
        nv = len(m.c)
        spans[r] = (off, off + nv)
        cs.append(m.c)
        lbs.append(m.lb)
        ubs.append(m.solver_ub)
        for name, co, lo, hi in m.rows:
            shifted = {j + off: w for j, w in co.items()}
            rows.append((name, shifted, lo, hi, r if lo > 0 else None))
        off += nv
    slack_cols = []
    for k, (_, co, lo, hi, r) in enumerate(rows):
        if r is not None:
            co[off] = max(lo, 1.0)
            slack_cols.append((off, r))
            off += 1
    c = np.concatenate(cs + [np.full(len(slack_cols), big)])
    lb = np.concatenate(lbs + [np.zeros(len(slack_cols))])
    ub = np.concatenate(ubs + [np.full(len(slack_cols), 1.0)])
    block = Model([], c, np.zeros(len(c)), lb, ub, [r[:4] for r in rows], 0)
    res = run_highs(block, limit, relax=True)
    if res.x is None:
        return {r: 0.0 for r in keys}  # no bound: solve every region
    needs = {r for j, r in slack_cols if res.x[j] > 1e-7}
    return {r: (None if r in needs else float(c[a:b] @ res.x[a:b])) for r, (a, b) in spans.items()}
