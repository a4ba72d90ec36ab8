"""One run's outcome: the instances it held, what it cost, how far it got.

Design: plain data the engine fills and the report reads. :class:`Life` is one instance
(launched, ready, ended, revoked, cost); :class:`Result` one policy's run with its time
series and its honest status (a run that did not finish says so, and how far it got).

Rule: :meth:`Result.figures` is JSON-safe (no NaN or infinity) and is what the report shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pricing.model import Offering


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
    budget_usd: float | None = None  # the job's budget, when it had one
    budget_warning: str | None = None  # the planner's first word that it cannot finish the work
    empty_behind_h: float = 0.0  # hours holding nothing while the policy said it was behind
    floors: dict[str, float] | None = None  # the bound's: a deadline kept safe, at least
    # (:func:`provisioner.sim.report.deadline_floors`)

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
                "launches": int(self.launches), "status": self.status,
                **({} if self.budget_usd is None else {
                    "budget_usd": num(self.budget_usd, 4),
                    "budget_left_usd": num(self.budget_usd - self.cost, 4)}),
                **({} if self.budget_warning is None else {
                    "budget_warning": self.budget_warning}),
                **({} if self.floors is None else {
                    k: num(v, 4) for k, v in self.floors.items()})}
