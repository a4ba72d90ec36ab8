"""The exactly-once elastic sampler: every sample once per epoch whatever the splits."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from trainer.sampler import CursorState, epoch_order, scale_sizes, split


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
