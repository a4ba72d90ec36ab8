"""A member's input pipeline: sample ids in, a collated batch on the device out.

What it is for. The elastic sampler (:mod:`trainer.data.sampler`) decides which sample ids a member
takes in a step; :class:`Feed` turns those ids into the batch the model eats, with exactly a
``torch.utils.data.DataLoader``'s semantics (``default_collate``, or the job's own
``collate_fn``, of ``[dataset[i] for i in ids]``: a ``(1,)``-shaped target stays ``(b, 1)``,
scalar ints become a ``(b,)`` long tensor, dicts, tuples and numpy arrays behave as in a
DataLoader) and, for a dataset read from disk, without stalling the step.

Design. A plain DataLoader iterates a sampler it owns; the ring's order is decided step by step
(a generation change re-splits, batch sizes adapt, an epoch ends), so here the DataLoader's
batch sampler is a *request queue*: :meth:`Feed.hint` (the caller's guess of its next batch)
and :meth:`Feed.batch` (the ids it needs now) put requests of sample ids on it, a real
``DataLoader`` with ``workers`` processes and ``prefetch`` requests per worker reads them, and
a feeder thread iterates the DataLoader and files every loaded sample in a cache by id.
``batch()`` takes what the cache holds, requests the rest at the front of the queue, waits,
and collates in the calling thread; once every sample of the newest hint is loaded, the feeder
thread collates (and on CUDA pins) that batch ahead, so a ``batch()`` of exactly the hinted ids
only moves it to the device. A wrong hint costs work, never correctness: samples are keyed by
id, and a sample nobody asks for is dropped ``_KEEP_TICKS`` hint/batch calls later.

The deadlock designed around. DataLoader's multiprocessing iterator asks the batch sampler for
the next request when it *delivers* a batch (to keep ``prefetch * workers`` requests out), so
a sampler that blocks until the caller asks for more holds back the very batch the caller is
waiting for. The sampler here blocks only when no real request is outstanding: while one is
(``_owed > 0``, counted from the moment a request is handed to the DataLoader until the feeder
has filed its samples) and nothing is queued, it hands out an empty no-op request. With
DataLoader's in-order delivery (its default) a no-op is asked for only when a batch is
delivered, so they cannot spin: at most about ``prefetch * workers`` per real request, each a
cheap round trip through an idle worker. The first ``prefetch * workers`` requests (asked for
while the iterator is created) are no-ops too, so creating it never blocks.

Transport. A worker sends its samples to this process packed: every plain CPU tensor of a
request goes into one shared-memory buffer (one file descriptor), the rest of the sample is
pickled as usual, and this process rebuilds the samples as views of the buffer. Shipping each
sample's tensors as they are (a descriptor and a socket round trip per tensor) cost this
process 9 ms of CPU per batch of 32 samples of 3x32x32 here and 50-90 ms at 3x224x224; packed,
1.4 and 2.4 ms (plus the collate's one copy of the batch). Collating in the worker, as a
DataLoader does, is not possible: a batch is assembled from several requests (hint, re-split).

Errors. An exception raised by ``dataset[i]`` travels (as the DataLoader's own
``ExceptionWrapper``) as that sample's result, so ``batch()`` raises the original exception
type with the sample id in the message, only when that id is asked for, and the feed goes on.
A worker process that dies, or a DataLoader failure, makes every later ``batch()`` raise
:class:`FeedError`; a wait longer than ``timeout_s`` raises :class:`FeedError` too. Nothing
hangs: the workers' liveness is checked every ``_POLL_S`` while ``batch()`` waits.

A ``TensorDataset`` with the default collate is indexed directly (the result equals
``default_collate``'s, a list of tensors) and needs no workers; ``workers=0`` reads in the
calling thread (no processes, ``hint`` does nothing), with the same results.

Rule for callers: one thread owns a :class:`Feed` (``hint``, ``batch`` and ``close`` are not
safe to call concurrently); call :meth:`Feed.hint` with the ids of the *next* step as soon as
the current step's ids are known (right after ``batch()``, before the forward pass), and
:meth:`Feed.close` (or use it as a context manager) when done, so no process or thread is left.
"""

