"""The coordinator's control store: a key-value server that only token holders can reach.

Design: the membership protocol (:mod:`trainer.protocol.messages`) and each generation's gloo/NCCL
rendezvous run over one key-value store, as they did over ``torch.distributed.TCPStore``,
which has no authentication: anyone who could reach its port could forge generations,
drains and verdicts. This server keeps the store's semantics (``set``, blocking ``get`` and
``wait``, atomic ``add``, ``check``, ``multi_get``, ``compare_set`` ...) but every connection
must first pass the token handshake of :mod:`trainer.protocol.admission`, and every request
after it is a sealed frame. The wire bodies are plain bytes::

    request   op (1) | timeout_ms (4) | count (2) | (length (4) | bytes) * count
    response  status (1) | count (2) | (length (4) | bytes) * count

One asyncio loop in a background thread serves every connection, so idle or slow ones cost
a socket and a small buffer, never a thread. A connection that has not proved the token
within ``handshake_s`` is closed, and at most ``max_pending`` may wait at once: the oldest is
closed to make room (counted, with a log line at most every ``LOG_EVERY_S``), so a flood of
idle connections cannot keep an honest joiner out. A frame that fails its tag closes its
connection. Everything refused is counted in :attr:`StoreServer.counters`.

The coordinator lives in the same process: it reads and writes the same table directly
(:meth:`StoreServer.local_get` and friends, no round trip), and a local write wakes the
remote waiters.

Rule for callers: :meth:`StoreServer.start` binds where it is told, never elsewhere; it raises
``OSError`` at once when the address is busy or not this machine's.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from trainer.errors import AuthError, Malformed
from trainer.protocol import admission

log = logging.getLogger(__name__)

# operations
SET, GET, ADD, CHECK, WAIT, MULTI_GET, MULTI_SET, COMPARE_SET, DELETE, NUM_KEYS, APPEND, \
    PING, PEEK, BLOB_PUT, BLOB_COMMIT, BLOB_GET = range(1, 17)
OPS = {SET: "set", GET: "get", ADD: "add", CHECK: "check", WAIT: "wait",
       MULTI_GET: "multi_get", MULTI_SET: "multi_set", COMPARE_SET: "compare_set",
       DELETE: "delete", NUM_KEYS: "num_keys", APPEND: "append", PING: "ping", PEEK: "peek",
       BLOB_PUT: "blob_put", BLOB_COMMIT: "blob_commit", BLOB_GET: "blob_get"}
MAX_BLOB_CHUNK = 16 << 20
# response status
OK, TIMEOUT, ERROR = 0, 1, 2

HANDSHAKE_S = 5.0  # a connection must prove the token within this (honest ones take < 1 ms)
MAX_PENDING = 256  # connections allowed to be mid-handshake at once (the oldest makes room)
MAX_KEY = 4096  # bytes in a key
MAX_ITEMS = 65536  # fields in one request
LOG_EVERY_S = 10.0  # the flood warning is logged at most this often

_HEAD = struct.Struct("!BIH")
_RESP = struct.Struct("!BH")
_LEN = struct.Struct("!I")


class Blobs(Protocol):
    """Where the store puts large objects (the ring's snapshots): written in chunks by a
    worker, committed whole, read back in chunks. Implemented by
    :class:`trainer.state.snapshot.Vault`; every method may block (it runs off the event loop)."""

    def put(self, name: str, offset: int, data: bytes) -> None: ...

    def commit(self, name: str, manifest: bytes) -> bytes: ...

    def get(self, name: str, offset: int, length: int) -> bytes: ...


def _pack_fields(fields: Sequence[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(f)) + f for f in fields)


def _unpack_fields(body: bytes, offset: int, count: int) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(count):
        if offset + _LEN.size > len(body):
            raise Malformed("truncated field length")
        (n,) = _LEN.unpack_from(body, offset)
        offset += _LEN.size
        if offset + n > len(body):
            raise Malformed("truncated field")
        out.append(body[offset:offset + n])
        offset += n
    if offset != len(body):
        raise Malformed("trailing bytes")
    return out


def encode_request(op: int, fields: Sequence[bytes], timeout_ms: int = 0) -> bytes:
    """The body of one request."""
    return _HEAD.pack(op, max(0, min(timeout_ms, 2**32 - 1)), len(fields)) + _pack_fields(fields)


def decode_request(body: bytes) -> tuple[int, int, list[bytes]]:
    """``(op, timeout_ms, fields)`` of a request body. Raises :class:`Malformed`."""
    if len(body) < _HEAD.size:
        raise Malformed("short request")
    op, timeout_ms, count = _HEAD.unpack_from(body)
    if op not in OPS:
        raise Malformed(f"unknown operation {op}")
    if count > MAX_ITEMS:
        raise Malformed(f"{count} fields")
    return op, timeout_ms, _unpack_fields(body, _HEAD.size, count)


def encode_response(status: int, fields: Sequence[bytes] = ()) -> bytes:
    """The body of one response."""
    return _RESP.pack(status, len(fields)) + _pack_fields(fields)


def decode_response(body: bytes) -> tuple[int, list[bytes]]:
    """``(status, fields)`` of a response body. Raises :class:`Malformed`."""
    if len(body) < _RESP.size:
        raise Malformed("short response")
    status, count = _RESP.unpack_from(body)
    return status, _unpack_fields(body, _RESP.size, count)


class StoreServer:
    """The authenticated store (see the module docstring)."""

    def __init__(self, host: str, port: int, token: bytes, *, handshake_s: float = HANDSHAKE_S,
                 max_pending: int = MAX_PENDING, blobs: Blobs | None = None) -> None:
        if not token:
            raise ValueError("token: empty; pass the job token")
        self._host, self._port, self._token = host, port, token
        self._handshake_s = handshake_s
        self._max_pending = max_pending
        self._blobs = blobs
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Condition | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._pending: collections.OrderedDict[int, asyncio.StreamWriter] = (
            collections.OrderedDict())
        self._open: set[asyncio.StreamWriter] = set()
        self._next_conn = 0
        self._last_flood_log = -LOG_EVERY_S
        self._last_warned: dict[str, float] = {}  # kind -> monotonic time of its last line
        self.counters: dict[str, int] = collections.Counter()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind ``host:port`` and serve in a background thread. Raises ``OSError`` (busy)."""
        sock = socket.create_server((self._host, self._port), backlog=1024, reuse_port=False)
        sock.setblocking(False)
        self._sock = sock
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve_forever, args=(ready,),
                                        name="spotring-store", daemon=True)
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        """Close every connection and the port."""
        loop = self._loop
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop = None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` it listens on (the real port when started with 0)."""
        if self._sock is None:
            raise RuntimeError("store not started")
        return self._host, int(self._sock.getsockname()[1])

    def _serve_forever(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._changed = asyncio.Condition()
        self._server = loop.run_until_complete(
            asyncio.start_server(self._connection, sock=self._sock, limit=2**16))
        ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for w in list(self._open):
                w.close()
            tasks = asyncio.all_tasks(loop)  # waiters and handshakes: cancelled, then gone
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    # -- local access (the coordinator, in this process) --------------------------------------

    def local_get(self, key: str) -> bytes | None:
        """The value of ``key``, or None when it is not set."""
        with self._lock:
            return self._data.get(key)

    def local_items(self, prefix: str) -> dict[str, bytes]:
        """Every key starting with ``prefix`` and its value."""
        with self._lock:
            return {k: v for k, v in self._data.items() if k.startswith(prefix)}

    def local_set(self, key: str, value: bytes) -> None:
        """Set ``key``; wakes remote waiters."""
        with self._lock:
            self._data[key] = bytes(value)
        self._wake()

    def local_add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the counter ``key`` (0 when unset); returns the new value."""
        with self._lock:
            v = self._add(key, delta)
        self._wake()
        return v

    def local_delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def _add(self, key: str, delta: int) -> int:
        old = self._data.get(key, b"0")
        try:
            v = int(old) + delta
        except ValueError:
            raise Malformed(f"add on {key!r}, which does not hold a number") from None
        self._data[key] = str(v).encode()
        return v

    def _wake(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(lambda: loop.create_task(self._notify()))

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    # -- connections --------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        conn = self._next_conn
        self._next_conn += 1
        self._open.add(writer)
        self._pending[conn] = writer
        self.counters["connections"] += 1
        if len(self._pending) > self._max_pending:
            _, oldest = self._pending.popitem(last=False)
            oldest.close()
            self.counters["evicted"] += 1
            now = time.monotonic()
            if now - self._last_flood_log >= LOG_EVERY_S:
                self._last_flood_log = now
                log.warning("control port: more than %d connections have not proved the job "
                            "token; closing the oldest (%d so far). A port scan or a flood: "
                            "only token holders are served", self._max_pending,
                            self.counters["evicted"])
        try:
            await self._connection_life(conn, reader, writer)
        except asyncio.CancelledError:
            # the store stopping: end quietly (Python 3.11's start_server logs the
            # traceback of a connection task that ends cancelled, one per open connection)
            self._close(conn, writer)

    async def _connection_life(self, conn: int, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        try:
            chan = await self._handshake(reader, writer)
        except (AuthError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                ConnectionError, OSError) as e:
            if isinstance(e, AuthError):
                self.counters["refused"] += 1
                self._warn_limited("refused", "control port: refused a connection from %s: %s "
                                   "(%d refused so far; one line per %.0fs)",
                                   writer.get_extra_info("peername"), e,
                                   self.counters["refused"], LOG_EVERY_S)
            else:
                self.counters["unauthenticated_closed"] += 1
            self._close(conn, writer)
            return
        finally:
            self._pending.pop(conn, None)
        try:
            await self._serve(reader, writer, chan)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except (AuthError, ValueError) as e:
            self.counters["bad_frames"] += 1
            self._warn_limited("bad_frames", "control port: closed a connection from %s: %s "
                               "(%d bad frames so far; one line per %.0fs)",
                               writer.get_extra_info("peername"), e,
                               self.counters["bad_frames"], LOG_EVERY_S)
        finally:
            self._close(conn, writer)

    def _warn_limited(self, kind: str, msg: str, *args: object) -> None:
        """A warning of ``kind`` at most once per ``LOG_EVERY_S`` (like the evictions'): a
        flood of wrong proofs writes a line every few seconds, not one per attempt (it wrote
        325 KB of log in 15 s); the counters keep the full count."""
        now = time.monotonic()
        if now - self._last_warned.get(kind, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._last_warned[kind] = now
            log.warning(msg, *args)

    def _close(self, conn: int, writer: asyncio.StreamWriter) -> None:
        self._pending.pop(conn, None)
        self._open.discard(writer)
        writer.close()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> admission.Channel:
        hello, nonce = admission.server_hello()
        writer.write(hello)
        answer = await asyncio.wait_for(reader.readexactly(admission.CLIENT_LEN),
                                        self._handshake_s)
        try:
            proof, chan = admission.server_check(self._token, nonce, answer)
        except AuthError:
            writer.write(admission.REFUSED)  # tells an honest worker its token is wrong
            await writer.drain()
            raise
        writer.write(proof)
        await writer.drain()
        return chan

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     chan: admission.Channel) -> None:
        while True:
            n = admission.frame_length(await reader.readexactly(4))
            rest = await reader.readexactly(n + admission.TAG)
            body = chan.open(rest[:n], rest[n:])
            try:
                op, timeout_ms, fields = decode_request(body)
                resp = await self._handle(op, timeout_ms, fields)
            except Malformed as e:
                self.counters["malformed"] += 1
                resp = encode_response(ERROR, [str(e).encode()])
            writer.write(chan.seal(resp))
            await writer.drain()

    # -- operations ---------------------------------------------------------------------------

    @staticmethod
    def _key(raw: bytes) -> str:
        if len(raw) > MAX_KEY:
            raise Malformed("key too long")
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise Malformed("key is not UTF-8") from None

    async def _until(self, pred: Callable[[], bool], timeout_ms: int) -> bool:
        """Wait until ``pred()`` (checked under the table lock) or the timeout; True if met."""
        assert self._changed is not None

        def check() -> bool:
            with self._lock:
                return pred()

        if check():
            return True
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(check), timeout_ms / 1000)
            return True
        except asyncio.TimeoutError:
            return False

    async def _handle(self, op: int, timeout_ms: int, f: list[bytes]) -> bytes:
        data = self._data
        if op == PING:
            return encode_response(OK)
        if op in (SET, APPEND):
            if len(f) != 2:
                raise Malformed("set takes a key and a value")
            key = self._key(f[0])
            with self._lock:
                data[key] = f[1] if op == SET else data.get(key, b"") + f[1]
            await self._notify()
            return encode_response(OK)
        if op == MULTI_SET:
            if len(f) % 2:
                raise Malformed("multi_set takes key/value pairs")
            pairs = [(self._key(f[i]), f[i + 1]) for i in range(0, len(f), 2)]
            with self._lock:
                data.update(pairs)
            await self._notify()
            return encode_response(OK)
        if op == ADD:
            if len(f) != 2:
                raise Malformed("add takes a key and a number")
            key = self._key(f[0])
            try:
                delta = int(f[1])
            except ValueError:
                raise Malformed("add: the amount is not a number") from None
            with self._lock:
                v = self._add(key, delta)
            await self._notify()
            return encode_response(OK, [str(v).encode()])
        if op == COMPARE_SET:
            if len(f) != 3:
                raise Malformed("compare_set takes a key, the expected and the desired value")
            key = self._key(f[0])
            with self._lock:
                cur = data.get(key)
                if (cur is None and f[1] == b"") or cur == f[1]:
                    data[key] = cur = f[2]
                out = cur if cur is not None else f[1]
            await self._notify()
            return encode_response(OK, [out])
        if op == DELETE:
            key = self._key(f[0]) if len(f) == 1 else None
            if key is None:
                raise Malformed("delete takes one key")
            with self._lock:
                found = data.pop(key, None) is not None
            return encode_response(OK, [b"1" if found else b"0"])
        if op == NUM_KEYS:
            with self._lock:
                return encode_response(OK, [str(len(data)).encode()])
        if op in (BLOB_PUT, BLOB_COMMIT, BLOB_GET):
            return await self._blob(op, f)
        keys = [self._key(k) for k in f]
        if op == CHECK:
            with self._lock:
                return encode_response(OK, [b"1" if all(k in data for k in keys) else b"0"])
        if op == PEEK:  # never waits: a missing key comes back as an empty field, flagged
            with self._lock:
                vals = [data.get(k) for k in keys]
            flags = bytes(0 if v is None else 1 for v in vals)
            return encode_response(OK, [flags, *[v or b"" for v in vals]])
        if op in (GET, WAIT, MULTI_GET):
            if op == GET and len(keys) != 1:
                raise Malformed("get takes one key")
            if not await self._until(lambda: all(k in data for k in keys), timeout_ms):
                missing = [k for k in keys if k not in data]
                return encode_response(TIMEOUT, [f"timed out waiting for {missing[:4]}".encode()])
            if op == WAIT:
                return encode_response(OK)
            with self._lock:
                return encode_response(OK, [data[k] for k in keys])
        raise Malformed(f"operation {op}")  # pragma: no cover - decode_request checked it

    async def _blob(self, op: int, f: list[bytes]) -> bytes:
        """Large objects, handed to the blob store on a thread (it may write to disk or to a
        bucket): the loop keeps serving heartbeats meanwhile."""
        blobs = self._blobs
        if blobs is None:
            return encode_response(ERROR, [b"this coordinator keeps no snapshots"])
        try:
            name = f[0].decode()
            if not name or len(name) > 200 or "/" in name or name.startswith("."):
                raise Malformed("bad blob name")
            loop = asyncio.get_running_loop()
            if op == BLOB_PUT and len(f) == 3:
                if len(f[2]) > MAX_BLOB_CHUNK:
                    raise Malformed("blob chunk too large")
                await loop.run_in_executor(None, blobs.put, name, int(f[1]), f[2])
                return encode_response(OK)
            if op == BLOB_COMMIT and len(f) == 2:
                out = await loop.run_in_executor(None, blobs.commit, name, f[1])
                await self._notify()
                return encode_response(OK, [out])
            if op == BLOB_GET and len(f) == 3:
                length = min(int(f[2]), MAX_BLOB_CHUNK)
                chunk = await loop.run_in_executor(None, blobs.get, name, int(f[1]), length)
                return encode_response(OK, [chunk])
            raise Malformed("blob operation takes a name and its fields")
        except (ValueError, UnicodeDecodeError) as e:
            self.counters["malformed"] += 1
            return encode_response(ERROR, [f"blob: {e}".encode()[:300]])
        except OSError as e:
            return encode_response(ERROR, [f"blob store: {e}".encode()[:300]])


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit; returns the new limit.

    Each connection costs one descriptor: at the common default of 1,024, a thousand idle
    connections would leave none for an honest joiner.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return int(want)
        except (ValueError, OSError):
            return int(soft)
    return int(soft)


def stats_of(counters: dict[str, Any]) -> dict[str, int]:
    """The counters worth reporting (refused handshakes, evictions, bad frames, malformed)."""
    return {k: int(counters.get(k, 0)) for k in ("connections", "refused", "evicted",
                                                 "unauthenticated_closed", "bad_frames",
                                                 "malformed")}
