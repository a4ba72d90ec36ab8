"""The exchange of three zone leaders over real gloo point-to-point (threads of one
process): tickets, pushes and relays, the stop, the clean close, a malformed message."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from trainer.errors import ExchangeError
from trainer.hybrid.placement import place, shard_hosts
from trainer.hybrid.server import HEAD, PUSH, TAG_HEAD, Exchange
from trainer.hybrid.staleness import Sequencer

SIZES = [40, 30, 20, 10]
OFFSETS = [0, 40, 70, 90]
NUMEL = 100


def _groups(world: int) -> list[dist.ProcessGroupGloo]:
    store = dist.HashStore()
    out: list[dist.ProcessGroupGloo | None] = [None] * world

    def build(r: int) -> None:
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=20)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        out[r] = dist.ProcessGroupGloo(store, r, world, opts)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [g for g in out if g is not None]


def _until(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _exchanges(pgs: list[dist.ProcessGroupGloo], end: int) -> list[Exchange]:
    zones = len(pgs)
    pl = place(SIZES, zones)
    return [Exchange(pg, z, zones, NUMEL, pl, OFFSETS, shard_hosts(zones, zones), start=0, end=end,
                     sequencer=Sequencer(1, 0, end) if z == 0 else None,
                     p2p_timeout_s=30).start() for z, pg in enumerate(pgs)]


def _ticket(x: Exchange, newest: int = 1):  # type: ignore[no-untyped-def]
    x.request(newest)
    box = []
    _until(lambda: bool(box.append(x.ticket()) or box[-1] is not None))
    return box[-1]


def test_updates_reach_every_other_zone_whole_and_the_generation_closes_cleanly() -> None:
    xs = _exchanges(_groups(3), end=4)
    try:
        assert [_ticket(xs[z]).version for z in (1, 2, 0)] == [0, 1, 2]
        updates = {v: torch.randn(NUMEL) for v in range(3)}
        for v, z in ((0, 1), (1, 2), (2, 0)):
            xs[z].push(v, updates[v])
        for z, theirs in ((0, {0, 1}), (1, {1, 2}), (2, {0, 2})):
            _until(lambda z=z, theirs=theirs: xs[z].available() >= theirs)
            for v in theirs:
                assert torch.equal(xs[z].take(v), updates[v])
        assert _ticket(xs[1]).version == 3
        xs[1].push(3, torch.randn(NUMEL))
        stops = [_ticket(xs[z]) for z in (0, 1, 2)]
        assert {(t.version, t.final) for t in stops} == {(None, 4)}
        _until(lambda: all(x.close_ready(4) for x in xs))
        closers = [threading.Thread(target=x.close, args=(lambda p: _until(p),)) for x in xs]
        for t in closers:
            t.start()
        for t in closers:
            t.join(20)
        assert not any(t.is_alive() for t in closers)
        assert all(x.failed is None for x in xs)
        loads = place(SIZES, 3).loads
        per_shard = [xs[z].shard_bytes[z] / loads[z] for z in range(3)]
        assert max(per_shard) == min(per_shard) > 0  # each shard's load is its size
    finally:
        for x in xs:
            x.abandon()


def test_a_leader_that_saw_a_newer_generation_stops_the_others() -> None:
    xs = _exchanges(_groups(2), end=100)
    try:
        assert _ticket(xs[1]).version == 0
        stop = _ticket(xs[1], newest=2)
        assert (stop.version, stop.final, stop.newest) == (None, 1, 2)
        assert _ticket(xs[0]).final == 1
        assert not xs[0].close_ready(1)  # update 0 not served yet
        xs[1].push(0, torch.randn(NUMEL))
        _until(lambda: xs[0].close_ready(1) and xs[1].close_ready(1))
    finally:
        for x in xs:
            x.abandon()


def test_a_malformed_header_ends_the_generation_and_nothing_is_decoded() -> None:
    pgs = _groups(2)
    pl = place(SIZES, 2)
    x = Exchange(pgs[0], 0, 2, NUMEL, pl, OFFSETS, shard_hosts(2, 2), start=0, end=10,
                 sequencer=Sequencer(1, 0, 10), p2p_timeout_s=30).start()
    try:
        bad = torch.tensor([PUSH, 3, 1, 10**9, 0, 0], dtype=torch.int64)  # a huge body
        assert bad.numel() == HEAD
        pgs[1].send([bad], 0, TAG_HEAD).wait()
        _until(lambda: x.failed is not None)
        assert isinstance(x.failed, ExchangeError) and "push" in str(x.failed)
        with pytest.raises(ExchangeError):
            x.close(lambda p: _until(p, 5))
    finally:
        x.abandon()
