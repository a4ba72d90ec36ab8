"""The layout of virtual workers and the moves between generations, as pure functions."""

from __future__ import annotations

import math
import random

import pytest

from trainer.pipeline import partition as pt
from trainer.pipeline.partition import Candidate, Costs, Holding, Layout, Transfer

S = pt.Settings(stages=2, micro_batch=4, schedule="1f1b", optimizer_slots=2, max_micro=8)


def costs(seconds: list[float], param: float = 100.0, act: float = 10.0) -> Costs:
    n = len(seconds)
    return Costs(tuple(seconds), (param,) * n, (act,) * n)


def brute(c: Costs, speeds: list[float]) -> float:
    """The best bottleneck over every contiguous split (for small cases)."""
    n, k = c.layers, len(speeds)
    best = math.inf

    def rec(start: int, j: int, worst: float) -> None:
        nonlocal best
        if j == k - 1:
            best = min(best, max(worst, sum(c.seconds[start:]) / speeds[j]))
            return
        for end in range(start + 1, n - (k - j - 1) + 1):
            rec(end, j + 1, max(worst, sum(c.seconds[start:end]) / speeds[j]))

    rec(0, 0, 0.0)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_boundaries_are_the_optimal_bottleneck(seed: int) -> None:
    rng = random.Random(seed)
    n, k = rng.randint(3, 9), rng.randint(1, 3)
    c = costs([rng.uniform(0.1, 3.0) for _ in range(n)])
    speeds = [rng.uniform(0.5, 2.0) for _ in range(k)]
    b = pt.best_bounds(c, speeds, [math.inf] * k, S)
    assert b is not None and b[0] == 0 and b[-1] == n and len(b) == k + 1
    got = max(sum(c.seconds[b[j]:b[j + 1]]) / speeds[j] for j in range(k))
    assert got == pytest.approx(brute(c, speeds))


def test_a_faster_member_gets_more_layers() -> None:
    c = costs([1.0] * 12)
    assert pt.best_bounds(c, [1.0, 2.0], [math.inf] * 2, S) == (0, 4, 12)
    assert pt.best_bounds(c, [3.0, 1.0], [math.inf] * 2, S) == (0, 9, 12)


def test_memory_caps_move_layers_off_a_small_member() -> None:
    c = costs([1.0] * 10, param=100.0, act=0.0)  # 400 bytes per layer with Adam
    free = pt.best_bounds(c, [1.0, 1.0], [math.inf, math.inf], S)
    assert free == (0, 5, 10)
    capped = pt.best_bounds(c, [1.0, 1.0], [1200.0, math.inf], S)
    assert capped == (0, 3, 10)
    assert pt.best_bounds(c, [1.0, 1.0], [1200.0, 1200.0], S) is None


def test_gpipe_needs_more_activation_memory_than_1f1b() -> None:
    c = costs([1.0] * 4, param=0.0, act=100.0)
    g = pt.Settings(2, 4, "gpipe", 2, max_micro=8)
    one = pt.Settings(2, 4, "1f1b", 2, max_micro=8)
    assert pt.stage_memory(c, 0, 2, 0, 2, g) == 2 * 100 * 4 * 8
    assert pt.stage_memory(c, 0, 2, 0, 2, one) == 2 * 100 * 4 * 2
    assert pt.stage_memory(c, 2, 4, 1, 2, one) == 3 * 100 * 4 * 1  # input + two outputs


def test_members_are_tiered_by_speed_and_the_slowest_are_spares() -> None:
    members = [Candidate(r, s) for r, s in enumerate([1.0, 4.0, 2.0, 3.0, 0.5])]
    lay = pt.decide(members, costs([1.0] * 8), S)
    assert lay is not None
    assert lay.vws == ((1, 2), (3, 0)) and lay.spares == (4,)
    assert lay.stage_ranks(0) == (1, 3) and lay.slot_of(0) == (1, 1)
    assert lay.layers_of(4) == (0, 0) and lay.slot_of(4) is None


