"""What the planner launched lately is kept: no launch-then-drop within the churn horizon.

Design: a launch pays a boot (180 s by default) and a ring re-form before it delivers; a
plan that drops it minutes later, for a fleet that looks a little better now, pays that
again elsewhere. With two instance types whose capacity moves, the planner did exactly
that every few minutes (85 launches in one run; on the 4-node preemption traces, 557: a
zone capped at 4 refused a 5th instance, the planner moved the whole ring to another zone,
which refused its 5th, and so on). :class:`LaunchLog` remembers, per offering, how many
instances appeared in the fleet held and when, from the held counts of successive
decisions (the daemon and the simulator both pass them; nothing else is needed), and
:meth:`LaunchLog.young` says how many of each offering were launched within the horizon
(booting ones included: launches in flight count). The planner keeps them (a lower bound
in the MILP) unless that makes every fleet infeasible.

Rule: one log per :class:`~provisioner.plan.pipeline.Planner`, fed every decision in time
order; the first decision's fleet is of unknown age and is not kept by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from pricing.model import Offering


@dataclass
class LaunchLog:
    """Instances that appeared in the fleet, per offering: (time seen, how many)."""

    prev: dict[Offering, int] | None = None
    seen: dict[Offering, list[tuple[float, int]]] = field(default_factory=dict)

    def observe(self, now: float, held: Mapping[Offering, int]) -> None:
        """One decision's fleet held (booting or ready) at ``now``."""
        if self.prev is not None:
            for o, n in held.items():
                grown = n - self.prev.get(o, 0)
                if grown > 0:
                    self.seen.setdefault(o, []).append((now, grown))
        self.prev = {o: n for o, n in held.items() if n > 0}

    def young(self, now: float, held: Mapping[Offering, int],
              horizon_s: float) -> dict[Offering, int]:
        """Instances of each offering launched less than ``horizon_s`` ago and still held
        (at most what is held: a revoked or dropped one is gone either way)."""
        out: dict[Offering, int] = {}
        for o in list(self.seen):
            recent = [(t, n) for t, n in self.seen[o] if now - t < horizon_s]
            if recent:
                self.seen[o] = recent
            else:
                del self.seen[o]
                continue
            k = min(int(held.get(o, 0)), sum(n for _, n in recent))
            if k > 0:
                out[o] = k
        return out
