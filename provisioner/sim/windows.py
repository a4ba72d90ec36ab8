"""One start of a trace is one draw of its market: a deadline replayed from many starts.

Design: pure (no I/O). :func:`window_starts` lists the starts from which a deadline and
:data:`WINDOW_TAIL_H` hours more (a late finish still has prices) fit inside the traces;
:func:`summarise` turns each start's figures into the spread a user reads. Used by
``provision simulate --every`` and ``benchmarks/trace_rows.windows`` (the leave-one-family-out
benchmark's windows), so both cut the same windows.

Why: a deadline policy tuned on one start of its trace can win there and lose on the next
day's (docs/optimizer.md, "One start is one draw"); the mean and the worst over starts are
the figures that say how a deadline fares on a market.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

#: hours of trace a window keeps past its deadline (a late finish still has prices)
WINDOW_TAIL_H = 6.0

#: issue 28's goals: cost per sample over the hindsight bound's with one instance type and
#: with several, and over on-demand alone's
GOAL_ONE, GOAL_MANY, GOAL_OD = 1.05, 1.10, 1.00


def goal_of(types: int) -> float:
    """The bound ratio a run with ``types`` instance types in play is held to."""
    return GOAL_MANY if types > 1 else GOAL_ONE


def window_starts(start: float, end: float, deadline_h: float, every_h: float,
                  tail_h: float = WINDOW_TAIL_H) -> list[float]:
    """Epoch seconds of every start ``every_h`` hours apart, from ``start``, whose deadline
    and ``tail_h`` more end by ``end`` (the first at ``start``); empty when none fits."""
    if every_h <= 0:
        raise ValueError(f"every_h={every_h}: must be > 0")
    if deadline_h <= 0:
        raise ValueError(f"deadline_h={deadline_h}: must be > 0")
    span_h = (end - start) / 3600.0
    length = deadline_h + tail_h
    out, k = [], 0
    while k * every_h + length <= span_h + 1e-9:
        out.append(start + k * every_h * 3600.0)
        k += 1
    return out


@dataclass(frozen=True)
class Window:
    """spotring's figures from one start."""

    start: float  # epoch seconds
    vs_bound: float | None  # cost per sample over the hindsight bound's
    vs_on_demand: float | None  # cost per sample over on-demand alone's
    cost: float | None  # USD (None: no finite cost)
    hours: float | None  # to finish (None: not finished in the window)
    deadline_met: bool | None


def summarise(windows: Sequence[Window], goal: float) -> dict:
    """The spread over starts: how many, the mean and worst ratio to the bound, how many
    past ``goal``, the worst against on-demand, deadlines missed."""
    ratios = [w.vs_bound for w in windows if w.vs_bound is not None]
    od = [w.vs_on_demand for w in windows if w.vs_on_demand is not None]
    return {
        "windows": len(windows),
        "mean_vs_bound": round(sum(ratios) / len(ratios), 4) if ratios else None,
        "worst_vs_bound": max(ratios) if ratios else None,
        "past_goal": sum(1 for r in ratios if r > goal),
        "goal": goal,
        "worst_vs_on_demand": max(od) if od else None,
        "deadlines_missed": sum(1 for w in windows if w.deadline_met is False),
    }
