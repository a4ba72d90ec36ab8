"""The input pipeline: DataLoader semantics by sample id, prefetch from hints, errors, cleanup."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

from trainer.data import feed as data
from trainer.data.feed import Feed
from trainer.errors import FeedError

# -- datasets (module level: the workers may unpickle them under spawn) ----------------------


class Samples(Dataset):
    """Samples of one ``kind``; reading an id in ``bad`` raises ValueError."""

    def __init__(self, kind: str = "tuple", n: int = 200, bad: tuple[int, ...] = ()) -> None:
        self.kind, self.n, self.bad = kind, n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i in self.bad:
            raise ValueError(f"sample file {i} is corrupt")
        x = torch.arange(3, dtype=torch.float32) + i
        if self.kind == "tuple":  # a (1,)-shaped regression target: must stay (b, 1)
            return x, torch.tensor([i * 0.5])
        if self.kind == "int":  # a class index: a (b,) long tensor
            return x, i % 10
        if self.kind == "vector":
            return x, torch.tensor([i, 2.0 * i])
        if self.kind == "dict":  # numpy, python numbers, strings, an empty tensor
            return {"image": np.full((2, 2), i, dtype=np.float32), "label": i, "w": i / 4,
                    "name": f"s{i}", "mask": torch.zeros(0, dtype=torch.bool),
                    "view": torch.arange(100.0)[i % 7 :: 9][:5]}
        raise AssertionError(self.kind)


class Batched(Samples):
    """A dataset with ``__getitems__``: DataLoader uses it for a batch, so must the Feed."""

    def __getitem__(self, i: int) -> Any:
        return ("one", i)

    def __getitems__(self, ids: list[int]) -> list[Any]:
        return [("many", i) for i in ids]


class TwoArgError(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)


class Odd(Samples):
    """Id 5 raises an exception that cannot be rebuilt from a message; id 7 does not pickle."""

    def __getitem__(self, i: int) -> Any:
        if i == 5:
            raise TwoArgError(5, "bad")
        if i == 7:
            return (lambda: i), 0
        return super().__getitem__(i)


class Slow(Dataset):
    """A dataset on a slow disk: every read sleeps ``ms``, a read of an id in ``stuck`` ``stuck_s``."""

    def __init__(self, n: int = 4096, ms: float = 2.0, stuck: tuple[int, ...] = (),
                 stuck_s: float = 0.0) -> None:
        self.n, self.ms, self.stuck, self.stuck_s = n, ms, stuck, stuck_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.stuck_s if i in self.stuck else self.ms / 1000)
        return torch.full((16,), float(i)), torch.tensor([float(i)])


# -- helpers ---------------------------------------------------------------------------------


def assert_same(a: Any, b: Any) -> None:
    """Equal values of equal types, recursively (tensors: dtype, shape and values)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert torch.equal(a.cpu(), b.cpu()), (a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def loader_batch(ds: Dataset, ids: list[int], collate_fn: Any = None) -> Any:
    """What a plain DataLoader gives for exactly these ids."""
    return next(iter(DataLoader(ds, batch_sampler=[ids], collate_fn=collate_fn)))


def children() -> set[int]:
    """This process's child processes (from every thread's /proc children list)."""
    out: set[int] = set()
    base = f"/proc/{os.getpid()}/task"
    for task in os.listdir(base):
        try:
            with open(f"{base}/{task}/children") as f:
                out |= {int(c) for c in f.read().split()}
        except OSError:
            continue
    return out


def settle(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- semantics -------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["tuple", "int", "vector", "dict"])
def test_a_batch_is_what_a_dataloader_gives_for_those_ids(kind: str, workers: int) -> None:
    ds = Samples(kind)
    ids = [17, 3, 150, 3, 42]  # any order, repeats allowed
    with Feed(ds, workers=workers) as feed:
        got = feed.batch(torch.tensor(ids))
    want = loader_batch(ds, ids)
    assert_same(got, want)
    assert_same(got, default_collate([ds[i] for i in ids]))
    if kind == "tuple":
        assert got[1].shape == (5, 1)  # not flattened (the R² 0.016 bug)
    if kind == "int":
        assert got[1].dtype == torch.long and got[1].shape == (5,)
    if kind == "vector":
        assert got[1].shape == (5, 2)


def test_a_tensor_dataset_is_indexed_in_memory_and_equals_default_collate() -> None:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(50, 3, generator=g), torch.randn(50, 1, generator=g),
                       torch.randint(0, 9, (50,), generator=g))
    before = children()
    with Feed(ds) as feed:
        assert feed.workers == 0 and feed._loader is None
        for ids in ([4, 0, 49, 4], list(range(50)), [7]):
            got = feed.batch(torch.tensor(ids))
            assert_same(got, default_collate([ds[i] for i in ids]))
            assert_same(got, loader_batch(ds, ids))
        assert children() == before  # no worker processes for data already in memory


