"""The offline lower bound of the simulator: least cost to do the work, knowing the trace.

Design: one linear program over the whole trace, cut where any price or availability
changes, with the simulator's own speeds, prices and ring model (integer ring sizes) and
spotring's constraints (``max_size``, ``max_zone_share``); it pays the boots of the fewest
launches its fleet needs, including, in expectation, those that replace the instances the
trace's removals and drawn lifetimes revoke (the revocations spotring suffers), and no
restart or lost step. See :func:`hindsight` for why it bounds every policy the simulator can
run (their expected cost, where revocations are drawn).

Rule: a bound not solved to optimality is not reported as a cost (its status says so).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from provisioner.plan.model import ring_rate
from provisioner.sim.result import Result
from provisioner.sim.policies import Params
from provisioner.sim.world import World


def _credit(world: World, params: Params, itype: str) -> list[float]:
    """Samples/s the bound credits ``n`` instances of ``itype`` with, ``n`` = 0..max_size:
    the simulator's ring of its own on the fastest link."""
    return [0.0] + [ring_rate(n, world.speed[itype], params.model_mb, params.global_batch,
                              params.links[0]) for n in range(1, max(1, int(params.max_size)) + 1)]


def od_ring_rate(world: World, params: Params) -> float:
    """Samples/s the bound credits the fastest on-demand fleet of ``max_size`` instances
    (the ``fallback`` rate of :func:`hindsight`): the best split of the instances over the
    on-demand types, each type a ring of its own on the fastest link, as the bound credits
    them (at least any real ring's rate)."""
    n_max = max(1, int(params.max_size))
    best = [0.0] * (n_max + 1)  # best[n]: the most credited with n instances
    for itype in sorted({o.instance_type for o in world.offerings
                         if o.market == "on-demand" and o.instance_type in world.speed}):
        f = _credit(world, params, itype)
        best = [max(best[n - k] + f[k] for k in range(n + 1)) for n in range(n_max + 1)]
    return best[n_max]


