"""NCCL's failure paths without a GPU: the double (tests/fakes/nccl.py) and the polled waits.

The double is checked first against the semantics it claims (a future done at enqueue, a
collective with a dead peer that never completes, a watchdog that ends the process after the
timeout unless the group was aborted, a dump key at the root of the store); then
:func:`trainer.collective.nccl.poll` and the groups' namespaced store are checked against it.
The ring over the double is tests/trainer/worker/test_nccl_ring.py.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.fakes.nccl import DUMP_KEY, FakeNCCL, root_of
from trainer.collective import groups
from trainer.collective import nccl as nc
from trainer.errors import GenerationBroken

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(120)

_PAIR = textwrap.dedent("""
    import os, sys, time, datetime, signal
    import torch, torch.distributed as dist
    from tests.fakes.nccl import FakeNCCL, DUMP_KEY
    from trainer.collective import nccl as nc
    from trainer.errors import GenerationBroken
    port, rank, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    store = dist.TCPStore("127.0.0.1", port, None, False,
                          timeout=datetime.timedelta(seconds=30))
    store.add("up", 1)
    while store.add("up", 0) < 2:          # both processes started (imports take seconds)
        time.sleep(0.01)
    pg = FakeNCCL(dist.PrefixStore("g1/", store), rank, 2, 3.0)
    t = torch.ones(2)
    pg.allreduce([t]).wait()             # the communicator forms; one collective completes
    assert t.tolist() == [2.0, 2.0]
    if rank == 1:
        store.set("ready", "1")
        time.sleep(60)                   # killed by the test
    store.wait(["dead"])                 # the test killed rank 1
    work = pg.allreduce([t])
    assert work.get_future().done()      # completed at enqueue
    time.sleep(0.3)
    assert not work.is_completed()       # gloo saw the dead peer; NCCL would never complete
    if mode == "abort":
        try:
            nc.poll(work, lambda: False, "allreduce", timeout_s=0.5)
        except GenerationBroken:
            pg.abort()
        time.sleep(4.0)                  # past the watchdog's timeout
        print("alive", store.check([DUMP_KEY]), flush=True)
        # as trainer/__main__.py: a broken gloo group may still hold threads, and the C++
        # destructors of a normal exit can end in std::terminate (SIGABRT, seen once in CI)
        os._exit(0)
    work.wait()                          # as the old code: blocks, the watchdog ends it
    print("unreachable", flush=True)
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["abort", "hang"])
def test_the_double_hangs_on_a_dead_peer_and_its_watchdog_kills_unless_aborted(mode: str) -> None:
    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)  # here: it outlives a killed child
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _PAIR, str(port), str(r), mode], env=env,
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for r in (0, 1)]
    try:
        store.wait(["ready"])
        procs[1].kill()
        procs[1].wait(30)
        store.set("dead", "1")
        out, err = procs[0].communicate(timeout=60)
        if mode == "abort":
            assert procs[0].returncode == 0, err.decode()[-2000:]
            assert out.decode().split() == ["alive", "False"]
        else:
            assert procs[0].returncode == -signal.SIGABRT, err.decode()[-2000:]
            assert b"watchdog" in err
            assert store.check([DUMP_KEY])  # at the root, past the g1/ prefix
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


class _Work:
    """A work whose completion the test sets (the protocol poll() reads)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.done = threading.Event()
        self.error = error

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self, *_: object) -> bool:
        if self.error is not None:
            raise self.error
        return True


def test_poll_returns_when_the_work_completes_and_breaks_on_abort_timeout_or_canary() -> None:
    w = _Work()
    threading.Timer(0.05, w.done.set).start()
    nc.poll(w, lambda: False, "x", timeout_s=30)
    with pytest.raises(GenerationBroken, match="declared broken"):
        nc.poll(_Work(), lambda: True, "x", timeout_s=30)
    with pytest.raises(GenerationBroken, match="within 0.2s"):
        nc.poll(_Work(), lambda: False, "x", timeout_s=0.2)
    dead = _Work(RuntimeError("Connection closed by peer"))
    dead.done.set()
    with pytest.raises(GenerationBroken, match="a peer is gone"):
        nc.poll(_Work(), lambda: False, "x", timeout_s=30, canary_work=dead)
    failed = _Work(RuntimeError("NCCL error"))
    failed.done.set()
    with pytest.raises(GenerationBroken, match="NCCL error"):
        nc.poll(failed, lambda: False, "x")


def test_a_generations_nccl_keys_and_dumps_stay_under_its_namespace() -> None:
    """F3: PyTorch writes the dump key at the root of the store it is given; a PrefixStore
    does not protect the root, the NamespacedStore does."""
    root = dist.HashStore()
    assert root_of(dist.PrefixStore("g1/", dist.PrefixStore("x/", root))) is root
    ns = nc.NamespacedStore("g1/nccl/", root)
    assert root_of(ns) is ns
    ns.set(DUMP_KEY, "0")
    assert root.check(["g1/nccl/" + DUMP_KEY]) and not root.check([DUMP_KEY])
    assert ns.add("n", 2) == 2 and root.add("g1/nccl/n", 0) == 2
    assert ns.check([DUMP_KEY]) and ns.get(DUMP_KEY) == b"0"


def test_the_environment_is_set_where_the_operator_did_not(monkeypatch) -> None:
    env = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    got = nc.apply_environment(10.0, env)
    assert got["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert got["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"  # the operator's value stands
    assert int(got["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) > nc.backstop_s(10.0) >= 100.0


def test_form_group_connects_nccl_eagerly_under_the_generations_namespace(monkeypatch) -> None:
    """Two ranks (threads) form an NCCL generation over the double: the communicator exists
    when form_group returns, its keys live under g<n>/nccl/, and a step's reduction sums."""
    monkeypatch.setattr(groups, "make_nccl", FakeNCCL)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    store = dist.HashStore()
    out: dict[int, groups.Group] = {}

    def form(rank: int) -> None:
        out[rank] = groups.form_group(store, 3, rank, 2, 20.0, lambda: False,
                                      backend="nccl", hostname="127.0.0.1")

    ts = [threading.Thread(target=form, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert set(out) == {0, 1}
    for g in out.values():
        assert g.is_nccl and g.pg._gloo is not None  # eager: connected while forming
        # NCCL holds its store's C++ half alone: the Python NamespacedStore lives on in the
        # Group, or torch's trampoline no longer finds its methods (seen on an H200)
        assert isinstance(g.pg.root, nc.NamespacedStore) and g.pg.root.prefix == "g3/nccl/"
        assert g.keep == [g.pg.root]
    tensors = {r: torch.full((3,), float(r + 1)) for r in (0, 1)}
    works = {r: out[r].pg.allreduce([tensors[r]]) for r in (0, 1)}
    for r in (0, 1):
        groups.wait(works[r], lambda: False, "x", sliced=False, watch=out[r].watch(),
                    canary_work=out[r].watch().canary())
        assert tensors[r].tolist() == [3.0, 3.0, 3.0]
    for g in out.values():
        g.abort()
        assert g.pg.aborted
