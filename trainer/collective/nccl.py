"""What an NCCL generation needs that gloo does not: polled waits, a canary, its own store root,
and the environment the NCCL backend is run with.

Design (read against PyTorch's ``ProcessGroupNCCL`` and torchft's process groups). NCCL's
failure semantics differ from gloo's in four ways that each can kill or wedge a survivor:

* **A collective's future completes when it is enqueued**, not when it finished, and
  ``Work.wait()`` only makes the current CUDA stream wait: the host then blocks in the next
  copy to the host, where nothing asks whether the generation broke. So a wait on an NCCL
  collective *polls* ``Work.is_completed()`` (a CUDA event query: it never blocks) against a
  deadline (``--collective-timeout``) and ``should_abort()``: :func:`poll`. The caller
  aborts the communicator (``Group.abort``) before anything touches the stream again.
* **A collective with a dead peer never completes** (NCCL does not see a closed socket the
  way gloo does). Each NCCL wait therefore carries a *canary*: a one-float all-reduce on the
  generation's gloo control group, posted at the same point of the step on every member.
  Gloo reports a peer process that died within tens of ms, and the canary's failure breaks
  the wait; a hung peer is found by the heartbeats (``should_abort``) or the deadline.
* **The watchdog kills the process** once a collective passed the group's timeout (with
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` on, the default). The group's own timeout is therefore a
  *backstop* (:func:`backstop_s`: well past the waits' deadline), so a wait always gives up and
  aborts first; the watchdog only ever fires on a process whose main thread is wedged, which
  is then fail-stop (better than a member that hangs the ring).
* **Dump and abort keys go to the root of the store**: ``ProcessGroupNCCL`` unwraps every
  ``PrefixStore`` (``getUnderlyingNonPrefixStore``) to write ``exception_dump`` there, and the
  heartbeat monitor of the first NCCL group of *any* process polls it and aborts itself. An
  NCCL group is therefore given a :class:`NamespacedStore`: a Python store (not a
  ``PrefixStore``, so it cannot be unwrapped) whose root is ``g<n>/``; every key of a
  generation, dump keys included, dies with the generation's keys.

:func:`environment` is the NCCL environment the worker relies on (set once, before the first
NCCL group, by :func:`apply_environment`; docs/trainer.md says why each value).

Rule for callers: never ``Work.wait()`` an NCCL collective and then read its result on the
host; :func:`poll` it, and on :class:`trainer.errors.GenerationBroken` abort the group before
touching the stream again.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import torch
from torch.distributed import Store

from trainer.errors import GenerationBroken

log = logging.getLogger(__name__)

ASK_EVERY_S = 0.05  # how often a poll asks should_abort() (a store round trip when stale)
POLL_MIN_S = 20e-6  # the first sleeps between polls: a collective that is nearly done
POLL_MAX_S = 1e-3  # the longest: a step's tail waits at most this long past completion
BACKSTOP_MIN_S = 300.0  # the NCCL group's own timeout (the watchdog's) is at least this
BACKSTOP_FACTOR = 10.0  # and at least this many collective timeouts


def backstop_s(collective_timeout_s: float) -> float:
    """The NCCL group's own timeout (the watchdog's) for a ``--collective-timeout``: far past
    the deadline of every wait, so a wait always aborts the group first (pure)."""
    return max(BACKSTOP_MIN_S, BACKSTOP_FACTOR * collective_timeout_s)


def environment(collective_timeout_s: float) -> dict[str, str]:
    """The NCCL environment a worker relies on (pure; docs/trainer.md "GPUs and NCCL"):

    * ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``: a collective past the backstop aborts the
      communicator and ends the process (fail-stop: the ring drops it) instead of hanging;
    * ``TORCH_NCCL_BLOCKING_WAIT=0``: ``wait()`` never blocks the host (the waits poll);
    * ``TORCH_NCCL_DUMP_ON_TIMEOUT=0``: a generation that fails is a revocation, not a bug to
      dump; the dump signal is also a store key other processes' monitors act on;
    * ``TORCH_NCCL_ENABLE_MONITORING=1`` with ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` past the
      backstop: a watchdog that is itself stuck (in an abort) ends the process.
    """
    backstop = backstop_s(collective_timeout_s)
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_BLOCKING_WAIT": "0",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(2 * backstop)),
    }


def apply_environment(collective_timeout_s: float,
                      env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :func:`environment` in ``env`` (default ``os.environ``) where the operator did not
    set a value. Call before the first NCCL group of the process (the backend reads it
    there). Returns the values in effect."""
    env = os.environ if env is None else env
    out = {}
    for k, v in environment(collective_timeout_s).items():
        out[k] = env.setdefault(k, v)
        if out[k] != v:
            log.warning("%s=%s set by the operator (spotring would use %s)", k, out[k], v)
    return out


class NamespacedStore(Store):
    """``store`` seen under ``prefix`` as its root (see the module docstring): every key an
    NCCL group writes, including those PyTorch writes "at the root", lands under ``prefix``.
    """

    def __init__(self, prefix: str, store: Any) -> None:
        super().__init__()
        self.prefix, self.store = prefix, store

    def _k(self, key: str) -> str:
        return self.prefix + key

    def set(self, key: str, value: Any) -> None:  # type: ignore[override]
        self.store.set(self._k(key), value)

    def get(self, key: str) -> bytes:  # type: ignore[override]
        return self.store.get(self._k(key))

    def add(self, key: str, amount: int) -> int:  # type: ignore[override]
        return self.store.add(self._k(key), amount)

    def check(self, keys: list[str]) -> bool:  # type: ignore[override]
        return self.store.check([self._k(k) for k in keys])

    def wait(self, keys: list[str], *args: Any) -> None:  # type: ignore[override]
        self.store.wait([self._k(k) for k in keys], *args)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:  # type: ignore[override]
        return self.store.compare_set(self._k(key), expected, desired)

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        return self.store.multi_get([self._k(k) for k in keys])

    def multi_set(self, keys: list[str], values: list[Any]) -> None:  # type: ignore[override]
        self.store.multi_set([self._k(k) for k in keys], values)

    def append(self, key: str, value: Any) -> None:  # type: ignore[override]
        self.store.append(self._k(key), value)

    def delete_key(self, key: str) -> bool:  # type: ignore[override]
        return self.store.delete_key(self._k(key))

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the trampoline's C++ name
        return self.delete_key(key)

    def num_keys(self) -> int:  # type: ignore[override]
        return self.store.num_keys()

    def getNumKeys(self) -> int:  # noqa: N802 - the trampoline's C++ name
        return self.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:  # type: ignore[override]
        self.store.set_timeout(timeout)


def canary(ctl: Any) -> Any:
    """Post the canary on the generation's gloo group ``ctl`` (see the module docstring);
    every member posts it at the same point. Returns its work (None without ``ctl``)."""
    if ctl is None:
        return None
    return ctl.allreduce([torch.zeros(1)])


def poll(work: Any, should_abort: Callable[[], bool], what: str, *,
         timeout_s: float | None = None, canary_work: Any = None,
         clock: Callable[[], float] = time.monotonic) -> None:
    """Wait for an NCCL ``work`` by polling ``is_completed()``; never blocks the host.

    Raises :class:`GenerationBroken` when the collective failed, ``canary_work`` failed (a
    peer process died), ``should_abort()`` turned true, or ``timeout_s`` passed. Returns once
    the work completed (its result is then on the device: a copy to the host does not block
    on a peer).
    """
    start = clock()
    next_ask = start + ASK_EVERY_S
    delay = 0.0
    while not work.is_completed():
        now = clock()
        if canary_work is not None and canary_work.is_completed():
            try:
                canary_work.wait()
            except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError/DistBackendError
                raise GenerationBroken(f"{what}: a peer is gone ({e})") from e
            canary_work = None  # every member reached this point: the peers are alive
        if now >= next_ask:
            if should_abort():
                raise GenerationBroken(f"{what}: aborted (the generation was declared broken)")
            next_ask = now + ASK_EVERY_S
        if timeout_s is not None and now - start > timeout_s:
            raise GenerationBroken(f"{what}: not completed within {timeout_s:g}s "
                                   "(--collective-timeout)")
        time.sleep(delay)
        delay = min(POLL_MAX_S, max(POLL_MIN_S, 2 * delay))
    try:
        work.wait()  # completed: returns at once, or raises the collective's error
    except Exception as e:  # noqa: BLE001 - NCCL raises DistBackendError
        raise GenerationBroken(f"{what}: {e}") from e
