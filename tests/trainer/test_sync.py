"""State sync over a real gloo group (two ranks in threads of this process): what travels."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.distributed import TCPStore

from trainer import batching, ring, sync


def _run_pair(fn0: Any, fn1: Any) -> list[Any]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out: list[Any] = [None, None]

    def run(rank: int, fn: Any) -> None:
        pg = ring.form_group(store, 1, rank, 2, 10.0, lambda: False)
        out[rank] = fn(pg)

    ts = [threading.Thread(target=run, args=(r, f)) for r, f in ((0, fn0), (1, fn1))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return out


def _trained_state(step: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    speed = batching.observe(batching.SpeedModel(), [batching.StepTiming("a/1", 16, 0.02)])
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "cursor": (2, 128), "rng": sync.rng_state(), "speed": speed,
            "sizes": {"a/1": 16}}


def test_fresh_joiner_receives_the_full_state() -> None:
    src = _trained_state(step=7)
    got = _run_pair(
        lambda pg: sync.sync_state(pg, 0, 2, 7, False, lambda: src, lambda: False),
        lambda pg: sync.sync_state(pg, 1, 2, 0, True, lambda: {}, lambda: False))
    (s0, src0, n0), (s1, src1, n1) = got
    assert src0 == src1 == 0 and n0 == n1 > 0
    for s in (s0, s1):
        assert s is not None and s["step"] == 7 and s["cursor"] == (2, 128)
        assert s["speed"] == src["speed"] and s["sizes"] == {"a/1": 16}
        assert torch.equal(s["model"]["weight"], src["model"]["weight"])
        exp = src["optimizer"]["state"][0]["exp_avg"]
        assert torch.equal(s["optimizer"]["state"][0]["exp_avg"], exp)
        assert torch.equal(s["rng"]["torch"], src["rng"]["torch"])


def test_the_member_with_the_newest_step_is_the_source() -> None:
    old, new = _trained_state(step=5), _trained_state(step=6)
    got = _run_pair(
        lambda pg: sync.sync_state(pg, 0, 2, 5, False, lambda: old, lambda: False),
        lambda pg: sync.sync_state(pg, 1, 2, 6, False, lambda: new, lambda: False))
    assert got[0][1] == got[1][1] == 1
    assert got[0][0]["step"] == 6


def test_nothing_travels_when_everyone_holds_the_same_step() -> None:
    st = _trained_state(step=3)
    got = _run_pair(
        lambda pg: sync.sync_state(pg, 0, 2, 3, False, lambda: st, lambda: False),
        lambda pg: sync.sync_state(pg, 1, 2, 3, False, lambda: st, lambda: False))
    assert got[0] == (None, 0, 0) and got[1] == (None, 0, 0)


def test_checksum_sees_every_parameter_bit() -> None:
    m = torch.nn.Linear(3, 3)
    c = sync.checksum(m)
    with torch.no_grad():
        m.bias[0] = torch.nextafter(m.bias[0], torch.tensor(10.0))
    assert sync.checksum(m) != c
