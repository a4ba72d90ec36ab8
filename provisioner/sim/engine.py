"""The simulator's engine: an event loop on a virtual clock (it never sleeps).

Design: three parts, each small. The loop here owns time: between two events the fleet,
and so the training rate, is constant; events are decision ticks, policy wake-ups, boots
finishing, stalls ending, revocations (a removal of the availability series hitting a held
instance, the count falling below what is held, a drawn lifetime ending) and the end of the
trace. The fleet and its actuator (:mod:`provisioner.sim.fleet`) are the cloud: a policy's
target is carried out by :func:`provisioner.plan.reconcile.apply_round`, the daemon's own
order and churn limits. The execution models (:mod:`provisioner.sim.execution`) turn the
fleet into progress: the elastic ring (spotring) or checkpoint-restart (the baselines).
Money is exact: an instance costs the integral of its offering's price step function from
launch to termination.

Revocations are the world's (:mod:`provisioner.sim.revocations`): removals of the
availability series hit held instances at random (seeded), the count caps what is held, and
instances of offerings without a series die at lifetimes drawn from the world's hazards.
Spotring plans with the hazards learned from the lifetimes seen so far (what the daemon
would estimate from the same records, every simulated hour).

Rule for callers: build the world with :func:`provisioner.sim.world.build_world` and the
job with :class:`provisioner.sim.policies.Params`; pass ``seed`` to make drawn revocations
repeatable. The offline bound is :func:`provisioner.sim.hindsight.hindsight`.
"""

from __future__ import annotations

import logging
import math
import random

from pricing.model import Offering
from pricing.risk import AgeShape
from provisioner.plan.reconcile import ChurnLimits, Held, RoundInput, apply_round
from provisioner.sim.execution import model_for
from provisioner.sim.fleet import Inst, SimActuator, SimFleet, drawn_deaths
from provisioner.sim.policies import Params, View, make_policy
from provisioner.sim.result import Life, Result
from provisioner.sim.revocations import hits, learned
from provisioner.sim.world import World

log = logging.getLogger(__name__)

__all__ = ["simulate_policy", "Result", "Life", "CAPACITY_REPLANS"]

#: Re-plans within one round after a launch refused for capacity (the daemon's number).
CAPACITY_REPLANS = 2
#: How often spotring's hazards are re-estimated from the lifetimes seen (simulated s).
HAZARD_REFRESH_S = 3600.0