def test_an_expensive_last_layer_puts_the_fast_tier_last() -> None:
    c = costs([1.0] * 6 + [6.0])  # a language model's head
    lay = pt.decide([Candidate(0, 3.0), Candidate(1, 1.0)], c, pt.Settings(2, 1))
    assert lay is not None and lay.vws == ((1, 0),) and lay.bounds == (0, 3, 7)


def test_fewer_members_than_stages_make_one_shorter_virtual_worker() -> None:
    lay = pt.decide([Candidate(0, 1.0)], costs([1.0] * 4), pt.Settings(3, 4))
    assert lay is not None and lay.vws == ((0,),) and lay.bounds == (0, 4)


def test_a_replacement_takes_the_dead_members_slot_and_the_boundaries_stay() -> None:
    c = costs([1.0] * 8)
    first = pt.decide([Candidate(r, 1.0 + 0.01 * r) for r in range(4)], c, S)
    assert first is not None
    # rank 2 died; a joiner (new rank 3) of about the same speed replaces it
    survivors = [Candidate(r, 1.0 + 0.01 * r, slot=first.slot_of(r)) for r in (0, 1, 3)]
    again = [Candidate(i, m.speed, slot=m.slot) for i, m in enumerate(survivors)]
    again.append(Candidate(3, 1.05))
    lay = pt.decide(again, c, S, hint=first.bounds)
    assert lay is not None and lay.bounds == first.bounds
    for i, m in enumerate(survivors):
        assert lay.slot_of(i) == m.slot
    assert lay.slot_of(3) == first.slot_of(2)


def test_with_fewer_virtual_workers_the_whole_one_stays_in_its_slots() -> None:
    # VW 0 lost its stage-0 member and nobody replaced it yet: one VW of the three survivors;
    # VW 1 is whole and stays (its members' kept packs of the unagreed waves line up)
    c = costs([1.0] * 8)
    members = [Candidate(0, 1.0, slot=(0, 1)), Candidate(1, 1.0, slot=(1, 0)),
               Candidate(2, 1.0, slot=(1, 1))]
    lay = pt.decide(members, c, S, hint=(0, 4, 8))
    assert lay is not None and lay.vws == ((1, 2),) and lay.spares == (0,)
    assert lay.bounds == (0, 4, 8)


def test_a_much_better_fresh_layout_beats_keeping_the_slots() -> None:
    c = costs([1.0] * 8)
    # kept, each stage pairs a fast member with a slow one: the boundaries cannot favour
    # either stage and both VWs run at the slow members' pace (total rate 0.1 / micro)
    kept = [Candidate(0, 1.0, slot=(0, 0)), Candidate(1, 0.2, slot=(0, 1)),
            Candidate(2, 0.2, slot=(1, 0)), Candidate(3, 1.0, slot=(1, 1))]
    lay = pt.decide(kept, c, pt.Settings(2, 1))
    assert lay is not None
    assert lay.vws == ((0, 1), (3, 2))  # fresh tiers: the fast members at stage 0
    assert lay.bounds == (0, 7, 8) and sum(lay.rates) == pytest.approx(2 / 7)


def test_micro_batches_go_to_the_worker_that_finishes_first() -> None:
    assert pt.split_micro(8, [1.0, 1.0], 2) == (4, 4)
    assert pt.split_micro(9, [2.0, 1.0], 3) == (7, 2)  # 9/2 vs 4/1
    assert sum(pt.split_micro(7, [3.0, 1.0, 0.5], 4)) == 7
    assert pt.split_micro(3, [1.0, 0.0], 2) == (3, 0)


def test_micro_batch_sizes_are_fixed_and_even() -> None:
    assert pt.micro_sizes(32, 8) == (8, 8, 8, 8)
    assert pt.micro_sizes(30, 8) == (8, 8, 7, 7)
    assert pt.micro_sizes(5, 8) == (5,)
    assert pt.micro_sizes(0, 8) == ()


LAY = Layout(((0, 1), (2, 3)), (0, 3, 6), (1.0, 1.0), (4,))


