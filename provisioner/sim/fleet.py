"""The simulated fleet and the actuator that changes it: the cloud on a virtual clock.

Design: :class:`SimFleet` is the ledger of one run: the instances held (each with its
offering, launch, ready and drawn death times), the money (an instance costs the integral
of its offering's price from launch to end: :meth:`provisioner.sim.world.World.cost`), the
lives it leaves behind for the report and the offerings that failed it lately.
:class:`SimActuator` is the simulator's :class:`~provisioner.plan.reconcile.Actuator`:
:func:`~provisioner.plan.reconcile.apply_round` carries a target out through it exactly as
the daemon's write-ahead actuator does (a launch finds the capacity the world has at that
time, else fails for capacity; a drain ends the instance at once: it leaves at a step
boundary).

Rule: the engine sets :attr:`SimFleet.t` before each round; every change goes through
:class:`SimActuator` or :meth:`SimFleet.end`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from pricing.model import Offering
from provisioner.plan.reconcile import Launch, Removal
from provisioner.sim.result import Life
from provisioner.sim.world import World


@dataclass
class Inst:
    """One instance held: its offering, launch and ready times, and when it dies (a drawn
    lifetime; inf when revocations come from an availability series)."""

    o: Offering
    launched: float
    ready: float
    dies: float = math.inf
    id: str = ""


class SimFleet:
    """The instances a run holds, and what they cost (see the module docstring)."""

    def __init__(self, world: World, t0: float) -> None:
        self.world = world
        self.t = t0
        self.insts: list[Inst] = []
        self.closed = 0.0  # USD of the instances ended
        self.lives: list[Life] = []
        self.failed: dict[Offering, float] = {}  # offering -> time of its last failure
        self.launches = 0
        self._serial = 0

    def held(self) -> dict[Offering, int]:
        h: dict[Offering, int] = {}
        for i in self.insts:
            h[i.o] = h.get(i.o, 0) + 1
        return h

    def ages(self, at: float) -> dict[Offering, tuple[float, ...]]:
        """Seconds since each held instance was launched, by offering."""
        a: dict[Offering, list[float]] = {}
        for i in self.insts:
            a.setdefault(i.o, []).append(at - i.launched)
        return {o: tuple(v) for o, v in a.items()}

    def cost(self, at: float) -> float:
        """USD spent by ``at``: the instances ended, and those held up to ``at``."""
        return self.closed + sum(self.world.cost(i.o, i.launched, at) for i in self.insts)

    def add(self, o: Offering, boot_s: float, dies: float) -> Inst:
        self._serial += 1
        inst = Inst(o, self.t, self.t + boot_s, dies, f"i-{self._serial - 1}")
        self.insts.append(inst)
        self.launches += 1
        return inst

    def end(self, i: Inst, at: float, revoked: bool = False) -> None:
        """End ``i`` at ``at`` (revoked, or terminated by the policy), paying its life."""
        usd = self.world.cost(i.o, i.launched, at)
        self.closed += usd
        self.insts.remove(i)
        h0 = self.world.start
        self.lives.append(Life(i.o, (i.launched - h0) / 3600, (min(i.ready, at) - h0) / 3600,
                               (at - h0) / 3600, revoked, usd))
        if revoked:
            self.failed[i.o] = at


class SimActuator:
    """The simulator's :class:`~provisioner.plan.reconcile.Actuator` over a :class:`SimFleet`.

    ``death(offering, launched)`` says when a new instance will be revoked by a drawn event
    (inf: never, or by its availability series); ``on_capacity_failure(offering)`` is told
    of every launch the world had no room for."""

    def __init__(self, fleet: SimFleet, boot_s: float,
                 death: Callable[[Offering, float], float],
                 on_capacity_failure: Callable[[Offering], None]) -> None:
        self.fleet = fleet
        self.boot_s = boot_s
        self.death = death
        self.on_capacity_failure = on_capacity_failure
        self.changed = False

    def launch(self, launch: Launch) -> bool:
        f = self.fleet
        o, n = launch.offering, launch.count
        room = max(0, f.world.available(o, f.t) - f.held().get(o, 0))
        k = min(n, room)
        for _ in range(k):
            f.add(o, self.boot_s, self.death(o, f.t))
        self.changed = self.changed or k > 0
        if k < n:
            f.failed[o] = f.t
            self.on_capacity_failure(o)
        return k == n

    def terminate(self, removals: Sequence[Removal]) -> None:
        gone = {r.instance_id for r in removals}
        for i in [i for i in self.fleet.insts if i.id in gone]:
            self.fleet.end(i, self.fleet.t)
            self.changed = True

    def drain(self, removal: Removal) -> None:
        self.terminate([removal])


def drawn_deaths(world: World, rng: random.Random, seed: int
                 ) -> Callable[[Offering, float], float]:
    """When a new instance of an offering launched at a time dies: for spot offerings
    without an availability series, at the first interruption event of their pool that takes
    them (:class:`provisioner.sim.revocations.PoolEvents`: one seeded stream of events per
    pool, so a run's instances of one pool go together); never for the others (their
    revocations are the series')."""
    from pricing.risk import CO_WINDOW_S
    from provisioner.sim.revocations import PoolEvents

    events = PoolEvents(world.hazard, world.co_fraction, seed, CO_WINDOW_S, world.start)

    def death(o: Offering, launched: float) -> float:
        if o.market == "spot" and world.avail.get(o) is None:
            return events.death(rng, o, launched, world.end)
        return math.inf
    return death