from __future__ import annotations

import collections
import functools
import logging
import multiprocessing
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    TensorDataset,
    default_collate,
)

from trainer.data.loader import Failure, Keyed, pack, read_samples, unpack
from trainer.errors import FeedError

__all__ = ["Feed", "FeedError"]

log = logging.getLogger(__name__)

# A sample hinted (or asked for) this many hint/batch calls ago and not taken since is dropped
# from the cache. The loop hints one step ahead (2 calls per step), so 8 keeps a hint alive for
# ~4 steps: enough for a hint two steps ahead, and bounds the cache at a few batches.
_KEEP_TICKS = 8
# How often batch() checks that the worker processes are alive while it waits.
_POLL_S = 0.1
# The DataLoader's timeout: how often the feeder thread, waiting for a read, comes back to see
# whether the feed was closed (and DataLoader whether a worker died). A read may take longer.
_DL_POLL_S = 0.5
# How long close() waits for the feeder thread (a worker stuck in a read takes DataLoader 5 s).
_CLOSE_S = 10.0
# Tensors in a packed request start at multiples of this many bytes (any dtype's alignment).


IdsLike = Sequence[int] | torch.Tensor


class Feed:
    """A member's batches: sample ids in, a collated batch on the device out.

    ``dataset``: any map-style dataset (``IterableDataset`` is refused: the ring needs random
    access by id). ``device``: where ``batch()`` puts the batch (CUDA: via pinned host memory
    and non-blocking copies). ``collate_fn``: ``None`` for ``default_collate``, else called
    with the list of samples as a DataLoader would. ``workers``: DataLoader worker processes
    (``None``: 2; a ``TensorDataset`` with the default collate is always indexed in memory,
    without workers, and with a ``collate_fn`` defaults to 0). ``prefetch``:
    requests outstanding per worker (DataLoader's ``prefetch_factor``). ``timeout_s``: the
    longest ``batch()`` waits for its samples. ``mp_context``: the workers' start method
    (``None``: ``fork`` where there is one, whatever this process's default: millisecond
    starts, the dataset shared copy-on-write, and no server process left behind; a ring worker
    started by a forkserver inherits that default and would start a forkserver of its own.
    Everything sent to the workers is module-level and picklable, so ``"spawn"`` and
    ``"forkserver"`` work too, with slower starts).

    The constructor starts the workers (the slow start a joiner does before joining) and
    returns when they are started. Raises ``TypeError`` for an iterable dataset, ``ValueError``
    for a negative ``workers`` or a ``prefetch`` below 1, :class:`FeedError` when the workers
    cannot start.
    """

    def __init__(self, dataset: Dataset, *, device: torch.device | str = torch.device("cpu"),
                 collate_fn: Callable[[list[Any]], Any] | None = None,
                 workers: int | None = None, prefetch: int = 2, timeout_s: float = 120.0,
                 mp_context: str | None = None) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError("Feed needs a map-style dataset (dataset[i]); an IterableDataset "
                            "cannot be read by sample id")
        if workers is not None and workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._dataset = dataset
        self._collate = collate_fn or default_collate
        self._fast = isinstance(dataset, TensorDataset) and collate_fn is None
        if workers is None:
            workers = 0 if isinstance(dataset, TensorDataset) else 2
        self.workers = 0 if self._fast else workers
        self._timeout_s = timeout_s
        self._closed = False
        self._loader: _Loader | None = None
        if self.workers > 0:
            prepare = functools.partial(_collate_and_pin, self._collate, self.device)
            self._loader = _Loader(dataset, self.workers, prefetch, mp_context, prepare,
                                   self.device)
            # A Feed dropped without close() still stops its workers (at collection or exit).
            self._finalizer = weakref.finalize(self, self._loader.close)

    # -- the caller's API ------------------------------------------------------------------

    def hint(self, ids: IdsLike) -> None:
        """Start loading these sample ids in the background (the caller's guess of its next
        batch); never blocks. A wrong guess wastes work only. Does nothing without workers
        (``workers=0``, a ``TensorDataset``) or once the feed is closed or broken."""
        if self._loader is not None and not self._closed:
            self._loader.hint(_as_ids(ids))

    def batch(self, ids: IdsLike) -> Any:
        """The collated batch of exactly these ids, in this order (repeats allowed), on the device.

        Uses what :meth:`hint` already loaded and loads the rest now (in the workers, in
        parallel). Returns what ``collate_fn`` (default: ``default_collate``) returns for
        ``[dataset[i] for i in ids]``, its CPU tensors moved to ``device``.

        Raises ``ValueError`` for no ids, the exception ``dataset[i]`` raised (same type where
        it can be rebuilt, else ``RuntimeError``; the message names the sample id and carries
        the original traceback), :class:`FeedError` when the feed is closed, a worker died,
        the loader failed, or the samples did not come within ``timeout_s``.
        """
        if self._closed:
            raise FeedError("the feed is closed; build a new Feed to read more batches")
        idl = _as_ids(ids)
        if not idl:
            raise ValueError("batch() needs at least one sample id (a DataLoader never "
                             "collates an empty batch)")
        if self._fast:
            return self._tensor_batch(idl)
        if self._loader is None:
            samples = [s for _, s in read_samples(self._dataset, idl, "in the calling thread",
                                           keep_cause=True)]
        else:
            ready, samples = self._loader.take(idl, self._timeout_s)
            if ready:  # the hinted batch, collated (and pinned) by the feeder thread
                return _to_device(samples, self.device)
        for s in samples:
            if isinstance(s, Failure):
                s.reraise()
        return _to_device(self._collate(samples), self.device)

    @property
    def cached(self) -> int:
        """Samples loaded (or being loaded) and kept for a later ``batch()``: a debugging aid."""
        return self._loader.cached() if self._loader is not None else 0

    def close(self) -> None:
        """Stop the workers and the feeder thread; idempotent. Returns when they are gone
        (within ~0.5 s; a worker stuck in a read is terminated after DataLoader's 5 s)."""
        self._closed = True
        if self._loader is not None:
            self._finalizer()  # runs _Loader.close once

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the TensorDataset fast path -------------------------------------------------------

    def _tensor_batch(self, ids: list[int]) -> list[torch.Tensor]:
        """``default_collate`` of a TensorDataset's samples (a list, one tensor per field),
        by indexing the tensors; on CUDA gathered straight into pinned memory."""
        idx = torch.tensor(ids, dtype=torch.long)
        out = []
        for t in self._dataset.tensors:  # type: ignore[attr-defined]
            if t.device == self.device:
                out.append(t[idx.to(t.device)])
            elif self.device.type == "cuda" and t.device.type == "cpu":
                host = torch.empty((len(ids), *t.shape[1:]), dtype=t.dtype, pin_memory=True)
                torch.index_select(t, 0, idx, out=host)
                out.append(host.to(self.device, non_blocking=True))
            else:
                out.append(t[idx.to(t.device)].to(self.device))
        return out


