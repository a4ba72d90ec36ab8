"""The simulator: replays real price and availability traces against provisioning policies.

Design: a discrete-event loop on a virtual clock (it never sleeps). Between two events the
fleet, and so the training rate, is constant; events are decision ticks, policy wake-ups,
boots finishing, re-forms and restarts ending, revocations (availability falling below what
is held, or a drawn lifetime ending) and the end of the trace. Money is exact: an instance
costs the integral of its offering's price step function from launch to termination
(:meth:`provisioner.simworld.Step.between`), i.e. instance-seconds x price at that time.

Two execution models:
- ``hot`` (spotring): every ready instance contributes; a join or a drain stalls the ring for
  ``reform_s``; a revocation without notice loses the unfinished step (``step_s`` of the
  ring's work) and stalls it ``reform_s``.
- ``restart`` (the baselines): the job runs only when every instance held is ready, then
  after ``restart_s``; it checkpoints every ``checkpoint_s``; a revocation rolls the work
  back to the last checkpoint; a planned change checkpoints first (nothing lost).

The ring's throughput is ``S / (1 + S t_comm / B)`` (see :mod:`provisioner.optimizer`).
:func:`hindsight` is the offline bound: a MILP over (offering, time slot) counts that knows
the whole trace and pays no boot, restart or revocation loss.

Rule for callers: build the world with :func:`provisioner.simworld.build_world`; pass
``seed`` to make drawn revocations repeatable.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from pricing.model import Offering
from provisioner.optimizer import ring_efficiency
from provisioner.policies import POLICIES, Params, View, online_hazards
from provisioner.simworld import World

log = logging.getLogger(__name__)


@dataclass
class Result:
    """One policy's run. ``series`` holds (hours, fleet size, samples/s, cumulative USD)."""

    policy: str
    cost: float
    done: float
    work: float
    completion_h: float | None
    deadline_h: float | None
    revocations: int = 0
    work_lost: float = 0.0
    launches: int = 0
    status: str = "ok"
    series: tuple[list, list, list, list] = field(default_factory=lambda: ([], [], [], []))

    @property
    def cost_per_m(self) -> float:
        return self.cost / self.done * 1e6 if self.done > 0 else math.inf

    @property
    def deadline_met(self) -> bool | None:
        if self.deadline_h is None:
            return None
        return self.completion_h is not None and self.completion_h <= self.deadline_h + 1e-9

    def figures(self) -> dict:
        """Plain Python numbers (JSON-able), rounded for reading."""
        met = self.deadline_met
        return {"total_cost_usd": round(float(self.cost), 4),
                "completion_hours": (None if self.completion_h is None
                                     else round(float(self.completion_h), 4)),
                "cost_per_1m_samples_usd": (round(float(self.cost_per_m), 6) if self.done > 0
                                            else None),
                "deadline_met": None if met is None else bool(met),
                "revocations": int(self.revocations),
                "work_lost_samples": round(float(self.work_lost), 1),
                "work_done_samples": round(float(self.done), 1),
                "launches": int(self.launches), "status": self.status}


@dataclass
class _Inst:
    o: Offering
    launched: float
    ready: float
    dies: float = math.inf


def _rate(world: World, p: Params, insts: Sequence[_Inst], t: float) -> float:
    ready = [i for i in insts if i.ready <= t]
    s = sum(world.speed[i.o.instance_type] for i in ready)
    link = p_link(ready, p)
    return s * ring_efficiency(len(ready), s, p.model_mb, p.global_batch, link)


def p_link(insts: Sequence[_Inst], p: Params) -> float:
    """Bandwidth of the slowest link of a ring (same defaults as fleet settings)."""
    if len({i.o.region for i in insts}) > 1:
        return 1.0
    if len({i.o.zone for i in insts}) > 1:
        return 5.0
    return 10.0


