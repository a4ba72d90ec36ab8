"""Exactly-once elastic sampler: a global cursor over a seeded permutation per epoch.

Design: the data order of an epoch is ``randperm(N)`` drawn from a generator seeded with
``(seed, epoch)``, so every member computes the same order without communication. The only
state is ``(epoch, cursor)``; it travels inside the synced training state, so a joiner
continues exactly where the ring is. A step takes the next ``min(B, N - cursor)`` positions
(:meth:`CursorState.step_total`) and splits them, in rank order, by the members' local batch
sizes. A generation change only changes the split of what is left: nothing is skipped, nothing
repeats. The last step of an epoch is smaller than ``B`` (no sample is dropped); its sizes are
scaled down in proportion (:func:`scale_sizes`). A job's minimum local batch ``min_batch`` (2
with BatchNorm) is kept there too: each scaled size is 0 or at least the minimum, and
:meth:`CursorState.step_total` never leaves a last step smaller than the minimum when the epoch
has that many samples.

Rule for callers: advance the cursor (:meth:`CursorState.advance`) only when the step was
committed on every member; a discarded step leaves the cursor where it was, so its samples
are handed out again. Pass the same ``min_batch`` to ``step_total`` and ``scale_sizes`` as
to the batch planner.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CursorState:
    """Where the ring is in the data: epoch number and position in that epoch's order."""

    epoch: int = 0
    cursor: int = 0

    def step_total(self, dataset_size: int, global_batch: int, *, min_batch: int = 1) -> int:
        """Samples in the next step: ``B``, or what is left at the end of the epoch.

        With ``min_batch`` (``m``, the job's minimum local batch) no step of an epoch has
        fewer than ``m`` samples: when a full step would leave ``0 < r < m`` behind, this
        step takes ``B - (m - r)`` and the last one ``m`` (both at most ``B``, nothing
        skipped), or, when ``B - (m - r)`` would itself be below ``m`` (only if ``B < 2m``),
        all ``B + r`` at once (the one case where a step exceeds ``B``, by less than ``m``).
        Only an epoch of fewer than ``m`` samples still has a step below ``m``. ``m = 1`` is
        plain ``min(B, left)``. Raises ``ValueError`` naming ``min_batch`` (not an integer
        >= 1) or ``global_batch`` (below ``min_batch``).
        """
        lo = _check_positive_int("min_batch", min_batch)
        if global_batch < lo:
            raise ValueError(f"global_batch={global_batch!r}: smaller than min_batch={lo}")
        left = dataset_size - self.cursor
        if global_batch < left < global_batch + lo:
            return left - lo if left - lo >= lo else left
        return min(global_batch, left)

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


def scale_sizes(sizes: Sequence[int], total: int, *, min_batch: int = 1) -> list[int]:
    """Sizes proportional to ``sizes`` summing to ``total``, each 0 or at least ``min_batch``.

    Used for the short last step of an epoch (rank order in, rank order out). Largest
    remainder, ties by rank, on the grid ``{0, m, m+1, ...}`` (``m = min_batch``): a share of
    at least ``m`` starts from its floor and may take one more sample; a share below ``m``
    starts from 0 and may take ``m`` samples at once, its remainder being the fraction of
    ``m`` it reached. In order of remainder each member takes its step when enough samples
    are left, otherwise it is passed over; a member with size 0 always keeps 0. What is left
    after that (fewer than ``m`` samples) goes one at a time to the members holding a share,
    the one furthest below its proportional share first. So:

    - with ``total >= m * (members with a size)`` the result is proportional as far as the
      minimum allows (each size within ``m`` of its exact share); a member whose share
      falls well below ``m`` may get 0 rather than ``m`` (with ``m = 1`` exactly as plain
      largest remainder gives 0 to a share below 1);
    - with less, the samples go to at most ``total // m`` members, the largest first, each
      taking at least ``m`` (one member may take everything);
    - with ``0 < total < m`` one member, the one with the largest size (ties: the first in
      rank order), takes all of ``total``, which is still below ``m``. Nothing can do better
      here: a model that needs ``m`` samples (BatchNorm in training) cannot take this step,
      so the caller must keep a step's total from falling below ``min_batch`` (see
      :meth:`CursorState.step_total`) or let one member take it in a way the model accepts.

    ``min_batch = 1`` is plain largest remainder (the behaviour before the minimum existed).
    Members with size 0 in the result still run the step (no forward, a zero gradient) and
    join the collective. Raises ``ValueError`` naming the argument: ``sizes`` with a negative
    or non-integer entry or summing to 0, ``total`` negative or not an integer, ``min_batch``
    not an integer >= 1.
    """
    lo = _check_positive_int("min_batch", min_batch)
    sizes = [_check_count("sizes", x) for x in sizes]
    total = _check_count("total", total)
    full = sum(sizes)
    if full <= 0:
        raise ValueError(f"sizes {sizes} sum to {full}; need a positive total")
    if total == full and all(x == 0 or x >= lo for x in sizes):
        return list(sizes)
    exact = [x * total / full for x in sizes]
    out = [int(x) if x >= lo else 0 for x in exact]
    rem = [exact[i] - out[i] if exact[i] >= lo else exact[i] / lo for i in range(len(sizes))]
    rest = total - sum(out)
    for i in sorted(range(len(sizes)), key=lambda i: (-rem[i], i)):
        need = 1 if out[i] > 0 else lo
        if sizes[i] > 0 and need <= rest:
            out[i] += need
            rest -= need
    holders = [i for i in range(len(sizes)) if out[i] > 0]
    if rest and not holders:  # 0 < total < min_batch: the largest member takes it all
        out[min(range(len(sizes)), key=lambda i: (-sizes[i], i))] = rest
        return out
    while rest:  # fewer than min_batch left over: one at a time, most short of its share first
        i = min(holders, key=lambda i: (out[i] - exact[i], i))
        out[i] += 1
        rest -= 1
    return out


def _check_positive_int(name: str, x: object) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 1:
        raise ValueError(f"{name}={x!r}: must be an integer >= 1")
    return x


def _check_count(name: str, x: object) -> int:
    try:
        n = operator.index(x)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name}: {x!r} is not an integer number of samples") from None
    if n < 0:
        raise ValueError(f"{name}: {n} is negative; a number of samples is >= 0")
    return n


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
