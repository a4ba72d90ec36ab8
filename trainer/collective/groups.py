"""One process group per generation, and collectives that can be abandoned.

Design: each generation ``n`` gets its own process group object, built directly as
``ProcessGroupGloo(PrefixStore(f"g{n}/", store), rank, world, timeout)`` (NCCL when the model
is on a GPU) over the coordinator's authenticated store (so only token holders take part in
its rendezvous), never the global default group: re-initialising the default group after a
failed collective hangs or fails (torch issues #55967, #119196). A group is destroyed off the
caller's path, by a reaper thread that drops the last reference (its destructor joins gloo's
threads, ~25 ms each): a generation that ended cleanly at once (:func:`release`); a broken
one (:func:`bury`) as soon as nobody else holds it or its process groups (a mode's machinery
or an exception's frames may keep them a while; then at the latest after ``GRAVE_S``), on a
thread of its own: its destructor waits, without the GIL (torch drops it there), for
collectives still queued on its threads, which end at once when a peer died and at the
collective timeout when one hangs; a destructor run on a caller's path would stall it that
long. So threads and sockets stay flat over any number of generations, broken ones included
(each gloo group holds 3 threads: 1,092 leaked generations held 554; kept 60 s after each
kill, a chaos run's worker grew by 9).

Waiting is abortable: :func:`wait` waits on the work in slices (``Work.wait(timeout)``, which
blocks in C++ without the GIL and leaves the work running when a slice runs out; a future
callback and a Python event cost ~0.5 ms more per step here) and, between slices, asks
``should_abort()`` (the caller checks the coordinator's ``broken/<n>`` counter). A
member whose neighbour died therefore stops waiting within one slice even when gloo itself
would block until its timeout. Group construction runs in a helper thread for the same
reason (a peer of the new generation may die before connecting).

An NCCL generation (:mod:`trainer.collective.nccl`) differs in three ways: its communicator
is created eagerly while the generation forms (a one-float all-reduce, polled against the
deadline: a peer lost before the first gradient bucket then breaks the forming, not
``backward()``); it meets over a :class:`~trainer.collective.nccl.NamespacedStore` rooted
at ``g<n>/nccl/``, so no key it writes (dump keys included) outlives the generation; and its
waits poll (:func:`trainer.collective.nccl.poll`) with a canary on the gloo control group.
The NCCL group's own timeout is the backstop of :func:`trainer.collective.nccl.backstop_s`.

Rule for callers: after :class:`GenerationBroken`, never use that group again; report the failure
and form the next generation (``Group.abort`` first: an NCCL communicator must be aborted before
anything touches the stream its collectives were enqueued on).
"""

from __future__ import annotations

import datetime
import heapq
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, Store

from trainer.collective import nccl as nc
from trainer.errors import GenerationBroken
from trainer.protocol.store_client import ControlStore

log = logging.getLogger(__name__)

GRAVE_S = 60.0  # a broken group is destroyed this long after it broke (6x the default
# collective timeout; a longer --collective-timeout only makes the reaper thread wait)
WAIT_SLICE_S = 0.05
_SLICE = datetime.timedelta(seconds=WAIT_SLICE_S)


def _unshared(entry: list[Any]) -> bool:
    """Does only the reaper's ``entry`` hold its object (and, for a :class:`Group`, its
    process groups)? Then dropping it destroys it on the reaper's side, never on a caller's
    path. Counted references: the entry's slot, the local name and :func:`sys.getrefcount`'s
    argument; a group's process group: each field of the group naming it and its slot in
    the tuple iterated here, the loop name and the argument."""
    obj = entry[3]
    if sys.getrefcount(obj) > 3:
        return False
    if isinstance(obj, Group):
        for pg in (obj.pg, obj.ctl):
            fields = (obj.pg is pg) + (obj.ctl is pg)
            if sys.getrefcount(pg) > 2 * fields + 2:
                return False
    return True