def simulate_policy(world: World, name: str, params: Params, *, work: float,
                    deadline_h: float | None = None, tick_s: float = 600.0, seed: int = 0,
                    default_hazard: float = 0.1) -> Result:
    """Replay one policy over ``world`` until ``work`` samples are done or the trace ends."""
    policy = POLICIES[name](params)
    hot = policy.mode == "hot"
    rng = random.Random(seed)
    deadline_s = None if deadline_h is None else deadline_h * 3600.0
    t = world.start
    done = 0.0
    insts: list[_Inst] = []
    closed = 0.0
    failed: dict[Offering, float] = {}
    revocations = launches = 0
    lost = 0.0
    stall_until = t
    run_start: float | None = None
    run_work = run_rate = 0.0
    next_tick, wake = t + tick_s, None
    need, revoked_flag = True, False
    fail_wake: float | None = None  # a launch failed: decide again (as after a revocation)
    hazards: dict[Offering, float] = dict(world.hazard)
    hz_at = -math.inf
    xs, fleet, rates, costs = [], [], [], []
    spot = [o for o in world.price if o.market == "spot"]

    def cost_now(at: float) -> float:
        return closed + sum(world.cost(i.o, i.launched, at) for i in insts)

    def terminate(i: _Inst, at: float) -> None:
        nonlocal closed
        closed += world.cost(i.o, i.launched, at)
        insts.remove(i)

    def held() -> dict[Offering, int]:
        h: dict[Offering, int] = {}
        for i in insts:
            h[i.o] = h.get(i.o, 0) + 1
        return h

    def decide(revoked: bool) -> None:
        nonlocal wake, launches, stall_until, hz_at, hazards, done, fail_wake
        if hot and world.lifetimes and t - hz_at >= 3600.0:
            hazards = online_hazards(world.lifetimes, spot, t, default_hazard)
            hz_at = t
        prices = {o: s.at(t) for o, s in world.price.items()}
        view = View(t, world.start, work, done, deadline_s, prices, held(), dict(failed),
                    world.speed, run_start is not None, hazards, revoked)
        d = policy.decide(view)
        wake = d.wake_at
        changed = False
        have = held()
        short = 0  # launches that found no capacity: keep as many held ones (make before break)
        for o in sorted(set(d.target) - set(have) | {o for o in have if d.target.get(o, 0) > have[o]}):
            want, now_n = int(d.target.get(o, 0)), have.get(o, 0)
            room = max(0, world.available(o, t) - now_n)
            k = min(want - now_n, room)
            if k < want - now_n:
                failed[o] = t
                fail_wake = t + (params.retry_s if hot else params.backoff_s)
                short += want - now_n - k
            for _ in range(k):
                h = hazards.get(o, 0.0) if world.avail.get(o) is None else 0.0
                dies = t + rng.expovariate(h) * 3600.0 if (h > 0 and o.market == "spot"
                                                            and o in world.hazard) else math.inf
                insts.append(_Inst(o, t, t + params.boot_s, dies))
            launches += k
            changed = changed or k > 0
        drop: list[_Inst] = []
        for o in sorted(have):
            want, now_n = int(d.target.get(o, 0)), have[o]
            if want < now_n:
                mine = sorted((i for i in insts if i.o == o), key=lambda i: -i.launched)
                drop += mine[:now_n - want]
        if hot and short:  # keep the cheapest of those planned to go, one per missing launch
            drop.sort(key=lambda i: world.price[i.o].at(t))
            drop = drop[short:]
        for i in drop:
            terminate(i, t)
            changed = True
        if changed:
            if hot:
                stall_until = max(stall_until, t + params.reform_s) if any(
                    i.ready <= t for i in insts) else stall_until
            else:
                stall_until = max([t] + [i.ready for i in insts]) + params.restart_s
        if have and not insts and not hot:
            pass

    while True:
        if need:
            decide(revoked_flag)
            need = revoked_flag = False
        r = 0.0 if t < stall_until else _rate(world, params, insts, t)
        if not hot:
            if not insts or any(i.ready > t for i in insts):
                r = 0.0
            if r > 0 and run_start is None:
                run_start, run_work, run_rate = t, done, r
            elif r == 0:
                run_start = None
        xs.append((t - world.start) / 3600)
        fleet.append(len(insts))
        rates.append(r)
        costs.append(cost_now(t))
        cands = [next_tick if next_tick > t else t + params.backoff_s, world.end]
        if wake is not None and wake > t:
            cands.append(wake)
        if fail_wake is not None and fail_wake > t:
            cands.append(fail_wake)
        cands += [i.ready for i in insts if i.ready > t]
        cands += [i.dies for i in insts if i.dies > t]
        if stall_until > t:
            cands.append(stall_until)
        h = held()
        for o, n in h.items():
            s = world.avail.get(o)
            if s is not None:
                nb = s.next_below(t, n)
                if nb is not None:
                    cands.append(nb)
        t_next = min(cands)
        if r > 0 and t + (work - done) / r <= t_next:
            t = t + (work - done) / r
            done = work
            xs.append((t - world.start) / 3600)
            fleet.append(len(insts))
            rates.append(r)
            costs.append(cost_now(t))
            break
        done += r * (t_next - t)
        prev, t = t, t_next
        if t >= world.end:
            break
        # revocations
        gone: list[_Inst] = [i for i in insts if i.dies <= t]
        for o, n in held().items():
            s = world.avail.get(o)
            if s is not None and s.at(t) < n:
                mine = sorted((i for i in insts if i.o == o and i not in gone),
                              key=lambda i: i.launched)
                gone += mine[:n - int(s.at(t))]
        if gone:
            was_running = r > 0
            for i in gone:
                failed[i.o] = t
                terminate(i, t)
            revocations += len(gone)
            if hot:
                if was_running:
                    loss = min(done, r * params.step_s)
                    done -= loss
                    lost += loss
                stall_until = max(stall_until, t + params.reform_s)
            else:
                if run_start is not None:
                    n_ck = math.floor((t - run_start) / params.checkpoint_s)
                    committed = run_work + run_rate * n_ck * params.checkpoint_s
                    lost += max(0.0, done - committed)
                    done = min(done, committed)
                run_start = None
                stall_until = max([t] + [i.ready for i in insts]) + params.restart_s
            need = revoked_flag = True
        if hot and any(prev < i.ready <= t for i in insts):
            stall_until = max(stall_until, t + params.reform_s)
        if t >= next_tick:
            need = True
            while next_tick <= t:
                next_tick += tick_s
        if wake is not None and t >= wake:
            need, wake = True, None
        if fail_wake is not None and t >= fail_wake:
            need = revoked_flag = True
            fail_wake = None
    for i in list(insts):
        terminate(i, t)
    completion = (t - world.start) / 3600 if done >= work else None
    status = "ok" if completion is not None else "not finished by the end of the trace"
    return Result(name, closed, done, work, completion, deadline_h, revocations, lost, launches,
                  status, (xs, fleet, rates, costs))


