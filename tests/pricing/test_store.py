"""PriceStore: append/latest/history/prune, WAL, one writer with concurrent readers."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import datetime, timedelta, timezone

import pytest

from pricing.errors import StoreError
from pricing.model import Offering, PriceQuote
from pricing.store import PriceStore

UTC = timezone.utc
T0 = datetime(2024, 1, 1, tzinfo=UTC)
A = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
B = Offering("gcp", "us-central1", "*", "a2-highgpu-1g")


def quotes(off, n, start=T0, step=timedelta(hours=1), base=1.0):
    return [PriceQuote(off, start + i * step, base + i / 100, 3.06, f"t:{i}") for i in range(n)]


def test_append_latest_history_prune(tmp_path):
    store = PriceStore(tmp_path / "p.sqlite")
    assert store.journal_mode() == "wal"
    assert store.append(quotes(A, 5) + quotes(B, 3, base=2.0)) == 8
    assert store.append(quotes(A, 1)) == 1 and store.count() == 8  # idempotent
    latest = store.latest()
    assert [(q.offering, q.price_per_hour) for q in latest] == [(A, 1.04), (B, 2.02)]
    assert latest[0].time == T0 + timedelta(hours=4) and latest[0].on_demand_per_hour == 3.06
    at = store.latest(now=T0 + timedelta(hours=1, minutes=30))
    assert [q.price_per_hour for q in at] == [1.01, 2.01]
    fresh = store.latest(now=T0 + timedelta(hours=4), max_age=timedelta(hours=1))
    assert [q.offering for q in fresh] == [A]
    h = store.history(A, T0 + timedelta(hours=1), T0 + timedelta(hours=3))
    assert [q.price_per_hour for q in h] == [1.01, 1.02, 1.03]
    assert store.prune(T0 + timedelta(hours=10)) == 6  # keeps the newest of each offering
    assert [q.price_per_hour for q in store.latest()] == [1.04, 2.02]
    store.close()
    reopened = PriceStore(tmp_path / "p.sqlite")
    assert reopened.count() == 2


def test_unopenable_path_is_a_store_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="cannot"):
        PriceStore(tmp_path / "file" / "p.sqlite")


def _reader_process(path, rounds, out):
    store = PriceStore(path)
    seen = []
    for _ in range(rounds):
        latest = store.latest()
        # a batch is one transaction: both offerings move together
        if latest:
            assert len({q.time for q in latest}) == 1, latest
        seen.append(store.count())
    out.put(seen)


def test_one_writer_concurrent_readers(tmp_path):
    path = tmp_path / "p.sqlite"
    store = PriceStore(path)
    batches = 200
    errors: list[BaseException] = []
    counts: list[list[int]] = []

    def writer():
        for i in range(batches):
            t = T0 + timedelta(minutes=i)
            store.append([PriceQuote(A, t, 1.0 + i, None), PriceQuote(B, t, 2.0 + i, None)])

    def reader():
        try:
            local = PriceStore(path)
            seen = []
            for _ in range(200):
                latest = local.latest()
                if latest:
                    assert len({q.time for q in latest}) == 1
                    assert latest[1].price_per_hour - latest[0].price_per_hour == 1.0
                seen.append(local.count())
            counts.append(seen)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_reader_process, args=(str(path), 200, out))
    proc.start()
    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    proc_seen = out.get(timeout=60)
    proc.join(60)
    assert not errors, errors
    assert proc.exitcode == 0
    for seen in counts + [proc_seen]:
        assert seen == sorted(seen)  # readers only ever see the count grow
    assert store.count() == 2 * batches
