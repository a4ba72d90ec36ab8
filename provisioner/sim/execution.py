"""How a fleet turns into training progress: the simulator's two execution models.

Design: the engine (:mod:`provisioner.sim.engine`) owns time and the fleet; an execution
model owns what the fleet's changes do to the work: the rate between two events, the stalls,
and what a revocation costs. Both compute the ring's rate the planner assumes
(:func:`provisioner.plan.model.ring_efficiency` over the slowest link the ready instances
span, with the links of the settings).

- :class:`HotRing` (spotring, the trainer's elastic ring): every ready instance contributes;
  a join or a drain stalls the ring for ``reform_s``; a revocation without notice loses the
  unfinished step (``step_s`` of the ring's work) and stalls it ``reform_s``.
- :class:`Restart` (the baselines: checkpoint-restart systems): the job runs only when every
  instance held is ready, after ``restart_s``; it checkpoints every ``checkpoint_s``; a
  revocation rolls the work back to the last checkpoint; a planned change checkpoints first
  (nothing lost).

Rule: the engine calls :meth:`rate` once per event, then :meth:`observe` with it, and
:meth:`changed`, :meth:`revoked` and :meth:`joined` as the fleet changes; nothing here reads
the clock.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

from pricing.model import Offering
from provisioner.plan.model import ring_efficiency
from provisioner.sim.policies import Params
from provisioner.sim.world import World


class Instance(Protocol):
    o: Offering
    launched: float
    ready: float


def ring_rate_now(world: World, p: Params, insts: Sequence[Instance], t: float) -> float:
    """Samples/s of the ring the ready instances form at ``t``."""
    ready = [i for i in insts if i.ready <= t]
    s = sum(world.speed[i.o.instance_type] for i in ready)
    intra, inter_zone, inter_region = p.links
    link = (inter_region if len({i.o.region for i in ready}) > 1 else
            inter_zone if len({i.o.zone for i in ready}) > 1 else intra)
    return s * ring_efficiency(len(ready), s, p.model_mb, p.global_batch, link)


class HotRing:
    """The elastic ring (see the module docstring)."""

    hot = True
    running = False  # (a policy's view: the ring keeps no run to restart)

    def __init__(self, world: World, p: Params, t0: float) -> None:
        self.world, self.p = world, p
        self.stall_until = t0

    def rate(self, insts: Sequence[Instance], t: float) -> float:
        return 0.0 if t < self.stall_until else ring_rate_now(self.world, self.p, insts, t)

    def observe(self, t: float, rate: float, done: float) -> None:
        """Nothing to note: the ring keeps no checkpoint."""

    def changed(self, t: float, insts: Sequence[Instance]) -> None:
        """A round launched or removed instances: a ring running re-forms."""
        if any(i.ready <= t for i in insts):
            self.stall_until = max(self.stall_until, t + self.p.reform_s)

    def revoked(self, t: float, was_running: bool, rate: float, done: float,
                insts: Sequence[Instance]) -> tuple[float, float]:
        """Instances revoked at ``t`` (``insts``: those left). Returns (done, lost): the
        unfinished step of a running ring, and a re-form."""
        loss = min(done, rate * self.p.step_s) if was_running else 0.0
        self.stall_until = max(self.stall_until, t + self.p.reform_s)
        return done - loss, loss

    def joined(self, t: float) -> None:
        """A booting instance became ready and joined: the ring re-forms."""
        self.stall_until = max(self.stall_until, t + self.p.reform_s)


class Restart:
    """Checkpoint-restart (see the module docstring)."""

    hot = False

    def __init__(self, world: World, p: Params, t0: float) -> None:
        self.world, self.p = world, p
        self.stall_until = t0
        self.run_start: float | None = None
        self.run_work = self.run_rate = 0.0

    def rate(self, insts: Sequence[Instance], t: float) -> float:
        if t < self.stall_until or not insts or any(i.ready > t for i in insts):
            return 0.0
        return ring_rate_now(self.world, self.p, insts, t)

    def observe(self, t: float, rate: float, done: float) -> None:
        """A run (all held, ready, past the restart) starts or ends: its checkpoints count
        from its start."""
        if rate > 0 and self.run_start is None:
            self.run_start, self.run_work, self.run_rate = t, done, rate
        elif rate == 0:
            self.run_start = None

    @property
    def running(self) -> bool:
        """Whether a run (every instance ready, past its restart) is going on."""
        return self.run_start is not None

    def _restart(self, t: float, insts: Sequence[Instance]) -> None:
        self.stall_until = max([t] + [i.ready for i in insts]) + self.p.restart_s

    def changed(self, t: float, insts: Sequence[Instance]) -> None:
        """A planned change: checkpoint, wait for every instance, restart."""
        self._restart(t, insts)

    def revoked(self, t: float, was_running: bool, rate: float, done: float,
                insts: Sequence[Instance]) -> tuple[float, float]:
        """Back to the last checkpoint of the run going on, then restart."""
        lost = 0.0
        if self.run_start is not None:
            n_ck = math.floor((t - self.run_start) / self.p.checkpoint_s)
            committed = self.run_work + self.run_rate * n_ck * self.p.checkpoint_s
            lost = max(0.0, done - committed)
            done = min(done, committed)
        self.run_start = None
        self._restart(t, insts)
        return done, lost

    def joined(self, t: float) -> None:
        """Nothing: the job waits for every instance anyway."""


def model_for(mode: str, world: World, p: Params, t0: float) -> HotRing | Restart:
    """The execution model of a policy's ``mode`` (``hot`` or ``restart``)."""
    return HotRing(world, p, t0) if mode == "hot" else Restart(world, p, t0)
