"""Where things live in a hybrid generation: members in zones, parameters on shards, shards
on zone leaders. Pure: data in, data out, no I/O.

Design. **Zones** (:func:`zone_layout`): the members of a plan are grouped by the zone each
reported (``Plan.zones``; an unknown zone ``""`` is a zone of its own), zones ordered by
their first member's rank, members inside a zone in rank order. A zone's **leader** is its
lowest rank; it all-reduces with its zone like any member and also speaks for the zone across
zones. **Parameters on shards** (:func:`place`): the update a zone sends across zones is a
flat vector of items (each trainable parameter's gradient, and one item of extras: flags,
buffers, figures). Items go to shards by size, largest first, each whole on the least
loaded shard while that keeps the shard within ``tolerance`` of the mean (1901.05803's rule:
place by the resource each item uses, so no server's link is the bottleneck); an item too
large for that is cut, a piece filling the least loaded shard to the mean and the rest
placed the same way. Every shard then carries at most ``ceil(mean * (1 + tolerance))``
elements, so no shard is a hotspot, and most items stay whole. Cutting is always allowed:
the shards only carry the update, every replica reassembles it whole before its optimiser
runs (:mod:`trainer.hybrid.update`), so even per-tensor optimisers (LAMB) see whole tensors.
**Shards on hosts** (:func:`shard_hosts`): shard ``k`` is served by the leader of zone
``k mod Z``; with one shard per zone (the default) every zone serves the same load.

Rule for callers: every member computes these from the same plan and model and gets the
same answer; ranks, zones and shard numbers mean nothing outside the generation they were
computed for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ZoneLayout:
    """The zones of one generation: ``names[z]`` and its members' plan ranks ``ranks[z]``
    (ascending); zone 0 holds rank 0."""

    names: tuple[str, ...]
    ranks: tuple[tuple[int, ...], ...]

    def zone_of(self, rank: int) -> int:
        """The zone index of plan rank ``rank``. Raises ``ValueError`` for a stranger."""
        for z, members in enumerate(self.ranks):
            if rank in members:
                return z
        raise ValueError(f"rank {rank} is in no zone of this generation")

    def leader(self, zone: int) -> int:
        """The plan rank that speaks for ``zone`` across zones (its lowest rank)."""
        return self.ranks[zone][0]

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(r[0] for r in self.ranks)


def zone_layout(zones: Sequence[str], world: int) -> ZoneLayout:
    """Group ``world`` ranks by ``zones`` (one name per rank; empty: every rank in one zone).

    Raises ``ValueError`` when ``zones`` is neither empty nor one name per rank.
    """
    if world < 1:
        raise ValueError(f"world={world}: a generation has at least one member")
    if zones and len(zones) != world:
        raise ValueError(f"{len(zones)} zone names for {world} members")
    names: list[str] = []
    ranks: dict[str, list[int]] = {}
    for r in range(world):
        z = zones[r] if zones else ""
        if z not in ranks:
            names.append(z)
            ranks[z] = []
        ranks[z].append(r)
    return ZoneLayout(tuple(names), tuple(tuple(ranks[z]) for z in names))


@dataclass(frozen=True)
class Piece:
    """Elements ``[start, stop)`` of item ``item`` (its flat order), carried by ``shard``."""

    item: int
    start: int
    stop: int
    shard: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Placement:
    """Items on shards: every element of every item in exactly one :class:`Piece`.

    ``pieces`` are ordered by shard, then item, then start (the order a shard's slice is
    packed in); ``loads[k]`` is shard ``k``'s element count.
    """

    shards: int
    pieces: tuple[Piece, ...]
    loads: tuple[int, ...]

    def of(self, shard: int) -> tuple[Piece, ...]:
        """The pieces of ``shard``, in packing order."""
        return tuple(p for p in self.pieces if p.shard == shard)

    @property
    def imbalance(self) -> float:
        """Largest shard over the mean shard (1.0: perfectly even; 1.0 for an empty model)."""
        total = sum(self.loads)
        return max(self.loads) * self.shards / total if total else 1.0


def place(sizes: Sequence[int], shards: int, *, tolerance: float = 0.05) -> Placement:
    """Put items of ``sizes`` elements on ``shards`` shards by size (module docstring).

    Returns the :class:`Placement`; every shard carries at most
    ``ceil(total / shards * (1 + tolerance))`` elements. Items of size 0 get no piece.
    Raises ``ValueError`` for ``shards < 1``, a negative size or a negative tolerance.
    """
    if shards < 1:
        raise ValueError(f"shards={shards}: need at least one shard")
    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance}: must be >= 0")
    if any(s < 0 for s in sizes):
        raise ValueError(f"sizes {list(sizes)}: an item cannot have a negative size")
    total = sum(sizes)
    fill = math.ceil(total / shards)  # a cut fills a shard up to the mean
    cap = max(fill, math.ceil(total / shards * (1 + tolerance)))  # a whole item may go this far
    loads = [0] * shards
    pieces: list[Piece] = []
    for item in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        start, size = 0, sizes[item]
        while start < size:
            k = min(range(shards), key=lambda j: (loads[j], j))
            left = size - start
            take = left if loads[k] + left <= cap else fill - loads[k]
            # while elements are left, the least loaded shard is below the mean: take >= 1
            pieces.append(Piece(item, start, start + take, k))
            loads[k] += take
            start += take
    pieces.sort(key=lambda p: (p.shard, p.item, p.start))
    return Placement(shards, tuple(pieces), tuple(loads))


def shard_hosts(shards: int, zones: int) -> tuple[int, ...]:
    """The zone whose leader serves each shard: shard ``k`` on zone ``k mod zones``."""
    if shards < 1 or zones < 1:
        raise ValueError(f"shards={shards}, zones={zones}: both must be at least 1")
    return tuple(k % zones for k in range(shards))


def host_ranges(placement: Placement, offsets: Sequence[int], hosts: Sequence[int],
                host: int) -> tuple[tuple[int, int], ...]:
    """The ranges of the flat update vector a host's shards carry, in packing order.

    ``offsets[i]``: where item ``i`` starts in the flat vector; ``hosts``: from
    :func:`shard_hosts`. A host's message is these ranges concatenated.
    """
    out: list[tuple[int, int]] = []
    for k in range(placement.shards):
        if hosts[k] != host:
            continue
        for p in placement.of(k):
            a, b = offsets[p.item] + p.start, offsets[p.item] + p.stop
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)  # adjacent pieces travel as one range
            else:
                out.append((a, b))
    return tuple(out)


def host_shard_sizes(placement: Placement, hosts: Sequence[int], host: int
                     ) -> tuple[tuple[int, int], ...]:
    """``(shard, elements)`` of each shard ``host`` serves, in packing order."""
    return tuple((k, placement.loads[k]) for k in range(placement.shards) if hosts[k] == host)
