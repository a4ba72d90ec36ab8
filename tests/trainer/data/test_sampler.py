"""The exactly-once elastic sampler: every sample once per epoch whatever the splits."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.data.sampler import CursorState, epoch_order, scale_sizes, split


def test_every_sample_once_per_epoch_while_the_split_changes_every_step() -> None:
    n, b = 203, 16
    rng = random.Random(1)
    state = CursorState()
    seen: dict[int, Counter[int]] = {}
    while state.epoch < 3:
        world = rng.randint(1, 5)  # a generation change at every step
        cuts = sorted(rng.sample(range(1, b), world - 1)) if world > 1 else []
        sizes = [e - s for s, e in zip([0, *cuts], [*cuts, b], strict=True)]
        total = state.step_total(n, b)
        sizes = scale_sizes(sizes, total)
        assert sum(sizes) == total
        parts = split(epoch_order(7, state.epoch, n), state, sizes)
        c = seen.setdefault(state.epoch, Counter())
        for p in parts:
            c.update(p.tolist())
        state = state.advance(n, total)
    for epoch, c in seen.items():
        assert sorted(c) == list(range(n)), epoch
        assert set(c.values()) == {1}, epoch


def test_orders_are_seeded_per_epoch() -> None:
    assert torch.equal(epoch_order(3, 0, 50), epoch_order(3, 0, 50))
    assert not torch.equal(epoch_order(3, 0, 50), epoch_order(3, 1, 50))
    assert not torch.equal(epoch_order(3, 0, 50), epoch_order(4, 0, 50))


def test_scale_sizes_keeps_proportions_and_total() -> None:
    assert scale_sizes([10, 20, 34], 64) == [10, 20, 34]
    out = scale_sizes([10, 20, 34], 13)
    assert sum(out) == 13 and out[0] <= out[1] <= out[2]
    with pytest.raises(ValueError, match="positive total"):
        scale_sizes([0, 0], 5)


def test_advance_past_the_end_is_an_error() -> None:
    with pytest.raises(ValueError, match="past the end"):
        CursorState(0, 60).advance(64, 8)
    assert CursorState(0, 60).advance(64, 4) == CursorState(1, 0)


# -- a minimum local batch (BatchNorm needs more than one value per channel) ---------------


def _largest_remainder(sizes: list[int], total: int) -> list[int]:
    """The split before the minimum existed: plain largest remainder, ties by rank."""
    full = sum(sizes)
    exact = [s * total / full for s in sizes]
    out = [int(x) for x in exact]
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


sizes_st = st.lists(st.integers(0, 600), min_size=1, max_size=8).filter(lambda s: sum(s) > 0)


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_st, data=st.data(), min_batch=st.integers(1, 8))
def test_scale_sizes_gives_each_member_zero_or_at_least_the_minimum(sizes, data, min_batch):
    m, full = min_batch, sum(sizes)
    total = data.draw(st.one_of(st.integers(0, 3 * full), st.integers(0, 2 * m)), "total")
    out = scale_sizes(sizes, total, min_batch=m)
    assert sum(out) == total
    assert all(o == 0 for s, o in zip(sizes, out) if s == 0)  # no share, no samples
    holders = [i for i, o in enumerate(out) if o > 0]
    if 0 < total < m:  # nothing can do better: the largest member takes it all
        assert holders == [min(range(len(sizes)), key=lambda i: (-sizes[i], i))]
    else:
        assert all(o == 0 or o >= m for o in out)
        assert len(holders) <= total // m
    for i, j in itertools.permutations(range(len(sizes)), 2):  # larger size, no fewer samples
        if sizes[i] > sizes[j]:
            assert out[i] >= out[j]
    if total >= m * sum(1 for s in sizes if s > 0):  # proportional as far as m allows
        assert all(abs(o - s * total / full) < m for s, o in zip(sizes, out))


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_st, data=st.data())
def test_scale_sizes_with_minimum_one_is_plain_largest_remainder(sizes, data):
    total = data.draw(st.integers(0, 3 * sum(sizes)), "total")
    assert scale_sizes(sizes, total) == _largest_remainder(sizes, total)
    assert scale_sizes(sizes, total, min_batch=1) == _largest_remainder(sizes, total)


def test_scale_sizes_with_a_minimum_examples() -> None:
    # a straggler pinned at the minimum keeps it rather than dropping to 1 sample
    assert _largest_remainder([3, 100], 50) == [1, 49]
    assert scale_sizes([3, 100], 50, min_batch=2) == [2, 48]
    # fewer samples than 2 x members: two members take them, the first in rank order more
    assert scale_sizes([10, 10, 10], 5, min_batch=2) == [3, 2, 0]
    assert scale_sizes([2, 2, 2, 2], 6, min_batch=2) == [2, 2, 2, 0]
    # a tail of 3 over two BatchNorm members cannot be 2 + 1: one takes all three
    assert scale_sizes([64, 64], 3, min_batch=2) == [3, 0]
    # below the minimum: the largest member takes it all; members with size 0 keep 0
    assert scale_sizes([10, 30, 10], 1, min_batch=2) == [0, 1, 0]
    assert scale_sizes([0, 5, 5], 4, min_batch=3) == [0, 4, 0]
    assert scale_sizes([10, 10], 0, min_batch=2) == [0, 0]
    # a full step whose sizes already respect the minimum comes back unchanged
    assert scale_sizes([2, 7, 3], 12, min_batch=2) == [2, 7, 3]
    assert scale_sizes([1, 7, 4], 12, min_batch=2) == [0, 8, 4]


@pytest.mark.parametrize(
    "args, kwargs, word",
    [
        (([4, 4], 5), dict(min_batch=0), "min_batch"),
        (([4, 4], 5), dict(min_batch=1.5), "min_batch"),
        (([4, 4], 5), dict(min_batch=True), "min_batch"),
        (([4, -1], 3), {}, "sizes"),
        (([4, 2.5], 3), {}, "sizes"),
        (([4, 4], -1), {}, "total"),
        (([4, 4], 2.0), {}, "total"),
        (([0, 0], 5), {}, "positive total"),
    ],
)
def test_scale_sizes_nonsense_raises_value_error_naming_the_argument(args, kwargs, word) -> None:
    with pytest.raises(ValueError, match=word):
        scale_sizes(*args, **kwargs)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), b=st.integers(1, 40), m=st.integers(1, 6), seed=st.integers(0, 99))
def test_step_totals_never_leave_a_last_step_below_the_minimum(n, b, m, seed) -> None:
    """Every sample once per epoch, every step and every member's share at least the minimum
    (when the epoch has that many samples), no step above B (but for B < 2m, by less than
    m), while the split changes."""
    if b < m:
        with pytest.raises(ValueError, match="global_batch"):
            CursorState().step_total(n, b, min_batch=m)
        return
    rng = random.Random(seed)
    state = CursorState()
    seen = Counter[int]()
    while state.epoch < 1:
        total = state.step_total(n, b, min_batch=m)
        assert 0 < total <= (b if b >= 2 * m else b + m - 1)
        assert total >= m or n < m
        world = rng.randint(1, 5)
        sizes = scale_sizes([rng.choice([0, m, rng.randint(m, 3 * m)]) for _ in range(world)]
                            + [b], total, min_batch=m)
        assert sum(sizes) == total and all(s == 0 or s >= m for s in sizes) or n < m
        for p in split(epoch_order(7, state.epoch, n), state, sizes):
            seen.update(p.tolist())
        state = state.advance(n, total)
    assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}


def test_step_total_with_minimum_one_is_unchanged() -> None:
    for cursor in range(0, 64):
        assert CursorState(0, cursor).step_total(64, 10) == min(10, 64 - cursor)
        assert CursorState(0, cursor).step_total(64, 10, min_batch=1) == min(10, 64 - cursor)
    # 31 left with B = 30 and m = 2: 29 now, 2 in the last step (not 30 and 1)
    assert CursorState(0, 69).step_total(100, 30, min_batch=2) == 29
    assert CursorState(0, 98).step_total(100, 30, min_batch=2) == 2
    with pytest.raises(ValueError, match="min_batch"):
        CursorState().step_total(100, 30, min_batch=0)