# -- the background part: a DataLoader fed from a request queue -----------------------------


class _Requests(Sampler[list[int]]):
    """The DataLoader's batch sampler: the requests of a :class:`_Loader`, as they come."""

    def __init__(self, loader: _Loader) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[list[int]]:
        return self._loader._requests()


class _Loader:
    """The workers behind a :class:`Feed`: a DataLoader over ``Keyed(dataset)`` whose batch
    sampler is a request queue, iterated by a feeder thread into a cache of samples by id.

    State (guarded by ``_cond``): ``_pending`` requests not yet handed to the DataLoader;
    ``_inflight`` ids requested and not yet filed; ``_want`` the ids some hint or batch asked
    for, with the tick of the newest ask (oldest first); ``_cache`` loaded samples by id
    (only wanted ones are kept); ``_owed`` real requests handed out and not yet filed.
    """

    def __init__(self, dataset: Dataset, workers: int, prefetch: int, mp_context: str | None,
                 prepare: Callable[[list[Any]], Any], device: torch.device) -> None:
        self._cond = threading.Condition()
        self._pending: collections.deque[list[int]] = collections.deque()
        self._inflight: set[int] = set()
        self._want: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._cache: dict[int, Any] = {}
        self._owed = 0
        self._tick = 0
        self.sent = [0, 0]  # requests handed to the DataLoader: [real, no-op] (for tests)
        self._prepare = prepare
        self._device = device
        self._hinted: tuple[int, ...] | None = None  # the newest hint, as given
        self._collating: tuple[int, ...] | None = None  # being collated by the feeder
        self._ready: tuple[tuple[int, ...], Any] | None = None  # (hint, its collated batch)
        self._closed = False
        self._error: BaseException | None = None
        self._workers = workers
        self._slots = workers * prefetch
        self._it: Any = None
        # Workers are seeded from a private generator: a DataLoader would draw their base seed
        # from torch's global RNG and shift the trainer's random stream.
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        if mp_context is None and "fork" in multiprocessing.get_all_start_methods():
            mp_context = "fork"
        self._dl = DataLoader(Keyed(dataset), batch_sampler=_Requests(self),
                              num_workers=workers, prefetch_factor=prefetch, collate_fn=pack,
                              multiprocessing_context=mp_context, timeout=_DL_POLL_S,
                              generator=torch.Generator().manual_seed(seed))
        started = threading.Event()
        self._thread = threading.Thread(target=self._feed, args=(started,), daemon=True,
                                        name="spotring-feed")
        self._thread.start()
        started.wait()
        if self._error is not None:
            self._thread.join()
            raise FeedError(f"the input workers could not start: {self._error}") from self._error

    # -- feeder thread -----------------------------------------------------------------

    def _feed(self, started: threading.Event) -> None:
        """The feeder thread: create the DataLoader's iterator (it forks the workers here, off
        the main thread, so DataLoader sets no SIGCHLD handler that would raise in the caller
        at random points) and file every delivered sample until the feed is closed.

        The DataLoader's own ``timeout`` (``_DL_POLL_S``) brings this thread back while it
        waits for a read, so it notices a close (and DataLoader a dead worker) within that.
        """
        try:
            if self._device.type == "cuda":  # pin for this device (no context on another GPU)
                torch.cuda.set_device(self._device)
            it = iter(self._dl)
        except BaseException as e:  # noqa: BLE001 - reported by the constructor
            self._error = e
            started.set()
            return
        self._it = it
        started.set()
        try:
            while True:
                try:
                    packed = next(it)
                except StopIteration:
                    return
                except RuntimeError as e:
                    if not str(e).startswith("DataLoader timed out"):
                        raise
                    packed = None  # nothing came within _DL_POLL_S: look around, wait again
                if self._closed:
                    _shutdown(it)
                    return
                if packed is not None:
                    pairs = unpack(packed)
                    if pairs:
                        self._file(pairs)
                        self._precollate()
        except BaseException as e:  # noqa: BLE001 - a worker died or the loader failed
            with self._cond:
                if not self._closed:
                    self._error = e
                    log.error("input pipeline failed: %s", str(e).splitlines()[0])
                self._cond.notify_all()
            _shutdown(it)

    def _file(self, pairs: list[tuple[int, Any]]) -> None:
        with self._cond:
            self._owed -= 1
            for i, sample in pairs:
                self._inflight.discard(i)
                if i in self._want:
                    self._cache[i] = sample
            self._cond.notify_all()

    def _precollate(self) -> None:
        """Once every sample of the newest hint is loaded, collate (and pin) it here, off the
        caller's step: a ``batch()`` of exactly the hinted ids then only moves it."""
        with self._cond:
            key = self._hinted
            if key is None or self._ready is not None or self._collating is not None:
                return
            samples = [self._cache.get(i) for i in key]
            if any(i not in self._cache or isinstance(s, Failure)
                   for i, s in zip(key, samples)):
                return
            self._collating = key
        batch = None
        try:
            batch = self._prepare(samples)
        except Exception:  # noqa: BLE001 - batch() collates again and raises in the caller
            log.debug("collating hinted batch failed; batch() will retry", exc_info=True)
        finally:
            with self._cond:
                self._collating = None
                if batch is not None and self._hinted == key:
                    self._ready = (key, batch)
                self._cond.notify_all()

    def _requests(self) -> Iterator[list[int]]:
        """The batch sampler's iterator, run by the DataLoader in the feeder thread.

        Blocks only while no real request is owed (see the module docstring); ends on close.
        """
        for _ in range(self._slots):  # asked for while the iterator is created: never block
            yield []
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    req = self._take_locked()
                    if req:
                        self._owed += 1
                        break
                    if self._owed > 0:  # real data is owed: blocking would hold it back
                        break
                    self._cond.wait()
                self.sent[0 if req else 1] += 1
            yield req

    def _take_locked(self) -> list[int]:
        """The next pending request, less the ids no longer wanted or already loaded."""
        while self._pending:
            keep = []
            for i in self._pending.popleft():
                if i in self._want and i not in self._cache:
                    keep.append(i)
                else:
                    self._inflight.discard(i)
            if keep:
                return keep
        return []

    # -- caller's thread ---------------------------------------------------------------

    def hint(self, ids: list[int]) -> None:
        with self._cond:
            if self._closed or self._error is not None:
                return
            if tuple(ids) != self._hinted:  # a new guess: the batch collated ahead is stale
                self._hinted, self._ready = tuple(ids), None
            uniq = self._ask_locked(ids)
            self._enqueue_locked(self._missing_locked(uniq), urgent=False)

    def take(self, ids: list[int], timeout_s: float) -> tuple[bool, Any]:
        """``(True, batch)``: the hinted batch of exactly ``ids``, already prepared; else
        ``(False, samples)``: the samples of ``ids`` in order (a :class:`Failure` for a sample
        whose read raised), waiting for the ones still loading. Consumes them from the cache.
        Raises :class:`FeedError` (see Feed.batch)."""
        key = tuple(ids)
        with self._cond:
            self._check_locked()
            while self._collating == key:  # the feeder is collating this very batch
                self._cond.wait(_POLL_S)
            if self._ready is not None and self._ready[0] == key:
                batch, self._ready, self._hinted = self._ready[1], None, None
                for i in set(key):
                    self._cache.pop(i, None)
                    self._want.pop(i, None)
                return True, batch
            uniq = self._ask_locked(ids)
            needed = set(uniq)
            # Pending requests with ids needed now go first, then the new requests before them.
            front = [r for r in self._pending if not needed.isdisjoint(r)]
            back = [r for r in self._pending if needed.isdisjoint(r)]
            self._pending = collections.deque(front + back)
            self._enqueue_locked(self._missing_locked(uniq), urgent=True)
            deadline = time.monotonic() + timeout_s
            while True:
                missing = [i for i in uniq if i not in self._cache]
                if not missing:
                    break
                self._check_locked()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FeedError(
                        f"waited {timeout_s:.0f}s for {len(missing)} samples (ids "
                        f"{missing[:5]}...) from the input workers: a dataset read hangs or is "
                        f"far slower than expected; raise timeout_s or fix the dataset")
                self._cond.wait(min(_POLL_S, left))
            samples = [self._cache[i] for i in ids]
            for i in uniq:
                del self._cache[i]
                self._want.pop(i, None)
        return False, samples

    def cached(self) -> int:
        with self._cond:
            return len(self._cache) + sum(1 for i in self._inflight if i in self._want)

    def close(self) -> None:
        """Stop the sampler and let the feeder thread shut the workers down (it notices within
        ``_DL_POLL_S``; a worker stuck in a read is terminated by DataLoader after 5 s)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._want.clear()
            self._cache.clear()
            self._hinted = self._ready = None
            self._cond.notify_all()
        self._thread.join(_CLOSE_S)
        if self._thread.is_alive():
            log.warning("input feeder thread still running %.0fs after close()", _CLOSE_S)

    # -- helpers (lock held) -----------------------------------------------------------

    def _ask_locked(self, ids: list[int]) -> list[int]:
        """Mark ``ids`` wanted at a new tick, drop what was wanted long ago; the unique ids."""
        self._tick += 1
        uniq = list(dict.fromkeys(ids))
        for i in uniq:
            self._want[i] = self._tick
            self._want.move_to_end(i)
        horizon = self._tick - _KEEP_TICKS
        while self._want:
            i, tick = next(iter(self._want.items()))
            if tick > horizon:
                break
            del self._want[i]
            self._cache.pop(i, None)
        return uniq

    def _missing_locked(self, uniq: list[int]) -> list[int]:
        return [i for i in uniq if i not in self._cache and i not in self._inflight]

    def _enqueue_locked(self, ids: list[int], *, urgent: bool) -> None:
        """Queue ``ids`` as one request per worker (read in parallel); urgent ones first."""
        if not ids:
            return
        self._inflight.update(ids)
        n = min(self._workers, len(ids))
        chunks = [ids[k * len(ids) // n:(k + 1) * len(ids) // n] for k in range(n)]
        if urgent:
            self._pending.extendleft(reversed(chunks))
        else:
            self._pending.extend(chunks)
        self._cond.notify_all()

    def _check_locked(self) -> None:
        if self._closed:
            raise FeedError("the feed is closed; build a new Feed to read more batches")
        if self._error is None:
            dead = [w.pid for w in getattr(self._it, "_workers", ()) if not w.is_alive()]
            if dead:
                self._error = RuntimeError(f"DataLoader worker (pid(s) {dead}) exited "
                                           "unexpectedly")
        if self._error is not None:
            raise FeedError(
                f"the input pipeline is broken ({str(self._error).splitlines()[0]}); a worker "
                "process died (killed, out of memory?) or the DataLoader failed. Close this "
                "Feed and build a new one") from self._error


def _shutdown(it: Any) -> None:
    """Stop a DataLoader iterator's workers (what its ``__del__`` does)."""
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        try:
            stop()
        except Exception:  # noqa: BLE001 - best effort at teardown
            log.debug("DataLoader worker shutdown failed", exc_info=True)