class Engine:
    """One policy's run over one world (see the module docstring)."""

    def __init__(self, world: World, name: str, params: Params, *, work: float,
                 deadline_h: float | None, tick_s: float, seed: int) -> None:
        self.world, self.p, self.work, self.tick_s = world, params, work, tick_s
        self.deadline_h = deadline_h
        self.deadline_s = None if deadline_h is None else deadline_h * 3600.0
        self.name = name
        self.policy = make_policy(name, params, work=work, deadline_h=deadline_h,
                                  speed=world.speed)
        self.exec = model_for(self.policy.mode, world, params, world.start)
        self.hot = self.exec.hot
        self.rng = random.Random(seed)
        self.t = world.start
        self.done = self.lost = 0.0
        self.revocations = 0
        self.fleet = SimFleet(world, self.t)
        self.deaths = drawn_deaths(world, self.rng, seed)
        self.limits = (ChurnLimits(params.max_launches, params.max_removals) if self.hot
                       else ChurnLimits(10 ** 9, 10 ** 9))  # the baselines model other systems
        self.next_tick, self.wake = self.t + tick_s, None
        self.fail_wake: float | None = None  # a launch failed: decide again
        self.hazards: dict[Offering, float] = {}
        self.co: dict[Offering, float] = {}  # the share of a pool one event takes, learned
        self.shape = AgeShape()  # the hazard by age, learned
        self.hz_at = -math.inf
        self.spot = [o for o in world.price if o.market == "spot"]
        self.stopped: str | None = None  # the policy stopped buying for good
        self.budget_warning: str | None = None  # the first that the budget cannot finish
        self.behind = False  # the last decision was behind its pace
        self.empty_behind_s = 0.0  # time with no instance held while behind it
        self.series: tuple[list, list, list, list] = ([], [], [], [])

    # -- one decision round ------------------------------------------------------------------
    def _on_capacity_failure(self, o: Offering) -> None:
        self.fail_wake = self.t + (self.p.retry_s if self.hot else self.p.backoff_s)

    def decide(self, revoked: bool) -> None:
        """Ask the policy and carry its target out through the daemon's reconciler."""
        t, world, f = self.t, self.world, self.fleet
        f.t = t
        if self.hot and t - self.hz_at >= HAZARD_REFRESH_S:
            seen = learned(world.lifetimes, self.spot, t)
            self.hazards, self.co, self.shape = seen.hazards, seen.co_fraction, seen.age_shape
            self.hz_at = t
        prices = {o: s.at(t) for o, s in world.price.items()}
        alternatives = sorted(prices, key=lambda o: (prices[o], o)) if self.hot else ()
        act = SimActuator(f, self.p.boot_s, self.deaths, self._on_capacity_failure)
        decisions = []

        def plan(attempt: int) -> RoundInput:
            view = View(t, world.start, self.work, self.done, self.deadline_s, prices,
                        f.held(), dict(f.failed), world.speed, self.exec.running, self.hazards,
                        revoked or attempt > 0, f.cost(t), self.co, self.shape,
                        f.ages(t) if self.hot else {})
            d = self.policy.decide(view)
            decisions.append(d)
            blocked = frozenset(o for o, when in f.failed.items()
                                if self.hot and t - when < self.p.avoid_s)
            return RoundInput({o: n for o, n in d.target.items() if n > 0},
                              [Held(i.id, i.o, i.launched, i.ready <= t) for i in f.insts],
                              unavailable=blocked, alternatives=alternatives)

        done_round = apply_round(plan, act, limits=self.limits,
                                 replans=CAPACITY_REPLANS if self.hot else 0)
        last = decisions[-1] if decisions else None
        self.behind = bool(last is not None and last.behind)
        self.wake = last.wake_at if last is not None else None
        if last is not None and last.stop:
            self.stopped = last.stop
        if last is not None and last.budget_warning and self.budget_warning is None:
            self.budget_warning = last.budget_warning  # the first: before the job started
        if done_round is not None and done_round.deferred:  # the daemon's next round
            self.wake = min(self.wake if self.wake is not None else math.inf,
                            t + self.p.plan_s)
        if act.changed:
            self.exec.changed(t, f.insts)

    # -- the loop ----------------------------------------------------------------------------
    def _record(self, rate: float) -> None:
        xs, fleet, rates, costs = self.series
        xs.append((self.t - self.world.start) / 3600)
        fleet.append(len(self.fleet.insts))
        rates.append(rate)
        costs.append(self.fleet.cost(self.t))

    def _next_event(self) -> float:
        t, f, world = self.t, self.fleet, self.world
        cands = [self.next_tick if self.next_tick > t else t + self.p.backoff_s, world.end]
        for w in (self.wake, self.fail_wake, self.exec.stall_until):
            if w is not None and w > t:
                cands.append(w)
        cands += [i.ready for i in f.insts if i.ready > t]
        cands += [i.dies for i in f.insts if i.dies > t]
        for o, n in f.held().items():
            s = world.avail.get(o)
            if s is not None and (nb := s.next_below(t, n)) is not None:
                cands.append(nb)
            rc = world.reclaims.get(o)
            if rc is not None and o.market == "spot" and (nr := rc.next_after(t)) is not None:
                cands.append(nr)
        return min(cands)

    def _revoked_now(self) -> list[Inst]:
        """The instances the world takes at ``t``: lifetimes ended, removals of the groups
        held (each hitting held instances with the group's odds), counts below what is held."""
        t, f, world, rng = self.t, self.fleet, self.world, self.rng
        gone = [i for i in f.insts if i.dies <= t]
        for o in f.held():
            rc = world.reclaims.get(o)
            removal = rc.at(t) if rc is not None and o.market == "spot" else None
            mine = sorted((i for i in f.insts if i.o == o and i not in gone),
                          key=lambda i: (i.launched, i.id))
            if removal is not None:
                hit = rng.sample(mine, hits(rng, removal[0], removal[1], len(mine)))
                gone += hit
                mine = [i for i in mine if i not in hit]
            s = world.avail.get(o)
            if s is not None and s.at(t) < len(mine):
                gone += mine[:len(mine) - int(s.at(t))]
        return gone

    def run(self) -> Result:
        """Replay until the work is done, the policy stopped with nothing held, or the trace
        ends."""
        world, f = self.world, self.fleet
        need, revoked_flag = True, False
        while True:
            if need:
                self.decide(revoked_flag)
                need = revoked_flag = False
                if self.stopped and not f.insts:
                    self._record(0.0)
                    break
            r = self.exec.rate(f.insts, self.t)
            self.exec.observe(self.t, r, self.done)
            self._record(r)
            t_next = self._next_event()
            if r > 0 and self.t + (self.work - self.done) / r <= t_next:
                self.t += (self.work - self.done) / r
                self.done = self.work
                self._record(r)
                break
            self.done += r * (t_next - self.t)
            if self.behind and not f.insts:
                self.empty_behind_s += t_next - self.t
            prev, self.t = self.t, t_next
            f.t = self.t
            if self.t >= world.end:
                break
            gone = self._revoked_now()
            if gone:
                for i in gone:
                    f.end(i, self.t, revoked=True)
                self.revocations += len(gone)
                self.done, loss = self.exec.revoked(self.t, r > 0, r, self.done, f.insts)
                self.lost += loss
                need = revoked_flag = True
            if self.hot and any(prev < i.ready <= self.t for i in f.insts):
                self.exec.joined(self.t)
            if self.t >= self.next_tick:
                need = True
                while self.next_tick <= self.t:
                    self.next_tick += self.tick_s
            if self.wake is not None and self.t >= self.wake:
                need, self.wake = True, None
            if self.fail_wake is not None and self.t >= self.fail_wake:
                need = revoked_flag = True
                self.fail_wake = None
        return self._result()

    def _result(self) -> Result:
        f, world = self.fleet, self.world
        for i in list(f.insts):
            f.end(i, self.t)
        completion = (self.t - world.start) / 3600 if self.done >= self.work else None
        frac = self.done / self.work
        status = ("ok" if completion is not None else
                  f"stopped: {self.stopped} ({frac:.1%} of the work done)" if self.stopped else
                  f"not finished by the end of the trace ({frac:.1%} of the work done)")
        return Result(self.name, f.closed, self.done, self.work, completion, self.deadline_h,
                      self.revocations, self.lost, f.launches, status, self.series, f.lives,
                      empty_behind_h=self.empty_behind_s / 3600.0, budget_usd=(self.policy.planner.goal.budget_usd
                                  if hasattr(self.policy, "planner") else None),
                      budget_warning=self.budget_warning)


def simulate_policy(world: World, name: str, params: Params, *, work: float,
                    deadline_h: float | None = None, tick_s: float = 600.0,
                    seed: int = 0) -> Result:
    """Replay one policy over ``world`` until ``work`` samples are done or the trace ends
    (see the module docstring)."""
    return Engine(world, name, params, work=work, deadline_h=deadline_h, tick_s=tick_s,
                  seed=seed).run()
