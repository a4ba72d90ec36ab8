"""The heartbeat thread against a real control store: its stats publishing against the run's
last report, and how fresh its cached view of the ring is after the process was frozen."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from trainer.protocol import messages as mb
from trainer.protocol.store import StoreServer
from trainer.protocol.store_client import ControlStore
from trainer.worker.client import Heartbeat
from trainer.worker.member import Member


class _SlowStore:
    """The heartbeat's store, with its send of ``slow`` held up until released."""

    def __init__(self, store: ControlStore, slow: str) -> None:
        self._store, self._slow = store, slow
        self.entered = threading.Event()

    def set(self, key: str, value: str) -> None:
        if key == mb.STATS and value == self._slow:
            self.entered.set()
            time.sleep(0.3)  # the thread read the old report and is slow to send it
        self._store.set(key, value)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def test_a_report_the_thread_had_read_never_overwrites_the_last_one() -> None:
    server = StoreServer("127.0.0.1", 0, b"t")
    server.start()
    master = ControlStore(*server.address, b"t")
    master.set(mb.LATEST, "0")
    hb = Heartbeat(master, 1, interval_s=0.01)
    slow = _SlowStore(hb._store, '{"epoch": 9}')
    hb._store = slow
    hb.stats = '{"epoch": 9}'
    hb.start()
    try:
        assert slow.entered.wait(5)
        hb.publish_stats('{"epoch": 10}')  # the main loop's final report, sent meanwhile
    finally:
        hb.stop()  # the worker exits right after its last report: no later beat mends it
    assert master.get(mb.STATS) == b'{"epoch": 10}'
    server.stop()


class _FrozenPeek:
    """The heartbeat's store: its next peek, once armed, gets its answer and then stands still
    (the process frozen by SIGSTOP with the reply in hand) until released; the peek after it
    waits until the test ends (so the test reads what the thread made of the frozen reply)."""

    def __init__(self, store: ControlStore) -> None:
        self._store = store
        self.armed = False
        self.answered, self.release = threading.Event(), threading.Event()
        self.next_asked, self.done = threading.Event(), threading.Event()

    def peek(self, keys: list[str]) -> list[bytes | None]:
        if self.release.is_set():  # the reply after the frozen one: held back
            self.next_asked.set()
            self.done.wait(5)
        vals = self._store.peek(keys)
        if self.armed:
            self.armed = False
            self.answered.set()
            self.release.wait(5)
        return vals

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def test_a_reply_read_after_a_freeze_is_not_taken_for_a_fresh_one() -> None:
    """A member frozen while its generation was declared broken (the ring dropped it) must not
    trust the heartbeat's reply from before the freeze when it wakes: its peers abandoned the
    reduction it may now see complete. The cached answer is as old as the poll that fetched
    it, so the member asks the store itself and learns the generation is broken."""
    server = StoreServer("127.0.0.1", 0, b"t")
    server.start()
    master = ControlStore(*server.address, b"t")
    master.set(mb.LATEST, "7")
    hb = Heartbeat(master, 1, interval_s=0.01)
    hb.generation = 7
    frozen = _FrozenPeek(hb._store)
    hb._store = frozen
    hb.start()
    try:
        deadline = time.monotonic() + 5
        while hb.polled_at == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        frozen.armed = True
        assert frozen.answered.wait(5)  # the reply says "not broken" ...
        master.add(mb.k_broken(7), 1)  # ... and the ring then drops this member
        time.sleep(0.3)  # frozen: many heartbeat intervals pass
        frozen.release.set()  # it wakes and reads the reply it had
        assert frozen.next_asked.wait(5)  # ... and has made of it what it makes
        assert hb.is_broken(7) is False  # the cached answer is the old one
        member = SimpleNamespace(hb=hb, store=master)
        assert Member.broken(member, 7) is True  # type: ignore[arg-type]
    finally:
        frozen.done.set()
        hb.stop()
        server.stop()
