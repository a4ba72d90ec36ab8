"""GPipe and 1F1B as pure data: every pass once, dependencies kept, the bubble formula."""

from __future__ import annotations

import pytest

from trainer.pipeline import schedule as sc
from trainer.pipeline.schedule import BACKWARD, FORWARD, Op


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("m", "k"), [(1, 1), (1, 4), (4, 4), (8, 4), (3, 5), (16, 2)])
def test_each_pass_once_and_a_backward_after_its_forward(name: str, m: int, k: int) -> None:
    for j in range(k):
        ops = sc.schedule(name, m, k, j)
        assert sorted((o.kind, o.micro) for o in ops) == sorted(
            [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)])
        for i in range(m):
            assert ops.index(Op(FORWARD, i)) < ops.index(Op(BACKWARD, i))


@pytest.mark.parametrize(("m", "k"), [(8, 4), (4, 4), (2, 4), (12, 3)])
def test_balanced_stages_take_m_plus_k_minus_1_slots_and_the_bubble_is_the_formula(
        m: int, k: int) -> None:
    for name in ("gpipe", "1f1b"):
        tl = sc.simulate([sc.schedule(name, m, k, j) for j in range(k)], [1.0] * k, [2.0] * k)
        assert tl.makespan == pytest.approx((m + k - 1) * 3.0)
        assert tl.idle_fraction == pytest.approx(sc.bubble(m, k))


def test_1f1b_keeps_at_most_k_minus_j_activations_gpipe_keeps_all() -> None:
    m, k = 8, 4
    assert [sc.peak_in_flight(sc.one_f_one_b(m, k, j)) for j in range(k)] == [4, 3, 2, 1]
    assert [sc.peak_in_flight(sc.gpipe(m, k, j)) for j in range(k)] == [8] * 4


def test_the_slowest_stage_sets_the_pace() -> None:
    m, k = 8, 3
    tl = sc.simulate([sc.one_f_one_b(m, k, j) for j in range(k)], [1.0, 2.0, 1.0],
                     [2.0, 4.0, 2.0])
    # the bottleneck stage (6 per micro-batch) is busy m times, plus the others' fill/drain
    assert tl.makespan == pytest.approx(m * 6.0 + (k - 1) * 3.0, rel=0.2)
    assert tl.busy[1] == pytest.approx(m * 6.0)


def test_mismatched_schedules_are_reported_as_a_deadlock() -> None:
    bad = [(Op(FORWARD, 0), Op(BACKWARD, 0)), (Op(BACKWARD, 0), Op(FORWARD, 0))]
    with pytest.raises(ValueError, match="deadlock"):
        sc.simulate(bad, [1.0, 1.0], [1.0, 1.0])


def test_a_link_latency_delays_every_hop() -> None:
    m, k = 4, 3
    base = sc.simulate([sc.gpipe(m, k, j) for j in range(k)], [1.0] * k, [2.0] * k)
    slow = sc.simulate([sc.gpipe(m, k, j) for j in range(k)], [1.0] * k, [2.0] * k, 0.5)
    assert slow.makespan >= base.makespan + 2 * (k - 1) * 0.5 - 1e-9
