"""The simulator: replays real price and availability traces against provisioning policies.

Design: a discrete-event loop on a virtual clock (it never sleeps). Between two events the
fleet, and so the training rate, is constant; events are decision ticks, policy wake-ups,
boots finishing, re-forms and restarts ending, revocations (availability falling below what
is held, or a drawn lifetime ending) and the end of the trace. Money is exact: an instance
costs the integral of its offering's price step function from launch to termination
(:meth:`provisioner.sim.world.Step.between`), i.e. instance-seconds x price at that time.

Two execution models:
- ``hot`` (spotring): every ready instance contributes; a join or a drain stalls the ring for
  ``reform_s``; a revocation without notice loses the unfinished step (``step_s`` of the
  ring's work) and stalls it ``reform_s``.
- ``restart`` (the baselines): the job runs only when every instance held is ready, then
  after ``restart_s``; it checkpoints every ``checkpoint_s``; a revocation rolls the work
  back to the last checkpoint; a planned change checkpoints first (nothing lost).

The ring's throughput is ``S / (1 + S t_comm / B)`` (see :mod:`provisioner.plan.model`).
The offline bound is :func:`provisioner.sim.hindsight.hindsight`.

Rule for callers: build the world with :func:`provisioner.sim.world.build_world`; pass
``seed`` to make drawn revocations repeatable.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field
from typing import Sequence

from pricing.model import Offering
from provisioner.plan.model import ring_efficiency
from provisioner.plan.reconcile import (ChurnLimits, Held, Launch, Removal, RoundInput,
                                        apply_round)
from provisioner.sim.policies import POLICIES, Params, View
from provisioner.sim.revocations import hits, learned_hazards, lifetime_s
from provisioner.sim.world import World

log = logging.getLogger(__name__)

#: Re-plans within one round after a launch refused for capacity (the daemon's number).
CAPACITY_REPLANS = 2


@dataclass(frozen=True)
class Life:
    """One instance of a run: its offering, when it was launched, ready and ended (hours
    from the start), whether it was revoked, and what it cost."""

    offering: Offering
    launched_h: float
    ready_h: float
    ended_h: float
    revoked: bool
    cost: float


@dataclass
class Result:
    """One policy's run. ``series`` holds (hours, fleet size, samples/s, cumulative USD);
    ``lives`` every instance it held (the fleet by offering and market, boots, revocations)."""

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
    lives: list[Life] = field(default_factory=list)
    fleet_by: dict[Offering, tuple[list, list]] | None = None  # set by runs without lives

    @property
    def cost_per_m(self) -> float:
        return self.cost / self.done * 1e6 if self.done > 0 else math.inf

    @property
    def deadline_met(self) -> bool | None:
        if self.deadline_h is None:
            return None
        return self.completion_h is not None and self.completion_h <= self.deadline_h + 1e-9

    @property
    def finished(self) -> bool:
        return bool(self.completion_h is not None and self.done >= self.work * (1 - 1e-9))

    def by_offering(self) -> dict[Offering, tuple[list[float], list[int]]]:
        """Instances held over time (hours), per offering: step functions from ``lives``
        (or ``fleet_by``: the bound's mean count per segment)."""
        if self.fleet_by is not None:
            return self.fleet_by
        changes: dict[Offering, dict[float, int]] = {}
        for life in self.lives:
            ch = changes.setdefault(life.offering, {})
            ch[life.launched_h] = ch.get(life.launched_h, 0) + 1
            ch[life.ended_h] = ch.get(life.ended_h, 0) - 1
        out = {}
        for o, ch in changes.items():
            xs, ys, n = [], [], 0
            for x in sorted(ch):
                n += ch[x]
                xs.append(x)
                ys.append(n)
            out[o] = (xs, ys)
        return out

    def figures(self) -> dict:
        """Plain Python numbers (JSON-able: no NaN or infinity), rounded for reading; an
        unfinished run says so (``finished``, ``work_done_fraction``, ``status``)."""
        met = self.deadline_met

        def num(x: float, nd: int) -> float | None:
            return round(float(x), nd) if math.isfinite(x) else None

        return {"total_cost_usd": num(self.cost, 4),
                "completion_hours": (None if self.completion_h is None
                                     else num(self.completion_h, 4)),
                "cost_per_1m_samples_usd": num(self.cost_per_m, 6) if self.done > 0 else None,
                "deadline_met": None if met is None else bool(met),
                "revocations": int(self.revocations),
                "work_lost_samples": num(self.work_lost, 1),
                "work_done_samples": num(self.done, 1),
                "work_done_fraction": num(self.done / self.work, 4) if self.work > 0 else None,
                "finished": self.finished,
                "launches": int(self.launches), "status": self.status}


@dataclass
class _Inst:
    o: Offering
    launched: float
    ready: float
    dies: float = math.inf
    id: str = ""


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
                    deadline_h: float | None = None, tick_s: float = 600.0,
                    seed: int = 0) -> Result:
    """Replay one policy over ``world`` until ``work`` samples are done or the trace ends.

    Revocations are the world's (:mod:`provisioner.sim.revocations`): removals of the
    availability series hit held instances at random (seeded), the count caps what is held,
    and instances of offerings without a series die at lifetimes drawn from the world's
    hazards. Spotring plans with the hazards learned from the lifetimes seen so far."""
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
    hazards: dict[Offering, float] = {}
    hz_at = -math.inf
    xs, fleet, rates, costs = [], [], [], []
    spot = [o for o in world.price if o.market == "spot"]

    def cost_now(at: float) -> float:
        return closed + sum(world.cost(i.o, i.launched, at) for i in insts)

    lives: list[Life] = []

    def terminate(i: _Inst, at: float, revoked: bool = False) -> None:
        nonlocal closed
        usd = world.cost(i.o, i.launched, at)
        closed += usd
        insts.remove(i)
        h0 = world.start
        lives.append(Life(i.o, (i.launched - h0) / 3600, (min(i.ready, at) - h0) / 3600,
                          (at - h0) / 3600, revoked, usd))

    def held() -> dict[Offering, int]:
        h: dict[Offering, int] = {}
        for i in insts:
            h[i.o] = h.get(i.o, 0) + 1
        return h

    limits = (ChurnLimits(params.max_launches, params.max_removals) if hot
              else ChurnLimits(10 ** 9, 10 ** 9))  # the baselines model other systems
    serial = iter(range(10 ** 12))

    class Act:
        """The simulator's :class:`~provisioner.plan.reconcile.Actuator`: instances on the
        virtual clock (a drain ends the instance at once: it leaves at a step boundary)."""

        changed = False

        def launch(self, launch: Launch) -> bool:
            nonlocal launches, fail_wake
            o, n = launch.offering, launch.count
            room = max(0, world.available(o, t) - held().get(o, 0))
            k = min(n, room)
            for _ in range(k):
                dies = t + lifetime_s(rng, world.hazard.get(o, 0.0)) if (
                    o.market == "spot" and world.avail.get(o) is None) else math.inf
                insts.append(_Inst(o, t, t + params.boot_s, dies, f"i-{next(serial)}"))
            launches += k
            self.changed = self.changed or k > 0
            if k < n:
                failed[o] = t
                fail_wake = t + (params.retry_s if hot else params.backoff_s)
            return k == n

        def terminate(self, removals: Sequence[Removal]) -> None:
            gone = {r.instance_id for r in removals}
            for i in [i for i in insts if i.id in gone]:
                terminate(i, t)
                self.changed = True

        def drain(self, removal: Removal) -> None:
            self.terminate([removal])

    def decide(revoked: bool) -> None:
        nonlocal wake, stall_until, hz_at, hazards
        if hot and t - hz_at >= 3600.0:  # what the daemon would estimate from the same records
            hazards = learned_hazards(world.lifetimes, spot, t)
            hz_at = t
        prices = {o: s.at(t) for o, s in world.price.items()}
        alternatives = sorted(prices, key=lambda o: (prices[o], o)) if hot else ()
        act = Act()
        wakes: list[float | None] = []

        def plan(attempt: int) -> RoundInput:
            view = View(t, world.start, work, done, deadline_s, prices, held(), dict(failed),
                        world.speed, run_start is not None, hazards, revoked or attempt > 0)
            d = policy.decide(view)
            wakes.append(d.wake_at)
            blocked = frozenset(o for o, when in failed.items()
                                if hot and t - when < params.avoid_s)
            return RoundInput({o: n for o, n in d.target.items() if n > 0},
                              [Held(i.id, i.o, i.launched, i.ready <= t) for i in insts],
                              unavailable=blocked, alternatives=alternatives)

        done_round = apply_round(plan, act, limits=limits, replans=CAPACITY_REPLANS if hot else 0)
        wake = wakes[-1] if wakes else None
        if done_round is not None and done_round.deferred:  # the daemon's next round
            wake = min(wake if wake is not None else math.inf, t + params.plan_s)
        if act.changed:
            if hot:
                stall_until = max(stall_until, t + params.reform_s) if any(
                    i.ready <= t for i in insts) else stall_until
            else:
                stall_until = max([t] + [i.ready for i in insts]) + params.restart_s

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
            rc = world.reclaims.get(o)
            if rc is not None and o.market == "spot":
                nr = rc.next_after(t)
                if nr is not None:
                    cands.append(nr)
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
        # revocations: lifetimes ended, removals of the groups held, capacity caps
        gone: list[_Inst] = [i for i in insts if i.dies <= t]
        for o, n in held().items():
            rc = world.reclaims.get(o)
            removal = rc.at(t) if rc is not None and o.market == "spot" else None
            mine = sorted((i for i in insts if i.o == o and i not in gone),
                          key=lambda i: (i.launched, i.id))
            if removal is not None:
                hit = rng.sample(mine, hits(rng, removal[0], removal[1], len(mine)))
                gone += hit
                mine = [i for i in mine if i not in hit]
            s = world.avail.get(o)
            if s is not None and s.at(t) < len(mine):
                gone += mine[:len(mine) - int(s.at(t))]
        if gone:
            was_running = r > 0
            for i in gone:
                failed[i.o] = t
                terminate(i, t, revoked=True)
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
    status = ("ok" if completion is not None else
              f"not finished by the end of the trace ({done / work:.1%} of the work done)")
    return Result(name, closed, done, work, completion, deadline_h, revocations, lost, launches,
                  status, (xs, fleet, rates, costs), lives)