def test_a_custom_collate_fn_gets_the_samples_in_order() -> None:
    ds = Samples("dict")
    ids = [9, 1, 9, 30]
    with Feed(ds, workers=2, collate_fn=list) as feed:
        got = feed.batch(ids)
    assert [s["label"] for s in got] == ids
    assert_same(got, loader_batch(ds, ids, collate_fn=list))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_with_getitems_is_read_through_it_as_dataloader_does(workers: int) -> None:
    ds = Batched()
    with Feed(ds, workers=workers, collate_fn=list) as feed:
        got = feed.batch([3, 1, 2])
    assert got == loader_batch(ds, [3, 1, 2], collate_fn=list) == [("many", i) for i in (3, 1, 2)]


def test_workers_give_the_same_batches_as_reading_in_the_calling_thread() -> None:
    ds = Samples("dict", n=500)
    rng = random.Random(3)
    batches = [rng.sample(range(500), rng.randint(1, 40)) for _ in range(12)]
    with Feed(ds, workers=0) as inline, Feed(ds, workers=2) as pooled:
        for k, ids in enumerate(batches):
            if k + 1 < len(batches):
                pooled.hint(batches[k + 1])
            assert_same(pooled.batch(ids), inline.batch(ids))


# -- hints -----------------------------------------------------------------------------------


def test_wrong_hints_waste_work_but_never_give_wrong_data_and_the_cache_stays_bounded() -> None:
    ds = Samples("tuple", n=1000)
    rng = random.Random(7)
    with Feed(ds, workers=2) as feed:
        for _ in range(15):
            hinted = rng.sample(range(1000), 32)
            asked = rng.sample(hinted, 10) + rng.sample(range(1000), 22)  # partly right
            feed.hint(hinted)
            feed.hint(rng.sample(range(1000), 8))  # plainly wrong
            assert_same(feed.batch(asked), default_collate([ds[i] for i in asked]))
        for k in range(40):  # hints nobody takes are dropped after _KEEP_TICKS calls
            feed.hint(range(k * 16, k * 16 + 16))
        assert feed.cached <= data._KEEP_TICKS * 16
        real, noops = feed._loader.sent
        # no-ops keep a delivering DataLoader moving; in order they cannot spin
        assert noops <= 2 * 2 * (real + 1), (real, noops)


def test_an_exactly_hinted_batch_is_collated_ahead_and_any_other_batch_is_not_taken_for_it(
        ) -> None:
    ds = Samples("dict")
    with Feed(ds, workers=2) as feed:
        feed.hint([4, 8, 15, 16])
        assert settle(lambda: feed._loader._ready is not None)  # collated in the background
        assert_same(feed.batch([4, 8, 15, 16]), default_collate([ds[i] for i in (4, 8, 15, 16)]))
        feed.hint([23, 42, 7])
        assert settle(lambda: feed._loader._ready is not None)
        assert_same(feed.batch([42, 23]), default_collate([ds[42], ds[23]]))  # not the hint
        assert_same(feed.batch([23, 42, 7]), default_collate([ds[23], ds[42], ds[7]]))


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_read_raises_its_own_type_with_the_id_once_and_the_feed_goes_on(
        workers: int) -> None:
    ds = Samples("tuple", bad=(13, 14))
    with Feed(ds, workers=workers) as feed:
        feed.hint([14, 1, 2])  # a bad sample hinted but never asked for raises nothing
        with pytest.raises(ValueError, match=r"sample 13 \(dataset\[13\]\)") as err:
            feed.batch([1, 13, 2])
        assert "sample file 13 is corrupt" in str(err.value)
        assert_same(feed.batch([1, 2]), default_collate([ds[1], ds[2]]))
        with pytest.raises(ValueError, match="13"):  # asked again: read again, fails again
            feed.batch([13])


def test_an_exception_that_cannot_be_rebuilt_and_an_unpicklable_sample_name_the_id() -> None:
    with Feed(Odd("int"), workers=2) as feed:
        with pytest.raises(RuntimeError, match=r"TwoArgError reading sample 5 \(dataset\[5\]\)"):
            feed.batch([4, 5])
        with pytest.raises(Exception, match=r"sample 7 .*does not pickle"):
            feed.batch([7, 8])
        assert feed.batch([8, 9])[1].tolist() == [8, 9]


