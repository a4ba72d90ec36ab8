"""Zones, shards by size, shards on hosts (pure)."""

from __future__ import annotations

import random

import pytest

from trainer.hybrid.placement import (Placement, host_ranges, place, shard_hosts,
                                      zone_layout)


def _check_cover(sizes: list[int], pl: Placement) -> None:
    seen: dict[int, list[tuple[int, int]]] = {}
    for p in pl.pieces:
        assert 0 <= p.start < p.stop <= sizes[p.item]
        seen.setdefault(p.item, []).append((p.start, p.stop))
    for i, n in enumerate(sizes):
        spans = sorted(seen.get(i, []))
        covered = 0
        for a, b in spans:
            assert a == covered, f"item {i}: gap or overlap at {a}"
            covered = b
        assert covered == n
    assert [sum(p.size for p in pl.of(k)) for k in range(pl.shards)] == list(pl.loads)


def test_the_digits_cnn_on_two_shards_is_even_and_keeps_small_tensors_whole() -> None:
    # conv1 w/b, conv2 w/b, fc1 w/b, fc2 w/b, extras (flags, buffers, figures)
    sizes = [144, 16, 4608, 32, 32768, 64, 640, 10, 12]
    pl = place(sizes, 2)
    _check_cover(sizes, pl)
    assert pl.imbalance <= 1.001
    cut = {p.item for p in pl.pieces} - {i for i in range(len(sizes))
                                          if sum(q.item == i for q in pl.pieces) == 1}
    assert cut == {4}  # only the one tensor bigger than a shard's share is cut


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8])
def test_random_models_stay_within_the_tolerance(shards: int) -> None:
    rng = random.Random(shards)
    for _ in range(50):
        sizes = [rng.choice([rng.randint(1, 50), rng.randint(100, 5000),
                             rng.randint(10_000, 400_000)]) for _ in range(rng.randint(1, 30))]
        pl = place(sizes, shards, tolerance=0.05)
        _check_cover(sizes, pl)
        mean = sum(sizes) / shards
        assert max(pl.loads) <= max(-(-sum(sizes) // shards), mean * 1.05 + 1)


def test_whole_layers_round_robin_would_be_a_hotspot() -> None:
    """What placement by size avoids: layers dealt to shards in turn."""
    sizes = [144, 16, 4608, 32, 32768, 64, 640, 10, 12]
    naive = [0, 0]
    for i, n in enumerate(sizes):
        naive[i % 2] += n
    assert max(naive) * 2 / sum(naive) > 1.5
    assert place(sizes, 2).imbalance < 1.01


def test_zero_size_items_and_bad_arguments() -> None:
    pl = place([0, 5, 0], 2)
    _check_cover([0, 5, 0], pl)
    assert place([], 3).imbalance == 1.0
    for bad in (dict(shards=0), dict(tolerance=-0.1)):
        with pytest.raises(ValueError):
            place([1, 2], **{"shards": 2, **bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        place([1, -2], 2)


def test_zones_group_ranks_in_order_of_their_first_member() -> None:
    zl = zone_layout(["b", "a", "b", "", "a"], 5)
    assert zl.names == ("b", "a", "")
    assert zl.ranks == ((0, 2), (1, 4), (3,))
    assert zl.leaders == (0, 1, 3)
    assert zl.zone_of(4) == 1 and zl.leader(2) == 3
    assert zone_layout([], 3).ranks == ((0, 1, 2),)
    with pytest.raises(ValueError):
        zone_layout(["a"], 2)
    with pytest.raises(ValueError):
        zl.zone_of(9)


def test_host_ranges_cover_the_vector_once() -> None:
    sizes = [10, 300, 7, 45, 3]
    offsets = [0, 10, 310, 317, 362]
    for shards, zones in ((2, 2), (3, 2), (4, 3), (1, 1)):
        pl = place(sizes, shards)
        hosts = shard_hosts(shards, zones)
        covered = sorted(r for h in set(hosts) for r in host_ranges(pl, offsets, hosts, h))
        flat = [i for a, b in covered for i in range(a, b)]
        assert flat == list(range(sum(sizes)))
    assert shard_hosts(5, 2) == (0, 1, 0, 1, 0)
