"""The offline lower bound of the simulator: least cost to do the work, knowing the trace.

Design: one linear program over the whole trace, cut where any price or availability
changes, with the simulator's own speeds, prices and ring model (integer ring sizes); it
pays no boot, restart or revocation loss. See :func:`hindsight` for why it bounds every
policy the simulator can run.

Rule: a bound not solved to optimality is not reported as a cost (its status says so).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from provisioner.plan.model import ring_efficiency
from provisioner.sim.engine import Result
from provisioner.sim.policies import Params
from provisioner.sim.world import World


def hindsight(world: World, params: Params, *, work: float, horizon_h: float,
              time_limit_s: float = 60.0) -> Result:
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

    Why this bounds every policy the simulator can run: any schedule has, within a segment,
    integer counts ``n_T(t)`` held; setting ``d[T,j] = |{t: n_T(t) >= j}|`` and ``y`` to
    its instance-hours is feasible, costs the same, and credits ``sum_T f_T(n_T(t))``, which is
    at least the ring's real rate ``S / (1 + S t(N) / B)`` (each type's share of it is at most
    what that type's instances would deliver in a ring of their own on the fastest link, since
    ``S >= n_T s_T`` and ``t(N) >= t(n_T)``). Boots, restarts and revocation loss are free.
    Integer instance counts enter exactly through the integer ring sizes ``j``; instance-hours
    themselves need no integrality in continuous time (a fractional share of a segment is an
    integer count held for part of it), so the program is a linear one and HiGHS proves its
    optimum. ``time_limit_s`` bounds the solve; if it is hit the dual bound is not reported
    as a cost (status says so).
    """
    offs = [o for o in world.offerings if o.instance_type in world.speed]
    end = min(world.end, world.start + horizon_h * 3600.0)
    cuts = {world.start, end}
    for o in offs:
        for st in (world.price[o], world.avail.get(o)):
            if st is not None:
                cuts.update(float(x) for x in st.t if world.start < x < end)
    edges = sorted(cuts)
    segs = list(zip(edges[:-1], edges[1:]))
    types = sorted({o.instance_type for o in offs})
    jmax = max(1, int(params.max_size))
    gains: dict[str, np.ndarray] = {}
    for itype in types:
        s = world.speed[itype]
        f = [0.0] + [n * s * ring_efficiency(n, n * s, params.model_mb, params.global_batch, 10.0)
                     for n in range(1, jmax + 1)]
        gains[itype] = np.diff(f) * 3600.0  # samples per hour of the j-th instance
    n_o, n_t, n_s = len(offs), len(types), len(segs)
    per_seg = n_o + n_t * jmax
    nv = per_seg * n_s
    c = np.zeros(nv)
    ub = np.zeros(nv)
    wk = np.zeros(nv)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo_b: list[float] = []
    hi_b: list[float] = []
    t_index = {t: i for i, t in enumerate(types)}
    r = 0
    for k, (t0, t1) in enumerate(segs):
        hours = (t1 - t0) / 3600.0
        base = k * per_seg
        for a, o in enumerate(offs):
            j = base + a
            c[j] = world.price[o].at(t0)
            st = world.avail.get(o)
            cap = params.max_size if st is None else min(params.max_size, st.at(t0))
            ub[j] = max(cap, 0) * hours
            rows.append(r)  # fleet size cap
            cols.append(j)
            vals.append(1.0)
        lo_b.append(-np.inf)
        hi_b.append(params.max_size * hours)
        r += 1
        for ti, itype in enumerate(types):
            dj = base + n_o + ti * jmax
            ub[dj:dj + jmax] = hours
            wk[dj:dj + jmax] = gains[itype]
            for a, o in enumerate(offs):  # credited ring-hours <= instance-hours of the type
                if t_index[o.instance_type] == ti:
                    rows.append(r)
                    cols.append(base + a)
                    vals.append(-1.0)
            for m in range(jmax):
                rows.append(r)
                cols.append(dj + m)
                vals.append(1.0)
            lo_b.append(-np.inf)
            hi_b.append(0.0)
            r += 1
    a_mat = coo_matrix((vals, (rows, cols)), shape=(r, nv)).tocsr()
    cons = [LinearConstraint(a_mat, lo_b, hi_b), LinearConstraint(wk.reshape(1, -1), work, np.inf)]
    res = milp(c, constraints=cons, integrality=np.zeros(nv), bounds=Bounds(0, ub),
               options={"time_limit": time_limit_s, "disp": False})
    if res.x is None or res.status != 0:
        status = ("infeasible" if res.status == 2 else f"not solved ({res.message})")
        return Result("hindsight", math.inf, 0.0, work, None, None,
                      status=f"{status} within {horizon_h:.1f} h")
    x = res.x.reshape(n_s, per_seg)
    w_seg = (x * wk.reshape(n_s, per_seg)).sum(axis=1)
    c_seg = (x * c.reshape(n_s, per_seg)).sum(axis=1)
    fleet = [float(x[k, :n_o].sum() * 3600.0 / (b - a)) for k, (a, b) in enumerate(segs)]
    rate = [float(w_seg[k] / (b - a)) for k, (a, b) in enumerate(segs)]
    cum_w = np.cumsum(w_seg)
    fin = min(int(np.searchsorted(cum_w, work * (1 - 1e-9))), n_s - 1)
    a0, b0 = segs[fin]
    before = cum_w[fin - 1] if fin > 0 else 0.0
    share = (work - before) / w_seg[fin] if w_seg[fin] > 0 else 1.0
    completion = (a0 + min(max(share, 0.0), 1.0) * (b0 - a0) - world.start) / 3600
    xs = [(a - world.start) / 3600 for a, _ in segs]
    return Result("hindsight", float(c_seg.sum()), work, work, completion, None, 0, 0.0, 0,
                  "optimal", (xs, fleet, rate, list(np.cumsum(c_seg))))
