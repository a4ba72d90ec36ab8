"""pricing.series.Step: the one step function, by hand."""

from __future__ import annotations

import pytest

from pricing.series import Step


def test_step_integral_is_exact():
    s = Step([0.0, 3600.0], [1.0, 2.0])
    assert s.between(0, 5400) == pytest.approx(3600 * 1 + 1800 * 2)
    assert s.at(3599.9) == 1.0 and s.at(3600) == 2.0
    assert s.next_below(0, 1.5) is None and Step([0, 10, 20], [3, 1, 3]).next_below(0, 2) == 10


def test_integrate_step_matches_hand_sum():
    series = [(0.0, 1.0), (10.0, 3.0), (20.0, 2.0)]
    assert Step.of(series).between(5, 25) == pytest.approx(5 * 1 + 10 * 3 + 5 * 2)
    assert Step.of(series).between(12, 15) == pytest.approx(9)
    assert Step.of(series).between(-5, 5) == pytest.approx(10)  # first price holds before
    assert Step.of(series).between(10, 10) == 0.0
