"""The price store: an SQLite time series of believable quotes.

Design: stdlib ``sqlite3`` in WAL mode, so one writer (the daemon's price poller) and any
number of readers (the optimiser, ``provision status``, other processes) work at once:
readers see the last committed state and never block the writer. Each thread gets its own
connection (``sqlite3`` connections must not be shared across threads); a write is one
``BEGIN IMMEDIATE`` transaction, so a reader never sees half a batch. Times are stored as
Unix seconds (REAL), quotes keyed by ``(offering key, time)``: appending the same quote twice
changes nothing.

Rule for callers: store only quotes that passed :func:`pricing.sanity.check`. ``latest``
returns each offering's newest quote with its real time, so a stale price says how old it
is; :meth:`PriceStore.prune` keeps each offering's newest quote whatever its age.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable

from pricing.errors import StoreError
from pricing.model import Offering, PriceQuote, utc

_SCHEMA = """
CREATE TABLE IF NOT EXISTS quotes (
    offering   TEXT NOT NULL,
    time       REAL NOT NULL,
    price      REAL NOT NULL,
    on_demand  REAL,
    source     TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (offering, time)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS quotes_time ON quotes (time);
"""

#: How long a connection waits for a lock before failing (a writer's batch commits in ms).
BUSY_TIMEOUT_S = 30.0


def _ts(dt: datetime) -> float:
    return utc(dt).timestamp()


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


class PriceStore:
    """Quotes in an SQLite file (or ``":memory:"`` for one thread's tests)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        conn = self._conn()
        try:
            with conn:
                conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot create the price store: {exc}") from None

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                if self.path != ":memory:":
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            except (sqlite3.Error, OSError) as exc:
                raise StoreError(f"{self.path}: cannot open the price store: {exc}") from None
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def journal_mode(self) -> str:
        return str(self._conn().execute("PRAGMA journal_mode").fetchone()[0])

    def _write(self, sql: str, rows: list[tuple] | tuple = ()) -> int:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if isinstance(rows, list):
                    cur = conn.executemany(sql, rows)
                else:
                    cur = conn.execute(sql, rows)
                count = cur.rowcount
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: write failed: {exc}") from None
        return count

    def append(self, quotes: Iterable[PriceQuote]) -> int:
        """Store quotes in one transaction (a repeated (offering, time) is replaced).

        Returns the number of rows written. Raises StoreError on an SQLite failure, in which
        case nothing of the batch is stored.
        """
        rows = [(q.offering.key, _ts(q.time), float(q.price_per_hour),
                 None if q.on_demand_per_hour is None else float(q.on_demand_per_hour), q.source)
                for q in quotes]
        if not rows:
            return 0
        return self._write("INSERT OR REPLACE INTO quotes (offering, time, price, on_demand, source) "
                           "VALUES (?, ?, ?, ?, ?)", rows)

    def _read(self, sql: str, args: tuple) -> list[PriceQuote]:
        try:
            rows = self._conn().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: read failed: {exc}") from None
        return [PriceQuote(Offering.from_key(k), _dt(t), p, od, src) for k, t, p, od, src in rows]

    def latest(self, now: datetime | None = None, max_age: timedelta | None = None) -> list[PriceQuote]:
        """The newest quote per offering at or before ``now`` (default: all), sorted by
        offering; with ``max_age``, offerings whose newest quote is older are left out."""
        upper = _ts(now) if now is not None else float("inf")
        lower = upper - max_age.total_seconds() if (max_age is not None and now is not None) else -float("inf")
        return self._read(
            "SELECT q.offering, q.time, q.price, q.on_demand, q.source FROM quotes q "
            "JOIN (SELECT offering, MAX(time) AS t FROM quotes WHERE time <= ? GROUP BY offering) m "
            "ON q.offering = m.offering AND q.time = m.t WHERE q.time >= ? ORDER BY q.offering",
            (upper, lower))

    def history(self, offering: Offering, start: datetime | None = None,
                end: datetime | None = None) -> list[PriceQuote]:
        """Quotes of one offering with ``start <= time <= end``, oldest first."""
        lo = _ts(start) if start is not None else -float("inf")
        hi = _ts(end) if end is not None else float("inf")
        return self._read("SELECT offering, time, price, on_demand, source FROM quotes "
                          "WHERE offering = ? AND time >= ? AND time <= ? ORDER BY time",
                          (offering.key, lo, hi))

    def prune(self, older_than: datetime) -> int:
        """Delete quotes older than ``older_than``, except each offering's newest quote.

        Returns the number of rows deleted.
        """
        return self._write(
            "DELETE FROM quotes WHERE time < ? AND (offering, time) NOT IN "
            "(SELECT offering, MAX(time) FROM quotes GROUP BY offering)", (_ts(older_than),))

    def count(self) -> int:
        """Number of stored quotes."""
        return int(self._conn().execute("SELECT COUNT(*) FROM quotes").fetchone()[0])
