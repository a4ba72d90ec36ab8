"""A worker's side of the membership protocol: connect, join, beat, report.

Design: everything a worker says to the coordinator goes through the coordinator's control
store over an authenticated connection (:class:`trainer.protocol.store_client.ControlStore`; see
:mod:`trainer.protocol.messages` for the keys). Connecting retries with exponential backoff for a
bounded time, then raises :class:`CoordinatorUnreachable` with the address and the fix; a
coordinator that refuses the token raises :class:`JoinRefused` at once (retrying cannot
help). The heartbeat runs in its own thread over its own connection (so a long
forward/backward never delays it) and also publishes the worker's measured samples/s,
which :meth:`trainer.control.coordinator.Coordinator.members` reports.

Rule for callers: connect only after the job is loaded and profiled (hot join: slow start
first); stop the heartbeat (:meth:`Heartbeat.stop`) before joining again as a new member.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable

from trainer.errors import (ControlLost, ControlTimeout, CoordinatorUnreachable, JoinRefused,
                            TokenRefused)
from trainer.protocol import messages as mb
from trainer.protocol.store_client import ControlStore

log = logging.getLogger(__name__)


def connect(
    host: str,
    port: int,
    token: bytes,
    *,
    budget_s: float = 60.0,
    op_timeout_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ControlStore:
    """An authenticated connection to the coordinator's store, retried with backoff.

    Tries to connect; on failure waits 0.2 s, 0.4 s, ... (at most 5 s) and tries again until
    ``budget_s`` has passed. Returns the store (blocking operations time out after
    ``op_timeout_s``). Raises :class:`JoinRefused` when the coordinator refuses the token
    and :class:`CoordinatorUnreachable` naming the address, the attempts and the fix.
    """
    start = clock()
    delay = 0.2
    attempts = 0
    last: Exception | None = None
    while True:
        attempts += 1
        try:
            return ControlStore(host, port, token, timeout_s=op_timeout_s,
                                connect_timeout_s=max(0.5, min(5.0, budget_s)))
        except TokenRefused as e:
            raise JoinRefused(f"refused: {e}") from e
        except ControlLost as e:
            last = e
        if clock() - start + delay > budget_s:
            first = str(last).splitlines()[0] if last else ""
            raise CoordinatorUnreachable(
                f"coordinator {host}:{port} unreachable after {attempts} attempts over "
                f"{clock() - start:.1f}s ({first}); check --coordinator HOST:PORT and that "
                f"the coordinator is running") from last
        log.warning("coordinator %s:%s not reachable, retrying in %.1fs", host, port, delay)
        sleep(delay)
        delay = min(delay * 2, 5.0)


def join(store: ControlStore, hello: mb.Hello, timeout_s: float = 30.0) -> int:
    """Take a member id and introduce this worker. Returns the admitted id.

    Raises :class:`JoinRefused` with the coordinator's verdict when refused or when the job
    is over, :class:`CoordinatorUnreachable` when it does not answer within ``timeout_s``.
    """
    try:
        member_id = int(store.add(mb.IDS, 1))
        store.set(mb.k_hello(member_id), hello.to_json())
        store.wait([mb.k_verdict(member_id)], datetime.timedelta(seconds=timeout_s))
        verdict = store.get(mb.k_verdict(member_id)).decode(errors="replace")
    except (ControlLost, ControlTimeout) as e:
        raise CoordinatorUnreachable(
            f"the coordinator did not answer the join within {timeout_s}s: "
            f"{str(e).splitlines()[0]}") from e
    if verdict != "ok":
        raise JoinRefused(verdict)
    return member_id


class Heartbeat:
    """A thread that beats, watches the ring and reports, off the training loop's path.

    Every ``interval_s`` it bumps ``hb/<id>``, reads ``gen/latest`` and ``broken/<n>`` of the
    generation the member is in (:attr:`generation`), and publishes what :attr:`stats` and
    ``speed()`` hold (``speed/<id>``; the ring's ``stats`` when this member is rank 0). The
    training loop reads the cached values (:attr:`latest`, :meth:`is_broken`), so a step
    makes no store round trip of its own.
    """

    def __init__(self, store: ControlStore, member_id: int, interval_s: float = 0.05,
                 speed: Callable[[], mb.Speed] | None = None,
                 report: Callable[[], mb.Report] | None = None) -> None:
        self._store = store.clone()
        self._id = member_id
        self.interval_s = interval_s
        self._speed = speed
        self.report = report  # what this member tells a restarted coordinator
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"spotring-hb-{member_id}",
                                        daemon=True)
        self.generation = 0  # set by the loop when it enters a generation
        self.latest = 0
        self.export = 0  # the coordinator's count of requests for the trained model
        self.snapshot_now = 0  # the coordinator's count of requests for a snapshot now
        self.incarnation: bytes | None = None  # the coordinator process this member knows
        self.lost_since: float | None = None  # monotonic time the coordinator stopped
        # answering (None: it answers)
        self._broken_gen = 0  # the generation the cached flag below belongs to
        self._broken = False
        self.polled_at = 0.0  # monotonic time the last successful poll was sent
        self.stats: str | None = None  # rank 0's progress report, published when it changes
        self._stats_sent: str | None = None
        self._stats_lock = threading.Lock()  # a send in flight never lands after a later one

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> None:
        """One heartbeat now (also used to show a dropped member woke up)."""
        self._store.add(mb.k_heartbeat(self._id), 1)

    def publish_stats(self, stats: str) -> None:
        """Publish ``stats`` now, from the caller's thread: the last report of a run. Taken
        under the lock the thread sends under, so an older report the thread had already
        read cannot overwrite it afterwards (it did: a finished run showed epoch 9 of 10)."""
        with self._stats_lock:
            self.stats = stats
            self._store.set(mb.STATS, stats)
            self._stats_sent = stats

    def lost_is_recent(self) -> bool:
        """True while the coordinator does not answer this thread's polls."""
        return self.lost_since is not None

    def is_broken(self, generation: int) -> bool:
        """The cached ``broken/<generation>`` flag (False until the thread has polled it)."""
        return self._broken_gen == generation and self._broken

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._store.close()

    def _run(self) -> None:
        last_speed = 0.0
        while not self._stop.is_set():
            try:
                self.beat()
                gen = self.generation
                keys = [mb.LATEST, mb.EXPORT, mb.INCARNATION, mb.SNAPSHOT_NOW]
                if gen:
                    keys.append(mb.k_broken(gen))
                # the answer is as old as the question: a process frozen (SIGSTOP, a stalled
                # host) after the reply came but before it is read here must not make that
                # reply look fresh, or a member woken after it was dropped would commit a
                # reduction its peers abandoned (its samples then counted twice)
                asked = time.monotonic()
                vals = self._store.peek(keys)  # one round trip; never waits for a key
                if vals[2] is not None and vals[2] != self.incarnation:
                    if self.incarnation is not None:  # a restarted coordinator
                        self._introduce()
                    self.incarnation = vals[2]
                self.latest = int(vals[0] or 0)
                self.export = int(vals[1] or 0)
                self.snapshot_now = int(vals[3] or 0)
                if gen:
                    self._broken_gen, self._broken = gen, int(vals[4] or 0) > 0
                self.polled_at = asked
                if self.lost_since is not None:
                    log.warning("the coordinator answers again after %.1fs",
                                self.polled_at - self.lost_since)
                    self.lost_since = None
                with self._stats_lock:
                    stats = self.stats
                    if stats is not None and stats != self._stats_sent:
                        self._store.set(mb.STATS, stats)
                        self._stats_sent = stats
                if self._speed is not None and self.polled_at - last_speed >= 0.5:
                    last_speed = self.polled_at
                    self._store.set(mb.k_speed(self._id), self._speed().to_json())
            except (ControlLost, ControlTimeout, ValueError):
                if self.lost_since is None:
                    self.lost_since = time.monotonic()
                    log.warning("the coordinator does not answer; training goes on in the "
                                "current generation", exc_info=log.isEnabledFor(logging.DEBUG))
            self._stop.wait(self.interval_s)

    def _introduce(self) -> None:
        """Tell a restarted coordinator who this member is (it adopts the running ring)."""
        with self._stats_lock:
            self._stats_sent = None  # publish the progress again to the new coordinator
        if self.report is not None:
            self._store.append(mb.REPORTS, self.report().to_json() + "\n")
            log.info("reported to a restarted coordinator")
