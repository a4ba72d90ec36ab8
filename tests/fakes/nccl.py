"""A process group that behaves as ``ProcessGroupNCCL`` on the failure paths, on CPU.

Design: :class:`FakeNCCL` computes with a real gloo group (so the sums are real and a peer's
death is real), and wraps it in the semantics of PyTorch's NCCL backend that spotring must
survive (read against ``ProcessGroupNCCL.cpp``):

* **lazy, blocking communicator init**: the gloo group is built inside the first collective
  (``ncclCommInitRank`` runs in the caller's thread and blocks until every rank arrives);
* **futures complete at enqueue**: ``get_future()`` is done at once;
* **``wait()`` gives no control back**: on a GPU it only makes the stream wait, and the host
  then blocks in the next copy of the result; the double's ``wait()`` stands for that pair and
  blocks until the collective completed (forever with a dead peer, unless aborted);
* **a collective with a dead peer never completes**: gloo's error is swallowed,
  ``is_completed()`` stays False;
* **the watchdog**: a collective pending past the group's timeout writes the dump key
  ``exception_dump`` at the *root* of the store (every ``PrefixStore`` unwrapped, as
  ``getUnderlyingNonPrefixStore``) when ``TORCH_NCCL_DUMP_ON_TIMEOUT`` is on, and ends the
  process (``os.abort()``: SIGABRT, as the watchdog's uncaught exception) unless
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is 0 or the group was aborted;
* **the heartbeat monitor** of the first group of a process polls that root key and ends the
  process when it appears (``TORCH_NCCL_DUMP_ON_TIMEOUT`` on);
* **abort()**: pending works complete with an error; nothing kills the process any more.

:func:`install` puts it in place of ``trainer.collective.groups.make_nccl`` and makes the
worker describe its device as a GPU of its own, so the coordinator plans NCCL generations:
the real member code then runs NCCL's paths in CI.

Rule: tests only; one double per process group; ``install()`` before the worker starts.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

DUMP_KEY = "exception_dump"
WATCHDOG_EVERY_S = 0.05
MONITOR_EVERY_S = 0.2
_FIRST: list[FakeNCCL] = []  # the process's first group: the one whose monitor polls


def root_of(store: Any) -> Any:
    """The store under every ``PrefixStore`` (``getUnderlyingNonPrefixStore``)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _env_on(name: str, default: str) -> bool:
    return os.environ.get(name, default) not in ("0", "")


class FakeWork:
    """One collective of the double (see the module docstring)."""

    def __init__(self, group: FakeNCCL, inner: Any, tensors: list[torch.Tensor]) -> None:
        self.group, self.inner, self.tensors = group, inner, tensors
        self.started = time.monotonic()
        self.aborted = False

    def _ok(self) -> bool:
        if not self.inner.is_completed():
            return False
        try:
            self.inner.wait()
        except Exception:  # noqa: BLE001 - a dead peer: NCCL would never complete
            return False
        return True

    def is_completed(self) -> bool:
        return self.aborted or self._ok()

    def is_success(self) -> bool:
        return not self.aborted and self._ok()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """The stream wait plus the host's next read of the result: blocks until done."""
        while not self._ok():
            if self.aborted:
                raise RuntimeError("NCCL communicator was aborted")
            time.sleep(0.001)
        return True

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self.tensors)  # completed at enqueue
        return fut


def _held_as_nccl_holds(store: Any) -> Any:
    """A getter of ``store`` that keeps a store written in Python only weakly (NCCL holds the
    C++ half alone); a store of torch's own (TCPStore, HashStore) strongly."""
    if type(store).__module__.startswith("torch"):
        return lambda: store
    ref = weakref.ref(store)

    def get() -> Any:
        got = ref()
        if got is None:  # what the trampoline says when the Python object is gone
            raise RuntimeError("fn INTERNAL ASSERT FAILED (the double): Not implemented.")
        return got

    return get


class FakeNCCL:
    """A process group with NCCL's failure semantics over a real gloo group (module
    docstring). ``timeout_s``: the group's timeout (the watchdog's)."""

    def __init__(self, store: Any, rank: int, world: int, timeout_s: float) -> None:
        # NCCL holds only the C++ half of its store: a store written in Python (the
        # generation's NamespacedStore) answers only while its caller holds the Python object,
        # else torch's trampoline fails ("fn INTERNAL ASSERT FAILED ... Not implemented", as
        # on an H200); the double holds it the same way, through a C++ PrefixStore
        self.store = dist.PrefixStore("fake-nccl", store)
        self._rank, self._world, self.timeout_s = rank, world, timeout_s
        self._root = _held_as_nccl_holds(root_of(store))
        self._gloo: Any = None
        self._pending: list[FakeWork] = []
        self._lock = threading.Lock()
        self.aborted = False
        self.dumped = False
        threading.Thread(target=self._watchdog, daemon=True, name="fake-nccl-watchdog").start()
        if not _FIRST:
            _FIRST.append(self)
            threading.Thread(target=self._monitor, daemon=True,
                             name="fake-nccl-monitor").start()

    @property
    def root(self) -> Any:
        """The store under every prefix, where the watchdog writes its dump."""
        return self._root()

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._world

    def _comm(self) -> Any:
        if self.aborted:
            raise RuntimeError("NCCL communicator was aborted")
        if self._gloo is None:  # ncclCommInitRank: blocks until every rank arrived
            # gloo's own timeout only bounds the rendezvous and the transport here: the
            # watchdog (timeout_s) is what ends a pending collective, as in NCCL
            self._gloo = dist.ProcessGroupGloo(self.store,
                                               self._rank, self._world,
                                               datetime.timedelta(seconds=max(60.0,
                                                                              self.timeout_s)))
        return self._gloo

    def allreduce(self, tensors: list[torch.Tensor], *args: Any) -> FakeWork:
        inner = self._comm().allreduce(tensors)
        work = FakeWork(self, inner, tensors)
        with self._lock:
            self._pending = [w for w in self._pending if not w._ok()] + [work]
        return work

    def send(self, *args: Any) -> Any:
        raise NotImplementedError("the NCCL double carries all-reduces only")

    recv = send

    def abort(self) -> None:
        self.aborted = True
        with self._lock:
            for w in self._pending:
                w.aborted = True
            self._pending.clear()

    def _watchdog(self) -> None:
        while not self.aborted:
            time.sleep(WATCHDOG_EVERY_S)
            with self._lock:
                late = [w for w in self._pending if not w.aborted and not w._ok()
                        and time.monotonic() - w.started > self.timeout_s]
            if late and not self.aborted:
                if _env_on("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"):
                    self.root.set(DUMP_KEY, str(self._rank))
                    self.dumped = True
                if _env_on("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"):
                    os.write(2, b"[fake NCCL] watchdog: collective timed out; terminating\n")
                    os.abort()
                return

    def _monitor(self) -> None:
        if not _env_on("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"):
            return
        while True:
            time.sleep(MONITOR_EVERY_S)
            try:
                seen = self.root.check([DUMP_KEY])
            except Exception:  # noqa: BLE001 - the store went away: nothing to poll
                return
            if seen:
                os.write(2, b"[fake NCCL] monitor: a dump was signalled; terminating\n")
                os.abort()


def install() -> None:
    """Use the double for every NCCL group of this process and describe this worker's device
    as a GPU of its own (the coordinator then plans NCCL generations)."""
    from trainer.collective import groups
    from trainer.worker import devices

    groups.make_nccl = FakeNCCL
    devices.describe = lambda device: f"cuda:fake-{os.getpid()}"
