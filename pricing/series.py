"""ONE step-function type: a value that changes at points in time (a price, a capacity).

Design: :class:`Step` is right-continuous (``values[i]`` holds on ``[times[i],
times[i+1])``; before the first point the first value holds) and answers, with numpy and
bisect, the value at a time, the integral up to a time (cost = the integral of the price
over an instance's life, exactly), the next change below a level, and the minimum over an
interval. The simulator's world, the daemon's state (spend) and the built-in market's
availability feed all use it.

Rule: times are floats (Unix seconds) and sorted; values are per-time rates for integrals
(a price per hour integrates to USD·s/h: divide by 3600).
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np


class Step:
    """A right-continuous step function: value[i] holds on [times[i], times[i+1])."""

    @classmethod
    def of(cls, points: Sequence[tuple[float, float]]) -> "Step":
        """From sorted (start, value) pairs (at least one)."""
        return cls([t for t, _ in points], [v for _, v in points])

    def __init__(self, times: Sequence[float], values: Sequence[float]) -> None:
        if not len(times):
            raise ValueError("Step needs at least one point")
        self.t = np.asarray(times, dtype=float)
        self.v = np.asarray(values, dtype=float)
        # cumulative integral at each breakpoint
        self.c = np.concatenate(([0.0], np.cumsum(self.v[:-1] * np.diff(self.t))))

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.t, t) - 1
        return float(self.v[max(i, 0)])

    def integral(self, t: float) -> float:
        """Integral from times[0] to t (before times[0] the first value holds)."""
        i = bisect.bisect_right(self.t, t) - 1
        if i < 0:
            return float(self.v[0] * (t - self.t[0]))
        return float(self.c[i] + self.v[i] * (t - self.t[i]))

    def between(self, a: float, b: float) -> float:
        """Integral from ``a`` to ``b`` (0 when ``b <= a``)."""
        return self.integral(b) - self.integral(a) if b > a else 0.0

    def next_below(self, t: float, level: float) -> float | None:
        """First time > t at which the value falls below ``level``, or None."""
        i = bisect.bisect_right(self.t, t)
        below = np.nonzero(self.v[i:] < level)[0]
        return float(self.t[i + below[0]]) if below.size else None

    def min_over(self, a: float, b: float) -> float:
        i = max(bisect.bisect_right(self.t, a) - 1, 0)
        j = bisect.bisect_left(self.t, b)
        return float(self.v[i:max(j, i + 1)].min())
