"""Exactly-once elastic sampler: a global cursor over a seeded permutation per epoch.

Design: the data order of an epoch is ``randperm(N)`` drawn from a generator seeded with
``(seed, epoch)``, so every member computes the same order without communication. The only
state is ``(epoch, cursor)``; it travels inside the synced training state, so a joiner
continues exactly where the ring is. A step takes the next ``min(B, N - cursor)`` positions
and splits them, in rank order, by the members' local batch sizes. A generation change only
changes the split of what is left: nothing is skipped, nothing repeats. The last step of an
epoch is smaller than ``B`` (no sample is dropped); its sizes are scaled down in proportion.

Rule for callers: advance the cursor (:meth:`CursorState.advance`) only when the step was
committed on every member; a discarded step leaves the cursor where it was, so its samples
are handed out again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CursorState:
    """Where the ring is in the data: epoch number and position in that epoch's order."""

    epoch: int = 0
    cursor: int = 0

    def step_total(self, dataset_size: int, global_batch: int) -> int:
        """Samples in the next step: ``B``, or what is left at the end of the epoch."""
        return min(global_batch, dataset_size - self.cursor)

    def advance(self, dataset_size: int, taken: int) -> CursorState:
        """The state after a committed step that consumed ``taken`` samples."""
        cursor = self.cursor + taken
        if cursor > dataset_size:
            raise ValueError(f"cursor {cursor} past the end of the epoch ({dataset_size})")
        if cursor == dataset_size:
            return CursorState(self.epoch + 1, 0)
        return CursorState(self.epoch, cursor)


def epoch_order(seed: int, epoch: int, dataset_size: int) -> torch.Tensor:
    """The sample order of ``epoch``: a permutation of ``range(dataset_size)``, seeded."""
    g = torch.Generator()
    g.manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(dataset_size, generator=g)


def scale_sizes(sizes: Sequence[int], total: int) -> list[int]:
    """Sizes proportional to ``sizes`` summing to ``total`` (largest remainder, ties by rank).

    Used for the short last step of an epoch. ``sizes`` must sum to a positive number.
    """
    full = sum(sizes)
    if full <= 0:
        raise ValueError(f"sizes {list(sizes)} sum to {full}; need a positive total")
    if total == full:
        return list(sizes)
    exact = [s * total / full for s in sizes]
    out = [int(x) for x in exact]
    rest = total - sum(out)
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:rest]:
        out[i] += 1
    return out


def split(order: torch.Tensor, state: CursorState, sizes: Sequence[int]) -> list[torch.Tensor]:
    """The sample ids each rank takes in the next step (rank order), from ``order``.

    ``sizes`` are the local batches in rank order for this step (already scaled to the
    step's total). Returns one tensor of ids per rank; together they are exactly the
    positions ``cursor .. cursor + sum(sizes)`` of the epoch's order.
    """
    out: list[torch.Tensor] = []
    start = state.cursor
    for s in sizes:
        out.append(order[start : start + s])
        start += s
    if start > len(order):
        raise ValueError(f"split past the end of the epoch: {start} > {len(order)}")
    return out