def test_a_replacement_receives_its_stage_from_the_same_stage_of_the_other_worker() -> None:
    holds = [Holding(0, 0, 3, 5), Holding(1, 3, 6, 5), Holding(2, 0, 3, 5), Holding(3),
             Holding(4, 0, 0, 5)]
    moves, missing = pt.transfers(holds, LAY, 5)
    assert missing == ()
    assert moves == (Transfer(1, 3, 3, 6),)


def test_stale_members_get_everything_and_spares_the_shared_state_alone() -> None:
    holds = [Holding(0, 0, 3, 5), Holding(1, 3, 6, 4), Holding(2, 0, 3, 5), Holding(3, 3, 6, 5),
             Holding(4)]
    moves, missing = pt.transfers(holds, LAY, 5)
    assert missing == ()
    assert moves == (Transfer(3, 1, 3, 6), Transfer(0, 4, 0, 0))


def test_layers_held_by_nobody_are_reported() -> None:
    holds = [Holding(0, 0, 3, 5), Holding(1), Holding(2, 0, 3, 5), Holding(3), Holding(4)]
    _, missing = pt.transfers(holds, LAY, 5)
    assert missing == (3, 4, 5)


def test_a_new_boundary_takes_a_layer_from_a_neighbour_and_balances_sources() -> None:
    lay = Layout(((0, 1), (2, 3)), (0, 4, 6), (1.0, 1.0))
    holds = [Holding(0, 0, 3, 2), Holding(1, 3, 6, 2), Holding(2, 0, 3, 2), Holding(3, 3, 6, 2)]
    moves, _ = pt.transfers(holds, lay, 2)
    assert {(m.dst, m.lo, m.hi) for m in moves} == {(0, 3, 4), (2, 3, 4)}
    assert {m.src for m in moves} == {1, 3}  # one each, not both from rank 1


def test_a_stage_whose_replicas_all_leave_is_handed_to_a_member_that_stays() -> None:
    one = Layout(((0, 1, 2),), (0, 2, 4, 6), (1.0,), (3,))
    # stage 1 leaves: the spare takes it
    assert pt.handover(one, [0, 2, 3]) == (Transfer(1, 3, 2, 4),)
    # no spare: a neighbour takes it and holds a contiguous range
    assert pt.handover(one, [0, 2]) == (Transfer(1, 0, 2, 4),)
    # two neighbouring stages leave: both go to the one that stays, in order
    assert pt.handover(one, [0]) == (Transfer(1, 0, 2, 4), Transfer(2, 0, 4, 6))
    # a replica stays in another VW: nothing to hand over
    assert pt.handover(LAY, [0, 3]) == ()


def test_the_gather_brings_virtual_worker_0_to_its_head() -> None:
    assert pt.gather(LAY) == (Transfer(1, 0, 3, 6),)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        Costs((1.0,), (1.0, 2.0), (1.0,))
    with pytest.raises(ValueError):
        pt.Settings(2, 4, schedule="zigzag")
    assert pt.decide([Candidate(0, 0.0)], costs([1.0]), S) is None


def test_a_looser_hysteresis_keeps_the_slots_through_speed_noise() -> None:
    """PipelineSettings.keep_within: VW 0 whole after VW 1 lost a member; the survivor of
    VW 1 measured twice as fast as VW 0's members (a loaded machine's swings). At 0.9 the
    fresh layout takes it (VW 0's kept packs lost); at 0.5 VW 0 keeps its slots and
    boundaries."""
    from trainer.pipeline.settings import PipelineSettings

    c = costs([1.0] * 8)
    members = [Candidate(0, 1.0, slot=(0, 0)), Candidate(1, 1.0, slot=(0, 1)),
               Candidate(2, 2.0, slot=(1, 1))]
    fresh = pt.decide(members, c, pt.Settings(2, 1), hint=(0, 4, 8))
    assert fresh is not None and fresh.vws != ((0, 1),)
    kept = pt.decide(members, c, pt.Settings(2, 1, keep_within=0.5), hint=(0, 4, 8))
    assert kept is not None and kept.vws == ((0, 1),) and kept.bounds == (0, 4, 8)
    with pytest.raises(ValueError, match="keep_within"):
        PipelineSettings(keep_within=0.0)
