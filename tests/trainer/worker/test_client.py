"""The heartbeat thread's stats publishing against the run's last report (a real control store)."""

from __future__ import annotations

import threading
import time

from trainer.protocol import messages as mb
from trainer.protocol.store import StoreServer
from trainer.protocol.store_client import ControlStore
from trainer.worker.client import Heartbeat


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
