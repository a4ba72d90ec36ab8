"""Tickets, the staleness bound and the end of a generation (pure)."""

from __future__ import annotations

import random

from trainer.data.sampler import CursorState
from trainer.hybrid.staleness import (Sequencer, contiguous, cursor_after, end_update,
                                      may_compute)


def test_tickets_in_order_until_the_data_ends() -> None:
    seq = Sequencer(generation=3, next=5, end=8)
    got = []
    for _ in range(5):
        seq, t = seq.issue(3)
        got.append((t.version, t.final))
    assert got == [(5, None), (6, None), (7, None), (None, 8), (None, 8)]


def test_a_newer_generation_stops_every_zone_at_one_version() -> None:
    seq = Sequencer(generation=3, next=0, end=100)
    seq, a = seq.issue(3)
    seq, b = seq.issue(4)  # one leader saw generation 4
    seq, c = seq.issue(3)  # the others are told the same final, whatever they saw
    assert (a.version, b.version, b.final, c.version, c.final) == (0, None, 1, None, 1)
    assert c.newest == 4


def test_the_bound() -> None:
    assert may_compute(7, 7, 0) and not may_compute(8, 7, 0)
    assert may_compute(9, 7, 2) and not may_compute(10, 7, 2)


def test_contiguous_stops_at_the_first_gap() -> None:
    assert contiguous(4, {4, 5, 7}, 10) == 2
    assert contiguous(4, {5, 6}, 10) == 0
    assert contiguous(0, set(range(20)), 8) == 8


def test_end_update_is_the_walk_of_the_cursor_to_the_jobs_end() -> None:
    rng = random.Random(1)
    for _ in range(200):
        n, b = rng.randint(1, 300), rng.randint(1, 70)
        m = rng.randint(1, min(b, 4))
        epochs = rng.randint(1, 4)
        limit = rng.choice([None, rng.randint(0, 40)])
        step0 = rng.randint(0, 5)

        def ends(s: int, e: int) -> bool:
            return e >= epochs or (limit is not None and s >= limit)

        start = CursorState(rng.randint(0, epochs - 1), 0)
        start = cursor_after(start, rng.randint(0, 3), n, b, m)
        walk, c = step0, start
        while not ends(walk, c.epoch):
            c = cursor_after(c, 1, n, b, m)
            walk += 1
        assert end_update(start, step0, n, b, m, ends) == walk


def test_no_zone_waits_forever_in_a_simulated_run() -> None:
    """Zones of random speeds take tickets and wait for the bound: every ticket is
    computed, every update is applied at most s versions after its weights."""
    rng = random.Random(7)
    for s in (1, 2, 3):
        zones, end = 3, 60
        speed = [rng.uniform(0.2, 3.0) for _ in range(zones)]
        seq = Sequencer(1, 0, end)
        applied = 0
        done: dict[int, int] = {}  # version -> weights version it was computed on
        busy: dict[int, tuple[float, int, int]] = {}  # zone -> (finish time, ticket, base)
        held: dict[int, int | None] = {z: None for z in range(zones)}
        t = 0.0
        for _ in range(10_000):
            for z in range(zones):
                if z not in busy and held[z] is None:
                    seq, tk = seq.issue(1)
                    held[z] = tk.version
                v = held[z]
                if z not in busy and v is not None and may_compute(v, applied, s):
                    busy[z] = (t + 1 / speed[z], v, applied)
                    held[z] = None
            if not busy:
                break
            z = min(busy, key=lambda k: busy[k][0])
            t, v, base = busy.pop(z)
            done[v] = base
            while applied in done:
                assert applied - done[applied] <= s
                applied += 1
        assert applied == end, (s, applied)
