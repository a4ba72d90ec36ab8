"""benchmarks/online_gap.py: the worlds a policy cannot tell from the trace until an hour, and
the least worst ratio a policy can reach over them."""

from __future__ import annotations

import pytest

from benchmarks.online_gap import main, tree_floor
from benchmarks.trace_rows import outage_starts, world_after
from provisioner.sim.world import build_world
from tests.provisioner.sim.test_revocations import group_trace
from tests.provisioner.sim.test_simulate import A, SPEED


def test_the_world_whose_spot_stays_agrees_with_the_trace_until_the_hour_only():
    world = build_world(group_trace(A, [4, 2, 0, 3, 0, 4], 1.0), SPEED, max_size=4)
    t = world.start + 2.5 * 3600
    stays = world_after(world, t, 4)
    for h in (0.5, 1.5, 2.2):
        assert stays.available(A, world.start + h * 3600) == world.available(A, world.start + h * 3600)
    assert [stays.available(A, world.start + h * 3600) for h in (2.6, 3.5, 4.5)] == [4, 4, 4]
    assert [world.available(A, world.start + h * 3600) for h in (2.6, 3.5, 4.5)] == [0, 3, 0]
    assert all(x < t for x in stays.reclaims[A].times)
    assert any(x > t for x in world.reclaims[A].times)


def test_a_row_without_a_deadline_is_refused_with_the_rows_that_have_one(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--row", "16-node"])
    assert e.value.code == 2
    assert "'10-26 V100, 34.4 h'" in capsys.readouterr().err


def test_a_window_that_does_not_fit_the_traces_is_refused_with_the_form(capsys, shared_data):
    with pytest.raises(SystemExit) as e:
        main(["--row", "10-26 V100, 34.4 h @+99999 h"])
    assert e.value.code == 2
    assert "'NAME @+H h'" in capsys.readouterr().err


def test_the_branches_are_where_every_zone_of_the_cheapest_spot_goes_out():
    world = build_world(group_trace(A, [4, 2, 0, 3, 0, 0, 4, 0], 1.0), SPEED, max_size=4)
    assert outage_starts(world, 7.5) == [2.0, 4.0, 7.0]
    assert outage_starts(world, 5.0) == [2.0, 4.0]  # within the deadline only


def _convex(n: int, scale: float, total: float = 1.0) -> list[float]:
    # the least cost of i steps of n: convex (bigger rings cost more per sample)
    return [scale * (i / n * total + (i / n * total) ** 2) for i in range(n + 1)]


def test_one_branch_is_the_best_of_the_worse_two_ratios_at_every_share():
    n = 10
    first, then = _convex(n, 1.0), _convex(n, 3.0)  # the trace: the rest costs more
    stays = [v * 0.5 for v in _convex(n, 1.0)[::-1]]  # the rest, from i steps done
    b, b_stays = 2.0, 1.5
    z, at = tree_floor([first, then], [[stays]], [[b_stays]], b)
    by_hand = min(max((first[i] + then[n - i]) / b, (first[i] + stays[i]) / b_stays)
                  for i in range(n + 1))
    assert z == pytest.approx(by_hand, abs=2e-4)
    i = at[0]
    assert max((first[i] + then[n - i]) / b, (first[i] + stays[i]) / b_stays) == pytest.approx(
        by_hand, abs=2e-4)


def test_a_world_added_at_a_branch_never_lowers_the_floor_and_a_goal_held_costs_the_others():
    n = 8
    stage = [_convex(n, 1.0), _convex(n, 2.0), _convex(n, 4.0)]
    stays = [[v * 0.6 for v in _convex(n, 1.0)[::-1]]]
    gone = [[v * 3.0 for v in _convex(n, 1.0)[::-1]]]  # on-demand: dear
    two, _ = tree_floor(stage, [stays, stays], [[1.5], [1.5]], 2.0)
    three, at = tree_floor(stage, [stays + gone, stays + gone], [[1.5, 2.5], [1.5, 2.5]], 2.0)
    assert three >= two - 1e-9
    assert at == sorted(at)  # work done only grows
    held, _ = tree_floor(stage, [stays + gone] * 2, [[1.5, 2.5]] * 2, 2.0,
                         trace_at_most=two)
    assert held >= three - 1e-9  # keeping the trace lower leaves the others no better
    never, steps = tree_floor(stage, [stays + gone] * 2, [[1.5, 2.5]] * 2, 2.0,
                              trace_at_most=0.1)
    assert never == float("inf") and steps == []


def test_the_lower_figure_is_below_the_figure_on_any_finer_grid():
    def tables(n):
        stage = [_convex(n, 1.0), _convex(n, 3.0)]
        rest = [[[0.5 * (x + x * x) for x in (1 - i / n for i in range(n + 1))],
                 [3.0 * (x + x * x) for x in (1 - i / n for i in range(n + 1))]]]
        return stage, rest, [[1.2, 2.4]]
    fine = tree_floor(*tables(400), 2.0)[0]
    for n in (4, 10, 40):
        low = tree_floor(*tables(n), 2.0, lower=True)[0]
        assert low <= fine + 1e-4
        assert tree_floor(*tables(n), 2.0)[0] >= fine - 1e-4  # the grid's own: above
    assert tree_floor(*tables(40), 2.0, lower=True)[0] > tree_floor(*tables(4), 2.0,
                                                                   lower=True)[0]
