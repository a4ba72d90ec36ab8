"""A corpus in indexed shards: records read in contiguous ranges, still exactly once per epoch.

Design. A corpus too large for per-sample random access (token files, record files, a
bucket of parquet parts) is given as its shards' record counts and a reader
``read(shard, start, stop) -> records``. :class:`ShardedDataset` is a map-style dataset over
the concatenation (so the ring's global cursor, its re-splits at every generation change and
the exactly-once guarantee hold unchanged) whose :meth:`ShardedDataset.order` is the epoch's
order the job hands to ``Job.order``: the shards in a seeded order, each shard's records in
sequence. A member's share of a step is then a contiguous range of one or two shards; the
dataset reads ``chunk`` records at a time and serves the next requests from that chunk.

Rule for callers: ``Job(train_set=ds, order=ds.order, ...)``; ``read`` must return exactly
``stop - start`` records and be picklable when loader processes are used.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset


class ShardedDataset(Dataset):
    """Records of ``len(counts)`` shards (see the module docstring)."""

    def __init__(self, counts: Sequence[int], read: Callable[[int, int, int], Sequence[Any]],
                 *, chunk: int = 256) -> None:
        if not counts or any(int(c) < 0 for c in counts):
            raise ValueError(f"counts={list(counts)[:5]!r}: give each shard's record count "
                             "(>= 0), at least one shard")
        if chunk < 1:
            raise ValueError(f"chunk={chunk}: must be >= 1")
        self.counts = [int(c) for c in counts]
        self.offsets = [0]
        for c in self.counts:
            self.offsets.append(self.offsets[-1] + c)
        self.read, self.chunk = read, chunk
        self._cached: tuple[int, int, Sequence[Any]] | None = None  # shard, start, records

    def __len__(self) -> int:
        return self.offsets[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, record in shard)`` of global ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} outside 0..{len(self) - 1}")
        shard = bisect.bisect_right(self.offsets, index) - 1
        return shard, index - self.offsets[shard]

    def __getitem__(self, index: int) -> Any:
        shard, local = self.locate(int(index))
        c = self._cached
        if c is None or c[0] != shard or not c[1] <= local < c[1] + len(c[2]):
            stop = min(local + self.chunk, self.counts[shard])
            rows = self.read(shard, local, stop)
            if len(rows) != stop - local:
                raise ValueError(f"read({shard}, {local}, {stop}) returned {len(rows)} records, "
                                 f"expected {stop - local}")
            c = self._cached = (shard, local, rows)
        return c[2][local - c[1]]

    def order(self, seed: int, epoch: int, n: int) -> torch.Tensor:
        """The epoch's order for ``Job.order``: the shards in a seeded order, each one's
        records in sequence (every index once)."""
        if n != len(self):
            raise ValueError(f"order asked for {n} samples; this dataset has {len(self)}")
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
        parts = [torch.arange(self.offsets[s], self.offsets[s + 1])
                 for s in torch.randperm(len(self.counts), generator=g).tolist()]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)
