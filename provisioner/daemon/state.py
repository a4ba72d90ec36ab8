"""The daemon's own state in SQLite: instances, intents, prices, decisions, events, metrics.

Design: write-ahead. Before any cloud call the daemon writes an *intent* row (a launch intent
carries the idempotency token that the driver passes to the cloud as its ClientToken), and
commits it; the call's result is written after. A daemon killed between the two finds the
open intent at its next start, repeats the launch with the *same* token (the cloud returns
the first attempt's instances instead of launching again) and closes it. Terminations are
written the same way. SQLite runs in WAL mode with ``synchronous=FULL`` so a committed row
survives a SIGKILL of the daemon or a power cut.

Cost accounting: the spend is Σ over instances of ∫ price(offering, t) dt over the instance's
life, with price a step function of the recorded price changes (:meth:`State.spend`). Times
are simulated POSIX seconds (the daemon's clock).

Readers that must not write (``provision status``) open it with :meth:`State.read_only`: the
database file is opened ``mode=ro``; while a daemon has it open its WAL is shared, and a
state no daemon holds (no ``-wal`` file) is read ``immutable``, so reading creates nothing
beside it either.

A full disk pauses the writes, not the daemon: a write that finds no space raises
:class:`DiskFull` (nothing written, the state keeps what it held) and logs ONE warning for
the whole pause; the first write that succeeds again logs one more and how many were
skipped once writes have gone on for :data:`RESUME_AFTER_S`. ``paused_since`` says whether
writes are paused now (the dashboard shows it).

A state file is created 0600 (its folder, when made, 0700) whatever the umask: it holds the
run's costs and its coordinator's address.

Rule for callers: write the intent (``begin_launch``/``begin_terminate``) *before* calling the
cloud and close it after; never delete rows (``provision status`` and the report read them).
One ``State`` object may be shared by threads (a lock serialises writes).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from pricing.model import Offering
from pricing.series import Step
from provisioner.errors import ConfigError, ProvisionerError, UserError

log = logging.getLogger(__name__)

#: Writes must go on succeeding this long (wall seconds) before a pause is over: on a full
#: disk SQLite still finds room for a page now and then, and each of those is not news.
RESUME_AFTER_S = 5.0


class DiskFull(ProvisionerError):
    """A write found no space: nothing was written. The caller skips what needed it and
    tries again later (the daemon's jobs run again; see :class:`State`)."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk is full: ENOSPC/EDQUOT, or SQLite's
    "database or disk is full" and "disk I/O error" (its WAL growing on a full disk)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFull):
            return True
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(e, sqlite3.Error) and any(
                m in str(e).lower() for m in ("disk is full", "disk i/o error")):
            return True
        e = e.__cause__ or e.__context__
    return False

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS intents (
    token TEXT PRIMARY KEY, kind TEXT NOT NULL, offering TEXT, count INTEGER,
    instance_ids TEXT NOT NULL DEFAULT '[]', created REAL NOT NULL, done REAL,
    outcome TEXT);
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY, offering TEXT NOT NULL, token TEXT, state TEXT NOT NULL,
    launched_at REAL NOT NULL, ended_at REAL, end_reason TEXT, draining_since REAL);
CREATE TABLE IF NOT EXISTS prices (
    offering TEXT NOT NULL, t REAL NOT NULL, price REAL NOT NULL);
