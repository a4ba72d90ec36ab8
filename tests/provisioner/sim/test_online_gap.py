"""benchmarks/online_gap.py: the world a policy cannot tell from the trace until an hour."""

from __future__ import annotations

import pytest

from benchmarks.online_gap import _world_after, main
from provisioner.sim.world import build_world
from tests.provisioner.sim.test_revocations import group_trace
from tests.provisioner.sim.test_simulate import A, SPEED


def test_the_world_whose_spot_stays_agrees_with_the_trace_until_the_hour_only():
    world = build_world(group_trace(A, [4, 2, 0, 3, 0, 4], 1.0), SPEED, max_size=4)
    t = world.start + 2.5 * 3600
    stays = _world_after(world, t, 4)
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
