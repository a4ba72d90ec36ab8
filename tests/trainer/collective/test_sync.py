"""State sync over real gloo groups of two and three processes: what travels, and from whom."""

from __future__ import annotations

import io
from typing import Any

import torch

from tests.trainer.ringutil import _context
from trainer.collective import groups, sync
from trainer.data import batching
from trainer.protocol.store import StoreServer
from trainer.protocol.store_client import ControlStore
from trainer.state.training import rng_state

_TOKEN = b"sync-test"


def _rank(port: int, rank: int, world: int, step: int, fresh: bool, state_step: int | None,
          q: Any) -> None:
    store = ControlStore("127.0.0.1", port, _TOKEN)
    pg = groups.form_group(store, 1, rank, world, 30.0, lambda: False,
                         hostname="127.0.0.1").pg
    state = _trained_state(state_step) if state_step is not None else {}
    built = []

    def get_state() -> dict[str, Any]:
        built.append(rank)
        return state

    got, src, nbytes, _best = sync.sync_state(pg, rank, world, step, fresh, get_state,
                                              lambda: False)
    # The step's first all-reduce: members that received nothing must not have gone on
    # with a group the others cannot use.
    probe = torch.ones(1)
    groups.allreduce(pg, probe, lambda: False)
    assert probe.item() == world
    res = (got, src, nbytes, bool(built))
    buf = io.BytesIO()
    torch.save(res, buf)  # plain bytes: tensors in a queue would need the sender alive
    q.put((rank, buf.getvalue()))


def _run(*ranks: tuple[int, bool, int | None]) -> list[Any]:
    """Run sync_state on forked ranks, each (step, fresh, step of the state it holds).

    Returns each rank's ``(state, src, nbytes, built)``: ``built``, whether it serialised.
    """
    server = StoreServer("127.0.0.1", 0, _TOKEN)
    server.start()
    ctx = _context()
    q = ctx.Queue()
    ps = [ctx.Process(target=_rank, args=(server.address[1], r, len(ranks), *args, q))
          for r, args in enumerate(ranks)]
    for p in ps:
        p.start()
    out: list[Any] = [None] * len(ranks)
    for _ in ranks:
        rank, res = q.get(timeout=120)
        out[rank] = torch.load(io.BytesIO(res), weights_only=False)
    for p in ps:
        p.join(30)
    server.stop()
    return out


def _run_pair(r0: tuple[int, bool, int | None], r1: tuple[int, bool, int | None]
              ) -> list[Any]:
    return [res[:3] for res in _run(r0, r1)]


def _trained_state(step: int) -> dict[str, Any]:
    torch.manual_seed(0)
    import random

    random.seed(step)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    speed = batching.observe(batching.SpeedModel(), [batching.StepTiming("a/1", 16, 0.02)])
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "cursor": (2, 128), "rng": rng_state(), "speed": batching.speed_to_plain(speed),
            "sizes": {"a/1": 16}}


def test_fresh_joiner_receives_the_full_state() -> None:
    src = _trained_state(step=7)
    (s0, src0, n0), (s1, src1, n1) = _run_pair((7, False, 7), (0, True, None))
    assert src0 == src1 == 0 and n0 == n1 > 0
    assert s0 is None  # the source keeps what it has
    for s in (s1,):
        assert s is not None and s["step"] == 7 and s["cursor"] == (2, 128)
        assert s["speed"] == src["speed"] and s["sizes"] == {"a/1": 16}
        assert torch.equal(s["model"]["weight"], src["model"]["weight"])
        exp = src["optimizer"]["state"][0]["exp_avg"]
        assert torch.equal(s["optimizer"]["state"][0]["exp_avg"], exp)
        assert s["rng"]["python"] == src["rng"]["python"]


def test_the_member_with_the_newest_step_is_the_source() -> None:
    got = _run_pair((5, False, 5), (6, False, 6))
    assert got[0][1] == got[1][1] == 1
    assert got[0][0]["step"] == 6 and got[1][0] is None


def test_nothing_travels_when_everyone_holds_the_same_step() -> None:
    got = _run_pair((3, False, 3), (3, False, 3))
    assert got[0] == (None, 0, 0) and got[1] == (None, 0, 0)


def test_only_the_members_that_lack_the_step_receive_it() -> None:
    """Two members at step 7 and a joiner: the source sends to the joiner alone, point to
    point; the other member neither receives nor serialises anything."""
    src = _trained_state(step=7)
    (s0, src0, n0, b0), (s1, src1, n1, b1), (s2, src2, n2, b2) = _run(
        (7, False, 7), (7, False, 7), (0, True, None))
    assert src0 == src1 == src2 == 0
    assert (b0, b1, b2) == (True, False, False)
    assert s0 is None and s1 is None and n1 == 0
    assert n0 == n2 > 0  # one receiver: the source sent exactly what the joiner got
    assert s2["step"] == 7 and torch.equal(s2["model"]["weight"], src["model"]["weight"])


def test_after_a_failure_every_member_behind_gets_the_newest_step() -> None:
    """Rank 1 finished step 6 on its own (the others lost that all-reduce): the source is
    rank 1, and ranks 0 and 2 both receive its state, each the same bytes."""
    (s0, src0, n0, _), (s1, src1, n1, b1), (s2, src2, n2, _) = _run(
        (5, False, 5), (6, False, 6), (5, False, 5))
    assert src0 == src1 == src2 == 1 and b1
    assert s1 is None and s0["step"] == s2["step"] == 6
    assert n0 == n2 > 0 and n1 == n0 + n2
    assert torch.equal(s0["model"]["weight"], s2["model"]["weight"])