CREATE INDEX IF NOT EXISTS prices_by_offering ON prices (offering, t);
CREATE TABLE IF NOT EXISTS decisions (
    t REAL NOT NULL, targets TEXT NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    t REAL NOT NULL, kind TEXT NOT NULL, instance_id TEXT, offering TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS metrics (
    t REAL NOT NULL, name TEXT NOT NULL, labels TEXT NOT NULL DEFAULT '', value REAL NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_by_name ON metrics (name, t);
"""


class IntentKind(StrEnum):
    """What a write-ahead intent is about."""

    LAUNCH = "launch"
    TERMINATE = "terminate"


class RowState(StrEnum):
    """An instance row's life: RUNNING (launched or adopted) -> DRAINING (asked to leave)
    -> TERMINATED (ended: terminated, preempted, gone while the daemon was down)."""

    RUNNING = "running"
    DRAINING = "draining"
    TERMINATED = "terminated"


class EventKind(StrEnum):
    """The kinds of the time line's events (``provision status`` and the report read them);
    the ring's membership events are copied as ``ring-<kind>`` (:func:`ring_kind`)."""

    STARTED = "started"
    STOPPED = "stopped"
    ERROR = "error"
    LAUNCH = "launch"
    LAUNCH_ERROR = "launch-error"
    LAUNCH_FAILED = "launch-failed"
    NO_CAPACITY = "no-capacity"
    DRAIN = "drain"
    TERMINATED = "terminated"
    NOTICE = "notice"
    KILLED = "killed"
    LEFT = "left"
    EXITED = "exited"
    REBALANCE = "rebalance"
    JOIN_DEADLINE = "join-deadline"  # none of its workers joined the ring in time
    BOOT_FAILED = "boot-failed"  # its boot or a worker unit shipped an exit report
    JOB_ERROR = "job-error"  # the job failed on a worker: the run launches no more
    ADOPTED = "adopted"
    CONTINUED = "continued"  # a daemon started again on a run's state: adopting its fleet
    GONE = "gone"
    RECOVERED_LAUNCH = "recovered-launch"
    PLAN_FAILED = "plan-failed"
    QUOTES_REJECTED = "quotes-rejected"
    RECONCILE_NOTE = "reconcile-note"
    MODE = "mode"  # the run's training mode, fixed at its first plan


def ring_kind(kind: object) -> str:
    """The time line's kind of a ring membership event (``join`` -> ``ring-join``)."""
    return f"ring-{kind}"


@dataclass(frozen=True)
class InstanceRow:
    id: str
    offering: Offering
    token: str | None
    state: RowState
    launched_at: float
    ended_at: float | None
    end_reason: str | None
    draining_since: float | None


@dataclass(frozen=True)
class Intent:
    token: str
    kind: IntentKind
    offering: Offering | None
    count: int
    instance_ids: tuple[str, ...]
    created: float
    done: float | None
    outcome: str | None


@dataclass(frozen=True)
class Event:
    t: float
    kind: str
    instance_id: str | None
    offering: str | None
    detail: str


class State:
    """The SQLite state file. Raises ConfigError when ``path`` cannot be opened."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self.paused_since: float | None = None  # wall time writes found a full disk
        self.skipped = 0
        self._ok_since: float | None = None
        try:
            if not self.path.exists():  # the run's owner's alone (its -wal and -shm follow)
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                # O_EXCL: a link in its place (even to nothing) is never followed
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.fchmod(fd, 0o600)
                os.close(fd)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False,
                                       isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise ConfigError(f"{self.path}: cannot open the state database ({exc}); "
                              f"set daemon.state_path to a writable file") from None

    @classmethod
    def read_only(cls, path: str | Path) -> "State":
        """Open an existing state file for reading only (see the module docstring).

        Raises UserError when it is missing or not a daemon's state.
        """
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path}: no state file (start `provision run` first, or pass "
                            f"--state/--workdir/--config)")
        live = path.with_name(path.name + "-wal").exists()
        uri = f"file:{quote(str(path.resolve()))}?mode=ro" + ("" if live else "&immutable=1")
        self = cls.__new__(cls)
        self.path = path
        self._lock = threading.RLock()
        self.paused_since, self.skipped, self._ok_since = None, 0, None
        try:
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False,
                                       isolation_level=None, timeout=30)
            tables = {r[0] for r in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error as exc:
            raise UserError(f"{path}: not a readable state file ({exc})") from None
        if not {"meta", "instances", "events"} <= tables:
            self._db.close()
            raise UserError(f"{path}: not a spotring state file (no daemon tables; a daemon "
                            f"starting on it writes them in a moment); pass the "
                            f"file `provision run` writes (WORKDIR/state.sqlite or "
                            f"daemon.state_path)")
        return self

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- low level ---------------------------------------------------------------------------
    def _write(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Every single-statement write goes through here (a test's kill seam); returns the
        number of rows changed."""
        with self._lock:
            return self._db.execute(sql, params).rowcount

    def _writemany(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Every multi-statement write goes through here, as one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _w(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self._writing():
            return self._write(sql, params)

    def _wm(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        with self._writing():
            self._writemany(statements)

    def pause(self, exc: BaseException) -> None:
        """Note a write that found the disk full (the state's own, or one of the daemon's
        files beside it): the first of a pause logs the one message."""
        with self._lock:
            self.skipped += 1
            self._ok_since = None
            first = self.paused_since is None
            if first:
                self.paused_since = time.time()
        if first:
            log.warning("%s: %s: the daemon's writes are paused (the state keeps what it "
                        "holds; the ring trains on) and resume by themselves when space "
                        "returns", self.path.parent, exc)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write, or :class:`DiskFull` when there is no space for it (see the module
        docstring: one message per pause, one when writes resume)."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            if not is_disk_full(exc):
                raise
            self.pause(exc)
            raise DiskFull(f"{self.path}: {exc}") from None
        if self.paused_since is not None:
            now = time.time()
            with self._lock:
                if self._ok_since is None:
                    self._ok_since = now
                if now - self._ok_since < RESUME_AFTER_S:
                    return  # a page found room; the pause is over only once writes keep going
                since, ok, skipped = self.paused_since, self._ok_since, self.skipped
                self.paused_since, self.skipped, self._ok_since = None, 0, None
            log.warning("%s: space is back: the daemon's writes resumed after %.0f s "
                        "(%d skipped)", self.path.parent, ok - since, skipped)

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- meta --------------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._w("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def set_metas(self, values: Mapping[str, Any]) -> None:
        """Set several meta keys in one transaction (all or none survive a kill)."""
        self._wm(("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, json.dumps(v)))
                        for k, v in values.items())

    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    # -- intents -----------------------------------------------------------------------------
    def begin_launch(self, token: str, offering: Offering, count: int, t: float) -> None:
        """Record a launch intent before the cloud call (idempotent for the same token)."""
        self._w("INSERT OR IGNORE INTO intents (token, kind, offering, count, created) "
                    "VALUES (?, 'launch', ?, ?, ?)", (token, offering.key, count, t))

    def finish_launch(self, token: str, instances: Sequence[tuple[str, Offering]], t: float,
                      outcome: str = "ok") -> None:
        """Close a launch intent and record its instances, in one transaction."""
        ids = [i for i, _ in instances]
        stmts: list[tuple[str, Sequence[Any]]] = [
            ("INSERT OR IGNORE INTO instances (id, offering, token, state, launched_at) "
             "VALUES (?, ?, ?, 'running', ?)", (iid, off.key, token, t)) for iid, off in instances]
        stmts.append(("UPDATE intents SET instance_ids = ?, done = ?, outcome = ? WHERE token = ?",
                      (json.dumps(ids), t, outcome, token)))
        self._wm(stmts)

    def begin_terminate(self, token: str, instance_ids: Sequence[str], t: float) -> None:
        """Record a termination intent before the cloud call."""
        self._w("INSERT OR IGNORE INTO intents (token, kind, count, instance_ids, created) "
                    "VALUES (?, 'terminate', ?, ?, ?)",
                    (token, len(instance_ids), json.dumps(list(instance_ids)), t))

    def finish_terminate(self, token: str, t: float, reason: str) -> None:
        """Close a termination intent and end its instances."""
        rows = self._rows("SELECT instance_ids FROM intents WHERE token = ?", (token,))
        ids = json.loads(rows[0][0]) if rows else []
        stmts: list[tuple[str, Sequence[Any]]] = [
            ("UPDATE instances SET state = 'terminated', ended_at = ?, end_reason = ? "
             "WHERE id = ? AND ended_at IS NULL", (t, reason, iid)) for iid in ids]
        stmts.append(("UPDATE intents SET done = ?, outcome = 'ok' WHERE token = ?", (t, token)))
        self._wm(stmts)

    def abandon_intent(self, token: str, t: float, outcome: str) -> None:
        self._w("UPDATE intents SET done = ?, outcome = ? WHERE token = ?", (t, outcome, token))

    def open_intents(self) -> list[Intent]:
        """Intents whose cloud call may or may not have happened (the daemon died between)."""
        return [self._intent(r) for r in self._rows(
            "SELECT token, kind, offering, count, instance_ids, created, done, outcome "
            "FROM intents WHERE done IS NULL ORDER BY created")]

    def intents(self) -> list[Intent]:
        return [self._intent(r) for r in self._rows(
            "SELECT token, kind, offering, count, instance_ids, created, done, outcome "
            "FROM intents ORDER BY created")]

    @staticmethod
    def _intent(r: tuple) -> Intent:
        return Intent(r[0], IntentKind(r[1]), Offering.from_key(r[2]) if r[2] else None, int(r[3] or 0),
                      tuple(json.loads(r[4])), r[5], r[6], r[7])

    # -- instances ---------------------------------------------------------------------------
    def adopt(self, instance_id: str, offering: Offering, t: float, token: str | None = None) -> None:
        """Record an instance found in the cloud (no-op when already known and live)."""
        self._w("INSERT OR IGNORE INTO instances (id, offering, token, state, launched_at) "
                    "VALUES (?, ?, ?, 'running', ?)", (instance_id, offering.key, token, t))

    def mark_draining(self, instance_id: str, t: float) -> bool:
        """Mark an instance as draining; False when it already was (or is gone)."""
        return self._w("UPDATE instances SET state = 'draining', draining_since = ? "
                           "WHERE id = ? AND ended_at IS NULL AND draining_since IS NULL",
                           (t, instance_id)) > 0

    def end_instance(self, instance_id: str, t: float, reason: str) -> bool:
        """Record that an instance is gone; False when it already was."""
        return self._w("UPDATE instances SET state = 'terminated', ended_at = ?, "
                           "end_reason = ? WHERE id = ? AND ended_at IS NULL",
                           (t, reason, instance_id)) > 0

    def live_instances(self) -> list[InstanceRow]:
        return [self._instance(r) for r in self._rows(
            "SELECT id, offering, token, state, launched_at, ended_at, end_reason, draining_since "
            "FROM instances WHERE ended_at IS NULL ORDER BY launched_at, id")]

    def instances(self) -> list[InstanceRow]:
        return [self._instance(r) for r in self._rows(
            "SELECT id, offering, token, state, launched_at, ended_at, end_reason, draining_since "
            "FROM instances ORDER BY launched_at, id")]

    @staticmethod
    def _instance(r: tuple) -> InstanceRow:
        return InstanceRow(r[0], Offering.from_key(r[1]), r[2], RowState(r[3]), r[4], r[5], r[6],
                           r[7])

    # -- prices and cost ---------------------------------------------------------------------
    def record_price(self, offering: Offering, t: float, price: float) -> None:
        """Record a price if it differs from the latest recorded one for the offering."""
        with self._lock:
            last = self._db.execute("SELECT price FROM prices WHERE offering = ? ORDER BY t DESC "
                                    "LIMIT 1", (offering.key,)).fetchone()
            if last is None or abs(last[0] - price) > 1e-12:
                self._w("INSERT INTO prices VALUES (?, ?, ?)", (offering.key, t, price))

    def price_series(self, offering: Offering) -> list[tuple[float, float]]:
        return [(t, p) for t, p in self._rows(
            "SELECT t, price FROM prices WHERE offering = ? ORDER BY t", (offering.key,))]

    def price_at(self, offering: Offering, t: float) -> float | None:
        """The recorded price in force at ``t`` (the first one when ``t`` precedes it)."""
        series = self.price_series(offering)
        return Step.of(series).at(t) if series else None

    def spend(self, now: float) -> float:
        """Σ over instances of ∫ price dt (USD), open instances counted up to ``now``."""
        total = 0.0
        cache: dict[Offering, list[tuple[float, float]]] = {}
        for row in self.instances():
            series = cache.setdefault(row.offering, self.price_series(row.offering))
            end = row.ended_at if row.ended_at is not None else now
            if series:
                total += Step.of(series).between(row.launched_at, end) / 3600.0
        return total

    def instance_seconds(self, now: float) -> float:
        return sum(max(0.0, (r.ended_at if r.ended_at is not None else now) - r.launched_at)
                   for r in self.instances())

    # -- decisions, events, metrics ----------------------------------------------------------
    def record_decision(self, t: float, targets: Mapping[Offering, int], reason: str) -> None:
        self._w("INSERT INTO decisions VALUES (?, ?, ?)",
                    (t, json.dumps({o.key: n for o, n in targets.items()}), reason))

    def decisions(self, limit: int = 100) -> list[tuple[float, dict[str, int], str]]:
        rows = self._rows("SELECT t, targets, reason FROM decisions"
                          " ORDER BY t DESC, rowid DESC LIMIT ?", (limit,))
        return [(t, json.loads(targets), reason) for t, targets, reason in reversed(rows)]

    def record_event(self, t: float, kind: str, instance_id: str | None = None,
                     offering: Offering | None = None, detail: str = "") -> None:
        self._w("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                    (t, kind, instance_id, offering.key if offering else None, detail))

    def events(self, limit: int | None = None, kinds: Sequence[str] | None = None, *,
               in_time: bool = False) -> list[Event]:
        """The ``limit`` newest events (all when None), oldest first: in the order they
        were written, or with ``in_time`` in the order of their times."""
        sql = "SELECT t, kind, instance_id, offering, detail FROM events"
        params: list[Any] = []
        if kinds:
            sql += f" WHERE kind IN ({','.join('?' * len(kinds))})"
            params += list(kinds)
        sql += " ORDER BY t DESC, rowid DESC" if in_time else " ORDER BY rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [Event(*r) for r in reversed(self._rows(sql, params))]

    def count_events(self) -> int:
        return int(self._rows("SELECT COUNT(*) FROM events")[0][0])

    def record_metrics(self, t: float, values: Iterable[tuple[str, str, float]]) -> None:
        """Record (name, labels, value) samples at ``t`` in one transaction."""
        self._wm(("INSERT INTO metrics VALUES (?, ?, ?, ?)", (t, n, lab, float(v)))
                        for n, lab, v in values)

    def metric_series(self, name: str) -> list[tuple[float, str, float]]:
        return [tuple(r) for r in self._rows(  # type: ignore[misc]
            "SELECT t, labels, value FROM metrics WHERE name = ? ORDER BY t", (name,))]