class _Reaper:
    """Drops references at their deadlines, or a buried one once :func:`_unshared`, on
    threads of its own (see the module docstring); :meth:`pending` counts those not dropped
    yet."""

    POLL_S = 0.1  # how often buried objects are checked for other holders

    def __init__(self) -> None:
        self._due: list[list[Any]] = []  # [deadline, seq, early, obj]; obj None once taken
        self._seq = 0
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._destroying = 0

    def add(self, obj: Any, after_s: float, *, early: bool = False) -> None:
        with self._cv:
            self._seq += 1
            heapq.heappush(self._due, [time.monotonic() + after_s, self._seq, early, obj])
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="spotring-reaper",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return sum(1 for e in self._due if e[3] is not None) + self._destroying

    def _take(self) -> list[Any]:
        """The entries to destroy now (the caller holds the lock): those due, and buried
        ones nobody else holds."""
        now, out = time.monotonic(), []
        while self._due and (self._due[0][0] <= now or self._due[0][3] is None):
            e = heapq.heappop(self._due)
            if e[3] is not None:
                out.append(e)
        for e in self._due:
            if e[2] and e[3] is not None and _unshared(e):
                out.append([e[0], e[1], e[2], e[3]])
                e[3] = None  # left in the heap (popped when it comes first), dropped here
        return out

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (taken := self._take()):
                    wait = None if not self._due else max(0.0, self._due[0][0] - time.monotonic())
                    if any(e[2] and e[3] is not None for e in self._due):
                        wait = self.POLL_S if wait is None else min(wait, self.POLL_S)
                    self._cv.wait(wait)
                self._destroying += len(taken)
            for e in taken:
                if e[2]:  # broken: its destructor may wait for a hung collective
                    threading.Thread(target=self._destroy, args=(e,), name="spotring-grave",
                                     daemon=True).start()
                else:
                    self._destroy(e)
            del taken, e

    def _destroy(self, entry: list[Any]) -> None:
        obj = entry.pop()
        try:
            del obj  # the last reference: the destructor joins the group's threads here
        except Exception:  # noqa: BLE001 - a destructor that fails frees what it can
            log.debug("destroying a group failed", exc_info=True)
        with self._cv:
            self._destroying -= 1


_REAPER = _Reaper()


def release(obj: Any) -> None:
    """Destroy a group (or store connection) whose generation ended cleanly (no collective
    in flight), off the caller's path. The caller must hold no other reference to it."""
    if obj is not None:
        _REAPER.add(obj, 0.0)


def bury(obj: Any) -> None:
    """Destroy a broken group (or its store connection) off any caller's path, on a thread
    of its own (its destructor may wait for a collective blocked until its timeout), as soon
    as nobody else holds it, at the latest after ``GRAVE_S``."""
    if obj is not None:
        _REAPER.add(obj, GRAVE_S, early=True)


def pending() -> int:
    """Groups (and connections) released or buried but not destroyed yet."""
    return _REAPER.pending()


def _run_abortable(fn: Callable[[], Any], should_abort: Callable[[], bool], what: str) -> Any:
    done = threading.Event()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e
        finally:
            done.set()

    t = threading.Thread(target=target, name=f"spotring-{what}", daemon=True)
    t.start()
    while not done.wait(WAIT_SLICE_S):
        if should_abort():
            raise GenerationBroken(f"{what}: aborted (the generation was declared broken)")
    if "error" in box:
        raise GenerationBroken(f"{what}: {box['error']}") from box["error"]
    return box["value"]


def make_nccl(store: Store, rank: int, world: int, timeout_s: float) -> Any:
    """An NCCL process group over ``store`` whose own timeout (the watchdog's) is
    ``timeout_s``. The one place an NCCL group is constructed: the tests' NCCL double
    (``tests/fakes/nccl.py``) replaces this function."""
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupNCCL(store, rank, world, opts)