def hindsight(world: World, params: Params, *, work: float, horizon_h: float,
              time_limit_s: float = 60.0, boots: bool = True,
              removals: bool = True, fallback: tuple[float, float] | None = None,
              free_boots: int = 0) -> Result:
    """The offline lower bound: least cost to do ``work`` within ``horizon_h`` knowing the trace.

    A program over the whole trace, solved to optimality (status ``optimal``). Time is cut
    into segments at every change of any price or availability (so within a segment every
    price and cap is constant, however long the segment: few variables, no slot grid that
    would hide capacity present for part of a slot). Per segment ``s`` of ``L`` hours:

    - ``y[o,s]`` instance-hours of offering ``o``: ``0 <= y <= cap(o,s) L``, and
      ``sum_o y[o,s] <= max_size L``; cost ``sum price(o,s) y[o,s]``.
    - ``d[T,j,s]`` hours during which at least ``j`` instances of type ``T`` run
      (``0 <= d <= L``, ``sum_j d[T,j,s] <= sum_{o of T} y[o,s]``), credited with the
      ``j``-th instance's marginal ring throughput ``f_T(j) - f_T(j-1)``, where
      ``f_T(n) = n s_T ring_efficiency(n, n s_T, ..., 10 Gb/s)`` is the simulator's own ring
      model for ``n`` instances of ``T`` (same speeds, same function, the fastest link).
      ``sum credited >= work``.
    - spotring's zone share (``max_zone_share < 1``): ``sum_{spot o in zone z} y[o,s] <=
      share sum_o y[o,s] + allowance L`` (the planner's row, integrated over the segment).
    - with ``boots``, ``u[o,s] >= y[o,s]/L_s - (1 - q[o,s]) y[o,s-1]/L_{s-1}`` (and
      ``u >= 0``): instances started, each paying its boot at the offering's lowest price of
      the two segments; ``q[o,s]`` is the share of a group's instances the removal at the
      cut revokes (``k`` of ``n``: each held one is hit with probability ``k/n``; 0 without
      ``removals`` or a removal there), so holding on through a removal pays the expected
      relaunches.
    - with ``boots`` and ``removals``, for an offering whose instances die at a drawn hazard
      ``h`` (no availability series): ``e[o] >= h sum_s y[o,s] - sum_s u[o,s]`` (``e >= 0``),
      at the offering's lowest price times the boot: every instance revoked was launched, so
      a run's launches are at least its expected revocations ``h x instance-hours``.
    - with ``boots`` and ``free_boots``, up to that many instances (of offerings the program
      chooses, ``f[o] >= 0``, ``sum_o f[o] <= free_boots``) are running already at the start:
      the first segment's row is ``u[o,0] + f[o] >= y[o,0]/L_0``. This bounds the rest of a
      run from an hour on (``benchmarks/online_gap.py``), where a policy already holds at
      most ``max_size`` booted instances: any fleet it holds is one choice of ``f``.

    Why this bounds every policy the simulator can run: any schedule has, within a segment,
    integer counts ``n_T(t)`` held; setting ``d[T,j] = |{t: n_T(t) >= j}|`` and ``y`` to
    its instance-hours is feasible, costs the same, and credits ``sum_T f_T(n_T(t))``, which is
    at least the ring's real rate ``S / (1 + S t(N) / B)`` (each type's share of it is at most
    what that type's instances would deliver in a ring of their own on the fastest link, since
    ``S >= n_T s_T`` and ``t(N) >= t(n_T)``). The count's average over a segment rises from
    one segment to the next by no more than the instances started over the two (averaging
    never adds variation), so the ``u`` are at most the schedule's launches, each of which
    pays a boot in the simulator; in expectation, a removal revokes ``k/n`` of what is held at
    it (a linear term; so the bound is on a policy's expected cost where revocations are
    drawn), and launches are at least the revocations. Restarts and the step a revocation
    loses are free. Integer instance
    counts enter exactly through the integer ring sizes ``j``; instance-hours themselves need
    no integrality in continuous time (a fractional share of a segment is an integer count
    held for part of it), so the program is a linear one and HiGHS proves its optimum.
    ``time_limit_s`` bounds the solve; if it is hit the dual bound is not reported as a
    cost (status says so).

    ``fallback`` ``(rate, margin_h)`` bounds the policies that keep the deadline safe were
    spot to vanish: at every cut ``t`` the work credited by ``t`` is at least ``work - rate x
    (horizon - t - margin_h)``, where ``rate`` (samples/s) is at least the fastest ring the
    on-demand market allows. A policy cannot tell the trace from the same trace whose spot
    is gone from ``t`` on, and in that world it can do no more than ``rate`` after ``t``;
    so with ``margin_h = 0`` this bounds every policy that does not see the future and meets
    the deadline in every such world. With a margin it bounds the policies that keep that
    much slack. The rows are kept at the cuts, ``horizon - margin_h`` among them (where the
    right side's kink is): between two cuts both sides are linear in time, so that suffices.
    """
    if fallback is not None and work > fallback[0] * 3600.0 * max(horizon_h - fallback[1], 0.0):
        return Result("hindsight", math.inf, 0.0, work, None, None,
                      status=f"infeasible within {horizon_h:.1f} h on the fallback")
    offs = [o for o in world.offerings if o.instance_type in world.speed]
    end = min(world.end, world.start + horizon_h * 3600.0)
    cuts = {world.start, end}
    for o in offs:
        for st in (world.price[o], world.avail.get(o)):
            if st is not None:
                cuts.update(float(x) for x in st.t if world.start < x < end)
    kink = None if fallback is None else world.start + (horizon_h - fallback[1]) * 3600.0
    if kink is not None and world.start < kink < end:
        cuts.add(kink)  # the fallback rows' kink: from it on they ask for the whole work
    edges = sorted(cuts)
    segs = list(zip(edges[:-1], edges[1:]))
    types = sorted({o.instance_type for o in offs})
    jmax = max(1, int(params.max_size))
    gains: dict[str, np.ndarray] = {}
    for itype in types:  # samples per hour of the j-th instance
        gains[itype] = np.diff(_credit(world, params, itype)) * 3600.0
    n_o, n_t, n_s = len(offs), len(types), len(segs)
    n_u = n_o if boots and params.boot_s > 0 else 0
    per_seg = n_o + n_t * jmax + n_u
    n_seg_vars = per_seg * n_s  # the per-segment columns; the drawn-revocation ones follow
    nv = n_seg_vars
    c = np.zeros(nv)
    ub = np.full(nv, np.inf)
    wk = np.zeros(nv)
    lb = np.zeros(nv)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo_b: list[float] = []
    hi_b: list[float] = []
    t_index = {t: i for i, t in enumerate(types)}
    zones: dict[tuple[str, str, str], list[int]] = {}
    for a, o in enumerate(offs):
        if o.market == "spot":
            zones.setdefault((o.cloud, o.region, o.zone), []).append(a)
    share = params.max_zone_share if params.max_zone_share < 1.0 and len(zones) > 1 else None
    boot_h = params.boot_s / 3600.0
    r = 0

    def removed(o, t: float) -> float:
        """The share of the instances held that the removal at ``t`` revokes, expected."""
        rc = world.reclaims.get(o) if removals and o.market == "spot" else None
        hit = rc.at(t) if rc is not None else None
        return min(1.0, hit[0] / hit[1]) if hit is not None and hit[1] > 0 else 0.0

    def row(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        nonlocal r
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo_b.append(lo)
        hi_b.append(hi)
        r += 1

    def columns(n: int) -> int:
        """``n`` more columns (cost 0, no work, in [0, inf)); the index of the first."""
        nonlocal nv, c, ub, wk, lb
        first, nv = nv, nv + n
        c = np.concatenate([c, np.zeros(n)])
        ub = np.concatenate([ub, np.full(n, np.inf)])
        wk = np.concatenate([wk, np.zeros(n)])
        lb = np.concatenate([lb, np.zeros(n)])
        return first

    for k, (t0, t1) in enumerate(segs):
        hours = (t1 - t0) / 3600.0
        base = k * per_seg
        for a, o in enumerate(offs):
            j = base + a
            c[j] = world.price[o].at(t0)
            st = world.avail.get(o)
            cap = params.max_size if st is None else min(params.max_size, st.at(t0))
            ub[j] = max(cap, 0) * hours
        row([(base + a, 1.0) for a in range(n_o)], -np.inf, params.max_size * hours)
        for ti, itype in enumerate(types):
            dj = base + n_o + ti * jmax
            ub[dj:dj + jmax] = hours
            wk[dj:dj + jmax] = gains[itype]
            row([(base + a, -1.0) for a, o in enumerate(offs) if t_index[o.instance_type] == ti]
                + [(dj + m, 1.0) for m in range(jmax)], -np.inf, 0.0)
        if share is not None:
            for members in zones.values():
                inside = set(members)
                row([(base + a, (1.0 if a in inside else 0.0) - share) for a in range(n_o)],
                    -np.inf, 1.0 * hours)  # zone_allowance 1, as the planner's Problem
        if n_u:
            ub0 = base + n_o + n_t * jmax
            prev = (k - 1) * per_seg if k else None
            if not k:
                first_rows = list(range(r, r + n_o))  # the rows the free boots enter
            prev_h = (segs[k - 1][1] - segs[k - 1][0]) / 3600.0 if k else 1.0
            for a, o in enumerate(offs):
                p_lo = c[base + a] if prev is None else min(c[base + a], c[prev + a])
                c[ub0 + a] = p_lo * boot_h
                entries = [(ub0 + a, 1.0), (base + a, -1.0 / hours)]
                if prev is not None:
                    entries.append((prev + a, (1.0 - removed(o, t0)) / prev_h))
                row(entries, 0.0, np.inf)  # u >= y_s / L_s - y_{s-1} / L_{s-1}
    drawn = [a for a, o in enumerate(offs) if removals and n_u and o.market == "spot"
             and world.avail.get(o) is None and world.hazard.get(o, 0.0) > 0]
    if drawn:  # e[o] >= hazard x instance-hours - sum_s u[o,s]: the launches that replace
        # the expected revocations of drawn lifetimes beyond those the u already count
        # (every revoked instance was launched: launches >= revocations), at the lowest price
        e0 = columns(len(drawn))
        for m, a in enumerate(drawn):
            o = offs[a]
            c[e0 + m] = min(world.price[o].at(t0) for t0, _ in segs) * boot_h
            hz = world.hazard[o]
            entries = [(e0 + m, 1.0)]
            for k in range(n_s):
                entries += [(k * per_seg + a, -hz),
                            (k * per_seg + n_o + n_t * jmax + a, 1.0)]
            row(entries, 0.0, np.inf)
    if fallback is not None:  # z_k, the work credited by cut k: z_k >= work - rate (horizon
        # - t_k - margin), chained z_k = z_{k-1} + the work of segment k
        fb_rate, fb_margin = fallback
        z0 = columns(n_s)
        for k, (_, t1) in enumerate(segs):
            base = k * per_seg
            entries = [(z0 + k, 1.0)] + [(base + j, -float(wk[base + j]))
                                         for j in range(per_seg) if wk[base + j] > 0]
            if k:
                entries.append((z0 + k - 1, -1.0))
            row(entries, 0.0, 0.0)
            left_h = horizon_h - (t1 - world.start) / 3600.0 - fb_margin
            lb[z0 + k] = max(work - fb_rate * 3600.0 * max(left_h, 0.0), 0.0)
    if n_u and free_boots > 0:  # f[o]: instances of o running already at the start
        f0 = columns(n_o)
        for a, fr in enumerate(first_rows):
            rows.append(fr)
            cols.append(f0 + a)
            vals.append(1.0)
        row([(f0 + a, 1.0) for a in range(n_o)], -np.inf, float(free_boots))
    a_mat = coo_matrix((vals, (rows, cols)), shape=(r, nv)).tocsr()
    cons = [LinearConstraint(a_mat, lo_b, hi_b), LinearConstraint(wk.reshape(1, -1), work, np.inf)]
    res = milp(c, constraints=cons, integrality=np.zeros(nv), bounds=Bounds(lb, ub),
               options={"time_limit": time_limit_s, "disp": False})
    if res.x is None or res.status != 0:
        status = ("infeasible" if res.status == 2 else f"not solved ({res.message})")
        return Result("hindsight", math.inf, 0.0, work, None, None,
                      status=f"{status} within {horizon_h:.1f} h")
    x = res.x[:n_seg_vars].reshape(n_s, per_seg)
    w_seg = (x * wk[:n_seg_vars].reshape(n_s, per_seg)).sum(axis=1)
    c_seg = (x * c[:n_seg_vars].reshape(n_s, per_seg)).sum(axis=1)
    e_x = res.x[n_seg_vars:n_seg_vars + len(drawn)]
    spread = float(e_x @ c[n_seg_vars:n_seg_vars + len(drawn)])  # drawn revocations' boots
    if spread > 0:  # spread over the segments in proportion to their instance-hours
        hours_seg = x[:, :n_o].sum(axis=1)
        c_seg = c_seg + spread * hours_seg / max(float(hours_seg.sum()), 1e-12)
    fleet = [float(x[k, :n_o].sum() * 3600.0 / (b - a)) for k, (a, b) in enumerate(segs)]
    rate = [float(w_seg[k] / (b - a)) for k, (a, b) in enumerate(segs)]
    cum_w = np.cumsum(w_seg)
    fin = min(int(np.searchsorted(cum_w, work * (1 - 1e-9))), n_s - 1)
    a0, b0 = segs[fin]
    before = cum_w[fin - 1] if fin > 0 else 0.0
    share_done = (work - before) / w_seg[fin] if w_seg[fin] > 0 else 1.0
    completion = (a0 + min(max(share_done, 0.0), 1.0) * (b0 - a0) - world.start) / 3600
    xs = [(a - world.start) / 3600 for a, _ in segs] + [(end - world.start) / 3600]
    fleet.append(0.0)  # the series end where the bound's horizon does
    rate.append(0.0)
    launched = int(round(float(x[:, n_o + n_t * jmax:].sum())
                         + e_x.sum())) if n_u else 0
    lengths = np.array([(b - a) / 3600.0 for a, b in segs])
    by = {o: (xs, [float(v) for v in x[:, a] / lengths] + [0.0])
          for a, o in enumerate(offs) if x[:, a].sum() > 1e-9}
    return Result("hindsight", float(c_seg.sum()), work, work, completion, None, 0, 0.0,
                  launched, "optimal", (xs, fleet, rate, [0.0] + list(np.cumsum(c_seg))),
                  fleet_by=by)
