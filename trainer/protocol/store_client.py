"""A client of the coordinator's control store that is also a ``torch.distributed.Store``.

Design: :class:`ControlStore` opens one TCP connection, passes the token handshake of
:mod:`trainer.protocol.admission` (it also checks that the server holds the token, so a stranger
listening on the coordinator's address cannot feed a worker forged plans) and then sends
sealed requests one at a time under a lock. Because it subclasses ``torch.distributed.Store``
(pybind's trampoline calls back into these methods), a generation's process group can be
built on it through ``PrefixStore``: gloo's and NCCL's rendezvous then run over the
authenticated channel too, so no process without the token can join a generation or
redirect its rendezvous.

Errors: :class:`ControlTimeout` when a ``get``/``wait`` outlives its timeout;
:class:`ControlLost` when the connection breaks (the next call connects again, so a
coordinator restarted on the same address is found again), :class:`TokenRefused` when the
server refuses the token (all are ``RuntimeError``, which the C++ side of torch turns into
its own errors when it is the caller).

Rule for callers: keep a reference to the Python object for as long as torch may call it
(pybind finds the Python overrides through it); give each thread that blocks for long (the
heartbeat, a group forming) its own connection with :meth:`ControlStore.clone`.
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Sequence

import torch.distributed as dist

from trainer.errors import AuthError, ControlLost, ControlTimeout, TokenRefused
from trainer.protocol import admission
from trainer.protocol import store as wire


def _seconds(timeout: datetime.timedelta | float | None, default: float) -> float:
    if timeout is None:
        return default
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


class ControlStore(dist.Store):
    """One authenticated connection to the coordinator's store (see the module docstring)."""

    def __init__(self, host: str, port: int, token: bytes, *, timeout_s: float = 30.0,
                 connect_timeout_s: float = 5.0) -> None:
        super().__init__()
        self.host, self.port = host, port
        self._token = token
        self.timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._connect()

    def _connect(self) -> None:
        host, port, token = self.host, self.port, self._token
        try:
            sock = socket.create_connection((host, port), timeout=self._connect_timeout_s)
        except OSError as e:
            raise ControlLost(f"cannot connect to {host}:{port}: {e}") from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = self._read_exact(sock, admission.HELLO_LEN)
            answer, cn = admission.client_answer(token, hello)
            sock.sendall(answer)
            proof = self._read_exact(sock, admission.MAC)
            self._chan = admission.client_check(token, hello, cn, proof)
        except (AuthError, OSError, ControlLost) as e:
            sock.close()
            if isinstance(e, TokenRefused):
                raise TokenRefused(f"{host}:{port} refused this worker's token: check "
                                   "--token-file (it must hold the job's token)") from e
            if isinstance(e, ControlLost):
                raise ControlLost(f"{host}:{port} closed the connection during the token "
                                  "handshake: wrong job token?") from e
            raise ControlLost(f"{host}:{port}: {e}") from e
        self._sock = sock
        self.local_address = sock.getsockname()[0]

    @staticmethod
    def _read_exact(sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ControlLost("connection closed by the coordinator")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        """Close the connection (a call blocked on it in another thread fails at once); the
        next call connects again."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass

    def clone(self) -> ControlStore:
        """A new connection to the same store (for another thread)."""
        return ControlStore(self.host, self.port, self._token, timeout_s=self.timeout_s,
                            connect_timeout_s=self._connect_timeout_s)

    # -- one request --------------------------------------------------------------------------

    def _call(self, op: int, fields: Sequence[bytes], wait_s: float = 0.0) -> list[bytes]:
        body = wire.encode_request(op, fields, int(wait_s * 1000))
        with self._lock:
            if self._sock is None:  # lost earlier: one new connection (it may be back)
                self._connect()
            sock = self._sock
            assert sock is not None
            try:
                sock.settimeout(wait_s + 30.0)
                sock.sendall(self._chan.seal(body))
                n = admission.frame_length(self._read_exact(sock, 4))
                rest = self._read_exact(sock, n + admission.TAG)
                reply = self._chan.open(rest[:n], rest[n:])
            except (OSError, AuthError, ValueError, ControlLost) as e:
                self.close()
                raise ControlLost(f"control connection to {self.host}:{self.port} lost: "
                                  f"{e}") from e
        status, out = wire.decode_response(reply)
        if status == wire.TIMEOUT:
            raise ControlTimeout(out[0].decode(errors="replace") if out else "timed out")
        if status != wire.OK:
            raise ControlLost(f"the coordinator refused a request: "
                              f"{out[0].decode(errors='replace') if out else status}")
        return out

    @staticmethod
    def _b(value: bytes | str) -> bytes:
        return value.encode() if isinstance(value, str) else bytes(value)

    # -- the torch.distributed.Store interface --------------------------------------------------

    def set(self, key: str, value: bytes | str) -> None:  # type: ignore[override]
        self._call(wire.SET, [key.encode(), self._b(value)])

    def get(self, key: str) -> bytes:  # type: ignore[override]
        return self._call(wire.GET, [key.encode()], self.timeout_s)[0]

    def add(self, key: str, amount: int) -> int:  # type: ignore[override]
        return int(self._call(wire.ADD, [key.encode(), str(int(amount)).encode()])[0])

    def check(self, keys: list[str]) -> bool:  # type: ignore[override]
        return self._call(wire.CHECK, [k.encode() for k in keys])[0] == b"1"

    def wait(self, keys: list[str],  # type: ignore[override]
             timeout: datetime.timedelta | None = None) -> None:
        self._call(wire.WAIT, [k.encode() for k in keys], _seconds(timeout, self.timeout_s))

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        return self._call(wire.MULTI_GET, [k.encode() for k in keys], self.timeout_s)

    def multi_set(self, keys: list[str], values: list[bytes]) -> None:  # type: ignore[override]
        fields: list[bytes] = []
        for k, v in zip(keys, values, strict=True):
            fields += [k.encode(), self._b(v)]
        self._call(wire.MULTI_SET, fields)

    def compare_set(self, key: str, expected: bytes | str,  # type: ignore[override]
                    desired: bytes | str) -> bytes:
        return self._call(wire.COMPARE_SET, [key.encode(), self._b(expected),
                                             self._b(desired)])[0]

    def append(self, key: str, value: bytes | str) -> None:  # type: ignore[override]
        self._call(wire.APPEND, [key.encode(), self._b(value)])

    def delete_key(self, key: str) -> bool:  # type: ignore[override]
        return self._call(wire.DELETE, [key.encode()])[0] == b"1"

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the trampoline's C++ name
        return self.delete_key(key)

    def num_keys(self) -> int:  # type: ignore[override]
        return int(self._call(wire.NUM_KEYS, [])[0])

    def getNumKeys(self) -> int:  # noqa: N802 - the trampoline's C++ name
        return self.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:  # type: ignore[override]
        self.timeout_s = _seconds(timeout, self.timeout_s)

    def peek(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys`` now, None for a missing one (never waits)."""
        out = self._call(wire.PEEK, [k.encode() for k in keys])
        flags = out[0]
        return [v if flags[i] else None for i, v in enumerate(out[1:])]

    def blob_put(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """Write one chunk of the large object ``name`` at ``offset``."""
        self._call(wire.BLOB_PUT, [name.encode(), str(offset).encode(), bytes(data)])

    def blob_commit(self, name: str, manifest: bytes) -> bytes:
        """Make ``name`` whole and durable with its ``manifest``; returns what the store says."""
        return self._call(wire.BLOB_COMMIT, [name.encode(), manifest], 600.0)[0]

    def blob_get(self, name: str, offset: int, length: int) -> bytes:
        """Read ``length`` bytes of ``name`` from ``offset`` (fewer at its end)."""
        return self._call(wire.BLOB_GET, [name.encode(), str(offset).encode(),
                                          str(length).encode()], 600.0)[0]

    def ping(self) -> None:
        """One round trip (raises :class:`ControlLost` when the coordinator is gone)."""
        self._call(wire.PING, [])