# -- small helpers ---------------------------------------------------------------------------


def _as_ids(ids: IdsLike) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.is_floating_point() or ids.is_complex():
            raise TypeError(f"sample ids must be integers, got a {ids.dtype} tensor")
        return [int(i) for i in ids.reshape(-1).tolist()]
    return [int(i) for i in ids]


def _collate_and_pin(collate: Callable[[list[Any]], Any], device: torch.device,
                     samples: list[Any]) -> Any:
    """``collate(samples)``, its CPU tensors in pinned memory when ``device`` is CUDA."""
    batch = collate(samples)
    if device.type != "cuda":
        return batch
    return _map_tensors(lambda t: t.pin_memory() if t.device.type == "cpu" else t, batch)


def _to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` (a collated batch) with its tensors on ``device``: from pinned memory with
    non-blocking copies on CUDA (``pin_memory()`` returns a pinned tensor as it is)."""
    if device.type == "cpu":
        return obj

    def move(t: torch.Tensor) -> torch.Tensor:
        if t.device == device:
            return t
        if device.type == "cuda" and t.device.type == "cpu":
            return t.pin_memory().to(device, non_blocking=True)
        return t.to(device)

    return _map_tensors(move, obj)


def _map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    """``obj`` with ``fn`` applied to every tensor, through what default_collate builds:
    mappings, namedtuples, tuples and lists (anything else is returned as it is)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        moved = {k: _map_tensors(fn, v) for k, v in obj.items()}
        try:
            return type(obj)(moved)  # type: ignore[call-arg]
        except TypeError:
            return moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(fn, v) for v in obj)
    return obj
