"""A job's money: when to stop buying, and whether the budget can finish the work.

Design: pure helpers of :mod:`provisioner.plan.pipeline` (no I/O, no clock: times are
arguments). ``[job] budget_usd`` is a total the job may spend. Spending is continuous and
decisions are periodic (the daemon plans every ``plan_s``, 30 s) and a fleet is taken down
at most ``max_removals`` instances a round (the churn limits), so the planner stops buying
while enough is left to pay for the fleet held through those rounds:
:func:`reserve_usd`. Until then the budget does not shape the fleet (the planner already
buys the most useful work per dollar); :func:`stop_time` says when the reserve will be
reached at the current burn, so a caller deciding on a long period (the simulator's tick)
decides again then. :func:`budget_note` is the warning a plan carries, before the job
starts, when the budget left cannot pay for the work left even at the cheapest cost per
sample on offer now.

Rule: callers pass the spend so far and the fleet's burn; nothing here keeps state.
"""

from __future__ import annotations

import math
from typing import Iterable

from provisioner.plan.model import Candidate


def reserve_usd(burn_per_h: float, held: int, plan_s: float, max_removals: int) -> float:
    """USD the fleet held (``held`` instances costing ``burn_per_h`` together) may spend
    while it is taken down: one round to decide, then ``ceil(held / max_removals)`` rounds of
    ``plan_s`` seconds, each at the full burn (an upper bound: the burn falls as it goes)."""
    rounds = 1 + math.ceil(max(held, 0) / max(max_removals, 1))
    return burn_per_h * rounds * plan_s / 3600.0


def stop_time(now: float, left_usd: float, burn_per_h: float, reserve: float) -> float | None:
    """When the budget left falls to ``reserve`` at the current burn (None: never, or now)."""
    if burn_per_h <= 0 or left_usd <= reserve:
        return None
    return now + (left_usd - reserve) / burn_per_h * 3600.0


def cheapest_per_sample(cands: Iterable[Candidate]) -> tuple[float, Candidate] | None:
    """(USD per useful sample, candidate) of the cheapest one-instance ring on offer (a
    ring only adds communication, so no fleet does the work for less at these prices)."""
    best: tuple[float, Candidate] | None = None
    for c in cands:
        if c.useful > 0 and c.price_per_hour > 0 and (c.max_count is None or c.max_count > 0):
            per = c.price_per_hour / (c.useful * 3600.0)
            if best is None or per < best[0]:
                best = (per, c)
    return best


def budget_note(cands: Iterable[Candidate], work_left: float, left_usd: float) -> str | None:
    """A one-line warning when ``left_usd`` cannot pay for ``work_left`` samples even at the
    cheapest cost per sample on offer now, else None."""
    best = cheapest_per_sample(cands)
    if work_left <= 0 or best is None:
        return None
    per, c = best
    need = per * work_left
    if need <= left_usd:
        return None
    return (f"budget: job.budget_usd leaves ${left_usd:,.2f}, and the work left "
            f"({work_left:.4g} samples) costs at least ${need:,.2f} even at the cheapest price "
            f"per sample on offer now ({c.offering.key}, ${c.price_per_hour:.3f}/h): the job "
            f"will stop at about {left_usd / need:.0%} of it (raise job.budget_usd or lower "
            f"objective.work_samples)")