def nccl_device() -> torch.device:
    """Where an NCCL group's tensors live: this process's current GPU (the CPU where none is:
    the NCCL double of the tests)."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class Group:
    """A generation's process groups and the store connection their rendezvous used (kept
    alive with them: NCCL reads the store again lazily, and pybind needs the Python object).

    ``pg`` carries the gradients (NCCL on GPUs, else gloo); ``ctl`` the small control
    collectives and the state transfer (always gloo, on CPU tensors; ``pg`` itself when that
    is gloo). ``timeout_s``: the deadline of a wait on ``pg`` (``--collective-timeout``).
    """

    pg: Any
    ctl: Any
    store: Any
    timeout_s: float = 0.0
    #: the Python store NCCL reads through (:class:`~trainer.collective.nccl.NamespacedStore`):
    #: ``ProcessGroupNCCL`` holds only its C++ half, and once the Python object is collected
    #: pybind's trampoline finds no ``set``/``get`` ("fn INTERNAL ASSERT FAILED ... Not
    #: implemented", seen on an H200): the communicator's lazy init then fails every time
    keep: Any = None

    @property
    def is_nccl(self) -> bool:
        """``pg`` is not gloo: its waits poll (:func:`trainer.collective.nccl.poll`)."""
        return self.pg is not self.ctl

    def watch(self) -> Watch:
        """How a wait on ``pg`` learns that the generation broke (see :class:`Watch`)."""
        return Watch(self.timeout_s, self.ctl if self.is_nccl else None)

    def abort(self) -> None:
        """Abort an NCCL communicator (a failed NCCL generation must never be left to hang
        until its timeout); gloo needs nothing. Closes the store connection."""
        if self.pg is not self.ctl and hasattr(self.pg, "abort"):
            try:
                self.pg.abort()
            except Exception:  # noqa: BLE001 - already failed: aborting is best effort
                log.debug("NCCL abort failed", exc_info=True)
        self.close()

    def close(self) -> None:
        """Close the rendezvous connection (the Python object stays, for pybind)."""
        if isinstance(self.store, ControlStore):
            self.store.close()


@dataclass(frozen=True)
class Watch:
    """What a wait on an NCCL collective checks besides ``should_abort()``: its deadline, and
    the generation's gloo group ``ctl`` on which a canary is posted beside the collective
    (None for gloo generations: gloo reports a dead peer itself)."""

    timeout_s: float
    ctl: Any = None

    def canary(self) -> Any:
        """Post the canary (every member at the same point); its work, or None."""
        return nc.canary(self.ctl)


GLOO_WATCH = Watch(0.0)


def form_group(
    store: Store,
    generation: int,
    rank: int,
    world: int,
    timeout_s: float,
    should_abort: Callable[[], bool],
    *,
    backend: str = "gloo",
    hostname: str | None = None,
    sub: str = "",
) -> Group:
    """Build generation ``generation``'s process groups (blocks until all ranks connect).

    The rendezvous runs under the prefix ``g<n>/`` of ``store`` over a connection of its own
    (``store.clone()``, when the store has one): a forming abandoned here may leave it blocked
    until its timeout, and it must not hold the caller's connection meanwhile. ``backend``
    ``nccl`` builds an NCCL group for the gradients plus a gloo group (prefix ``g<n>/ctl/``,
    timeout the NCCL backstop: its waits are abortable) for the control collectives, the
    state transfer and the canaries. ``hostname``: the address gloo
    listens on and advertises to its peers (default: gloo's, the address of this host's
    name). ``sub``: a sub-group of the generation (e.g. ``"s1/"``: its rendezvous runs under
    ``g<n>/s1/``, deleted with the generation's keys; ``rank`` and ``world`` are then the
    sub-group's). Returns the :class:`Group`. Raises :class:`GenerationBroken` when a peer does not
    connect within ``timeout_s`` or ``should_abort()`` turns true while waiting. An NCCL group
    is connected before this returns (eagerly: its first all-reduce runs here, polled).
    """
    conn = store.clone() if isinstance(store, ControlStore) else store
    prefix = PrefixStore(f"g{generation}/{sub}", conn)
    timeout = datetime.timedelta(seconds=timeout_s)
    keep: list[Any] = []  # the NCCL group's Python store: held as long as the group (Group.keep)

    def gloo(where: Store, limit: datetime.timedelta = timeout) -> Any:
        if hostname is None:
            return dist.ProcessGroupGloo(where, rank, world, limit)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = limit
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
        return dist.ProcessGroupGloo(where, rank, world, opts)

    def build() -> tuple[Any, Any]:
        if backend == "nccl":
            nc.apply_environment(timeout_s)
            # its waits are abortable; its own timeout is the backstop, so a canary may wait
            # out rank 0's evaluation (a dead peer still fails it within tens of ms)
            ctl = gloo(PrefixStore("ctl/", prefix),
                       datetime.timedelta(seconds=nc.backstop_s(timeout_s)))
            keep.append(nc.NamespacedStore(f"g{generation}/{sub}nccl/", conn))
            pg = make_nccl(keep[-1], rank, world, nc.backstop_s(timeout_s))
            return pg, ctl
        pg = gloo(prefix)
        return pg, pg

    what = f"form g{generation}"
    try:
        pg, ctl = _run_abortable(build, should_abort, what)
        if backend == "nccl":
            # eager: the communicator is created (a blocking init) here, in a helper thread,
            # and its first collective is polled against the deadline like every other
            one = torch.ones(1, device=nccl_device())
            work = _run_abortable(lambda: pg.allreduce([one]), should_abort, what)
            nc.poll(work, should_abort, f"{what}: the first NCCL all-reduce",
                    timeout_s=timeout_s, canary_work=nc.canary(ctl))
    except GenerationBroken:
        bury(conn)  # may still be blocked in the abandoned rendezvous: closing ends it
        if backend == "nccl" and "pg" in locals():
            failed = Group(pg, ctl, conn, keep=keep)
            failed.abort()
            bury(failed)  # its gloo group may hold the canary: never destroyed while running
        if isinstance(conn, ControlStore):
            conn.close()
        raise
    group = Group(pg, ctl, conn, timeout_s, keep=keep)
    if backend != "nccl":
        group.close()  # gloo's rendezvous is over; NCCL reads the store again lazily
    return group


def wait(work: Any, should_abort: Callable[[], bool], what: str, *, sliced: bool = True,
         watch: Watch = GLOO_WATCH, canary_work: Any = None) -> None:
    """Wait for ``work`` (a collective's handle) to finish, abandoning it on abort.

    ``sliced``: wait with ``Work.wait(timeout)`` slices (gloo: a slice that runs out leaves
    the work running); False: an NCCL work, polled (:func:`trainer.collective.nccl.poll`:
    never a blocking wait, whose future completes at enqueue) against ``watch.timeout_s``
    and ``canary_work`` (posted by the caller with ``watch.canary()``). Raises
    :class:`GenerationBroken` when the collective fails (a peer died, the timeout passed) or
    ``should_abort()`` turns true while waiting.
    """
    if not sliced:
        nc.poll(work, should_abort, what, timeout_s=watch.timeout_s or None,
                canary_work=canary_work)
        return
    while True:
        try:
            work.wait(_SLICE)  # blocks without the GIL; raises when the slice runs out
            return
        except Exception:  # noqa: BLE001 - a slice that ran out, or the collective failed
            if work.is_completed():
                break  # failed (or finished right after the slice ran out): ask below
        if should_abort():
            raise GenerationBroken(f"{what}: aborted (the generation was declared broken)")
    try:
        work.wait()  # returns at once: the work is completed
    except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError/DistBackendError
        raise GenerationBroken(f"{what}: {e}") from e


def allreduce(pg: Any, tensor: torch.Tensor, should_abort: Callable[[], bool]) -> None:
    """Sum ``tensor`` in place over the group. Raises :class:`GenerationBroken` on failure."""
    wait(pg.allreduce([tensor]), should_abort, "allreduce",
         sliced=isinstance(pg, dist.ProcessGroupGloo))


def send(pg: Any, tensors: list[tuple[torch.Tensor, int, int]],
         should_abort: Callable[[], bool]) -> None:
    """Send each ``(tensor, dst, tag)`` point-to-point, all posted at once, and wait for all.

    The waits run whole on a helper thread (bounded by the group's timeout): gloo closes the
    pair when a ``Work.wait(timeout)`` slice of a send or receive runs out, so the sliced wait
    of the collectives cannot serve here. Raises :class:`GenerationBroken` when a peer dies, the
    group's timeout passes, or ``should_abort()`` turns true while waiting.
    """
    wait_posted([(pg.send([t], dst, tag), dst) for t, dst, tag in tensors], should_abort)


def wait_posted(works: list[tuple[Any, int]], should_abort: Callable[[], bool]) -> None:
    """Wait for point-to-point works posted earlier, ``(work, peer)`` each, as :func:`send`
    waits (keep their tensors alive until this returns); a work already completed costs no
    helper thread. Raises :class:`GenerationBroken` as :func:`send`."""
    for work, peer in works:
        if work.is_completed():
            try:
                work.wait()  # returns at once (or raises the failure)
            except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError/DistBackendError
                raise GenerationBroken(f"send to or recv from rank {peer}: {e}") from e
        else:
            _run_abortable(work.wait, should_abort, f"send to or recv from rank {peer}")


def recv(pg: Any, tensor: torch.Tensor, src: int, tag: int,
         should_abort: Callable[[], bool]) -> None:
    """Receive ``tensor`` in place from rank ``src`` (waits as :func:`send`)."""
    _run_abortable(pg.recv([tensor], src, tag).wait, should_abort, f"recv from rank {src}")