def hindsight(world: World, params: Params, *, work: float, horizon_h: float,
              slot_s: float = 600.0, time_limit_s: float = 20.0) -> Result:
    """The offline lower bound: least cost to do ``work`` within ``horizon_h`` knowing the trace.

    Counts per (offering, slot) are integers capped by the lowest availability in the slot
    and ``params.max_size`` in all; no boot, restart or revocation loss; the ring efficiency
    of each type is that of the ring of that type delivering the job's nominal rate. If the
    MILP is not proven optimal in ``time_limit_s`` its LP relaxation (a lower bound still)
    is reported, with status ``lp-bound``.
    """
    offs = [o for o in world.offerings if o.instance_type in world.speed]
    end = min(world.end, world.start + horizon_h * 3600.0)
    edges = list(np.arange(world.start, end, slot_s)) + [end]
    slots = list(zip(edges[:-1], edges[1:]))
    nominal = params.size * world.speed[params.itype]

    def eff_of(o: Offering) -> float:
        """Efficiency of the ring of type ``o`` that delivers the job's nominal rate."""
        n = max(1, math.ceil(nominal / world.speed[o.instance_type] - 1e-9))
        return ring_efficiency(n, n * world.speed[o.instance_type], params.model_mb,
                               params.global_batch, 10.0)
    n_o, n_s = len(offs), len(slots)
    c = np.zeros(n_o * n_s)
    ub = np.zeros(n_o * n_s)
    w = np.zeros(n_o * n_s)
    for a, o in enumerate(offs):
        st = world.avail.get(o)
        for k, (t0, t1) in enumerate(slots):
            j = a * n_s + k
            c[j] = world.cost(o, t0, t1)
            ub[j] = params.max_size if st is None else min(params.max_size, st.min_over(t0, t1))
            w[j] = world.speed[o.instance_type] * eff_of(o) * (t1 - t0)
    rows, cols = [], []
    for a in range(n_o):
        for k in range(n_s):
            rows.append(k)
            cols.append(a * n_s + k)
    size = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_s, n_o * n_s))
    cons = [LinearConstraint(size, 0, params.max_size),
            LinearConstraint(w.reshape(1, -1), work, np.inf)]
    res = milp(c, constraints=cons, integrality=np.ones_like(c), bounds=Bounds(0, ub),
               options={"time_limit": time_limit_s, "disp": False})
    status = "optimal"
    if res.x is None or res.status != 0:  # not proven optimal: the LP relaxation still bounds
        res = milp(c, constraints=cons, integrality=np.zeros_like(c), bounds=Bounds(0, ub))
        status = "lp-bound"
    if res.x is None:
        return Result("hindsight", math.inf, 0.0, work, None, None,
                      status=f"infeasible within {horizon_h:.1f} h")
    x = res.x.reshape(n_o, n_s)
    per_slot = x.sum(axis=0)
    cum_w = np.cumsum((w.reshape(n_o, n_s) * x).sum(axis=0))
    fin = int(np.searchsorted(cum_w, work - 1e-6))
    completion = (slots[min(fin, n_s - 1)][1] - world.start) / 3600
    xs = [(a - world.start) / 3600 for a, _ in slots]
    rate = [(w.reshape(n_o, n_s)[:, k] * x[:, k]).sum() / (b - a) for k, (a, b) in enumerate(slots)]
    cum_c = list(np.cumsum((c.reshape(n_o, n_s) * x).sum(axis=0)))
    return Result("hindsight", float(res.fun), work, work, completion, None, 0, 0.0, 0, status,
                  (xs, list(per_slot), rate, cum_c))