def test_a_dead_worker_makes_batch_raise_not_hang() -> None:
    before = children()
    feed = Feed(Slow(ms=1.0), workers=2, timeout_s=30)
    feed.batch(range(8))
    workers = children() - before
    assert len(workers) == 2
    os.kill(workers.pop(), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(FeedError, match="exited unexpectedly"):
        feed.batch(range(100, 164))
    assert time.monotonic() - t0 < 10
    with pytest.raises(FeedError):  # broken for good, says so every time
        feed.batch([1])
    feed.close()
    assert settle(lambda: children() == before)


# -- cleanup ---------------------------------------------------------------------------------


def test_close_leaves_no_processes_or_threads_and_is_idempotent() -> None:
    before_procs = children()
    before_threads = set(threading.enumerate())
    with Feed(Slow(ms=1.0), workers=2) as feed:
        assert len(children() - before_procs) == 2
        feed.batch(range(10))
        feed.hint(range(100, 300))  # still loading when closed
    feed.close()
    assert settle(lambda: children() == before_procs), children() - before_procs
    assert settle(lambda: set(threading.enumerate()) <= before_threads), threading.enumerate()
    with pytest.raises(FeedError, match="closed"):
        feed.batch([1])
    feed.hint([1])  # a no-op once closed


def test_a_read_slower_than_the_feeders_poll_still_arrives(monkeypatch) -> None:
    monkeypatch.setattr(data, "_DL_POLL_S", 0.05)
    with Feed(Slow(ms=0.0, stuck=(3,), stuck_s=0.3), workers=2) as feed:
        assert feed.batch([1, 3, 2])[1].flatten().tolist() == [1.0, 3.0, 2.0]


def test_close_does_not_wait_for_a_read_that_hangs(monkeypatch) -> None:
    monkeypatch.setattr(data, "_DL_POLL_S", 0.05)
    before = children()
    feed = Feed(Slow(ms=0.0, stuck=(3,), stuck_s=600), workers=2, timeout_s=0.3)
    with pytest.raises(FeedError, match="waited"):
        feed.batch([1, 3])
    t0 = time.monotonic()
    feed.close()  # DataLoader gives the stuck worker 5 s, then terminates it
    assert time.monotonic() - t0 < 8
    assert settle(lambda: children() == before)


# -- the point of it: a slow dataset does not stall the step ---------------------------------


def test_hinting_the_next_batch_hides_most_of_the_load_time() -> None:
    """2 ms reads, batches of 32 (64 ms to read synchronously), 50 ms of compute per step."""
    ds = Slow(ms=2.0)
    rng = random.Random(0)
    batches = [rng.sample(range(ds.n), 32) for _ in range(10)]
    compute_s = 0.05

    with Feed(ds, workers=0) as sync:
        t0 = time.perf_counter()
        for ids in batches:
            sync.batch(ids)
        sync_s = time.perf_counter() - t0

    with Feed(ds, workers=2) as feed:
        feed.hint(batches[0])  # a joiner warms up before its first step
        time.sleep(compute_s)
        waited = 0.0
        for k, ids in enumerate(batches):
            t0 = time.perf_counter()
            feed.batch(ids)
            waited += time.perf_counter() - t0
            if k + 1 < len(batches):
                feed.hint(batches[k + 1])  # at the start of the step
            time.sleep(compute_s)  # the step's forward/backward
    assert waited < 0.5 * sync_s, (waited, sync_s)


def _feed_in_a_child(q: Any) -> None:
    ds = Samples("vector")
    with Feed(ds, workers=2) as feed:
        feed.hint([9, 8])
        got = feed.batch([9, 8])
    q.put(torch.equal(got[1], default_collate([ds[9], ds[8]])[1]) and len(children()) == 0)


def test_a_feed_works_inside_a_worker_forked_from_a_forkserver() -> None:
    """As the ring's workers run in tests: a non-daemonic child of a forkserver."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    q = ctx.Queue()
    p = ctx.Process(target=_feed_in_a_child, args=(q,), daemon=False)
    p.start()
    try:
        assert q.get(timeout=60) is True
    finally:
        p.join(30)
    assert p.exitcode == 0


def test_workers_can_be_spawned_instead_of_forked() -> None:
    ds = Samples("tuple")
    with Feed(ds, workers=1, mp_context="spawn", timeout_s=60) as feed:
        assert_same(feed.batch([3, 1]), default_collate([ds[3], ds[1]]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batches_land_on_the_gpu() -> None:
    dev = torch.device("cuda")
    ds = Samples("dict")
    with Feed(ds, device=dev, workers=2) as feed:
        got = feed.batch([5, 6])
    assert got["image"].device.type == "cuda" and got["label"].device.type == "cuda"
    assert_same({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in got.items()},
                default_collate([ds[5], ds[6]]))
    tds = TensorDataset(torch.randn(20, 3), torch.randn(20, 1))
    with Feed(tds, device=dev) as feed:
        x, y = feed.batch([3, 2])
    assert x.device.type == "cuda" and torch.equal(x.cpu(), tds.tensors[0][[3, 2]])
    assert torch.equal(y.cpu(), tds.tensors[1][[3, 2]])
