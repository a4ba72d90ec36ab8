"""The token handshake of a control connection, and the sealing of every frame after it.

Design: the coordinator's control port speaks only to processes that hold the job token. A
connection opens with a mutual HMAC challenge (both sides prove the token; it never
travels)::

    server -> client   MAGIC | server_nonce (16 bytes)
    client -> server   client_nonce (16) | HMAC(token, "c" | sn | cn)        (32)
    server -> client   HMAC(token, "s" | sn | cn)                            (32)

Both then derive one key per direction from the token and the two nonces, and every frame
after that is ``length (4) | ciphertext | tag (16)``: the body sealed with ChaCha20-Poly1305
(``cryptography``'s AEAD, not a cipher of ours) under that key, the per-direction sequence
number as its nonce. A frame that is forged, altered, replayed, reordered or cut short fails
its tag, and the connection is closed (the caller counts it); an on-path observer reads no
body (no weights, no optimiser state, no snapshot). The bodies are plain bytes (see
:mod:`trainer.protocol.store` for the operations): nothing received is ever unpickled. What
the token protects and what it does not is set out in docs/trainer.md's threat model.

Rule for callers: never read a body before :meth:`Channel.open` accepted its tag; a failed
handshake or tag closes the connection, it is never answered.

This module also writes and reads the token file (0600, created atomically).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from trainer.errors import AuthError, TokenRefused

MAGIC = b"SPOTRING-CTL1"
NONCE = 16
MAC = 32
TAG = 16
HELLO_LEN = len(MAGIC) + NONCE  # what the server sends first
CLIENT_LEN = NONCE + MAC  # the client's answer
REFUSED = bytes(MAC)  # the server's answer to a wrong proof, in place of its own proof
MAX_FRAME = 64 << 20  # bodies above this are refused (snapshot chunks are 4 MiB)
_LEN = struct.Struct("!I")
_SEQ = struct.Struct("!Q")


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


def derive_key(token: bytes, purpose: bytes) -> bytes:
    """A 32-byte key for ``purpose`` derived from the job token (HMAC-SHA256 as the KDF, one
    key per purpose: a key for snapshot manifests never signs a frame)."""
    return _mac(token, b"spotring key", purpose)


def server_hello() -> tuple[bytes, bytes]:
    """The server's first message and its nonce: ``(MAGIC | nonce, nonce)``."""
    nonce = secrets.token_bytes(NONCE)
    return MAGIC + nonce, nonce


def client_answer(token: bytes, hello: bytes) -> tuple[bytes, bytes]:
    """The client's answer to the server's ``hello``: ``(message, client_nonce)``.

    Raises :class:`AuthError` when ``hello`` is not a spotring control port's greeting.
    """
    if len(hello) != HELLO_LEN or not hello.startswith(MAGIC):
        raise AuthError("the peer is not a spotring coordinator (unexpected greeting)")
    sn = hello[len(MAGIC):]
    cn = secrets.token_bytes(NONCE)
    return cn + _mac(token, b"c", sn, cn), cn


def server_check(token: bytes, server_nonce: bytes, answer: bytes) -> tuple[bytes, Channel]:
    """Check the client's ``answer``; returns the server's proof and the server's channel.

    Raises :class:`AuthError` when the client does not hold the token.
    """
    if len(answer) != CLIENT_LEN:
        raise AuthError("handshake: short answer")
    cn, proof = answer[:NONCE], answer[NONCE:]
    if not hmac.compare_digest(proof, _mac(token, b"c", server_nonce, cn)):
        raise AuthError("handshake: wrong token")
    return _mac(token, b"s", server_nonce, cn), _channel(token, server_nonce, cn, server=True)


def client_check(token: bytes, hello: bytes, client_nonce: bytes, proof: bytes) -> Channel:
    """Check the server's ``proof`` (it holds the token too); returns the client's channel.

    Raises :class:`AuthError` when the server does not prove the token.
    """
    sn = hello[len(MAGIC):]
    if proof == REFUSED:
        raise TokenRefused("the coordinator refused this token (wrong job token)")
    if len(proof) != MAC or not hmac.compare_digest(proof, _mac(token, b"s", sn, client_nonce)):
        raise AuthError("the coordinator did not prove the job token (wrong token, or not "
                        "the job's coordinator)")
    return _channel(token, sn, client_nonce, server=False)


def _channel(token: bytes, sn: bytes, cn: bytes, *, server: bool) -> Channel:
    root = _mac(token, b"k", sn, cn)
    c2s, s2c = _mac(root, b"c2s"), _mac(root, b"s2c")
    return Channel(send_key=s2c if server else c2s, recv_key=c2s if server else s2c)


@dataclass
class Channel:
    """The keys and sequence numbers of one authenticated connection (one side of it)."""

    send_key: bytes
    recv_key: bytes
    sent: int = 0
    received: int = 0
    _pending: bytearray = field(default_factory=bytearray, repr=False)

    def __post_init__(self) -> None:
        self._send = ChaCha20Poly1305(self.send_key)
        self._recv = ChaCha20Poly1305(self.recv_key)

    def seal(self, body: bytes) -> bytes:
        """``body`` encrypted, framed and tagged for the peer (the next sequence number is
        the nonce)."""
        if len(body) > MAX_FRAME:
            raise ValueError(f"frame of {len(body)} bytes is over the {MAX_FRAME} limit")
        sealed = self._send.encrypt(_nonce(self.sent), bytes(body), None)
        self.sent += 1
        return _LEN.pack(len(body)) + sealed

    def open(self, frame_body: bytes, tag: bytes) -> bytes:
        """Check the tag of one received ciphertext and decrypt it; returns the body.
        Raises :class:`AuthError`."""
        try:
            body = self._recv.decrypt(_nonce(self.received), frame_body + tag, None)
        except InvalidTag:
            raise AuthError("frame failed its tag (forged, replayed or garbled)") from None
        self.received += 1
        return body

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; returns the bodies of the complete frames, checked, in order.

        Raises :class:`AuthError` on a bad tag and ``ValueError`` on an oversized frame.
        """
        buf = self._pending
        buf += data
        out: list[bytes] = []
        while len(buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(buf)
            if n > MAX_FRAME:
                raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME} limit")
            end = _LEN.size + n + TAG
            if len(buf) < end:
                break
            body = bytes(buf[_LEN.size:_LEN.size + n])
            out.append(self.open(body, bytes(buf[_LEN.size + n:end])))
            del buf[:end]
        return out


def _nonce(seq: int) -> bytes:
    """The 96-bit AEAD nonce of frame ``seq`` (one key per direction and connection, so a
    sequence number is never reused under a key)."""
    return bytes(4) + _SEQ.pack(seq)


def frame_length(header: bytes) -> int:
    """The body length announced by a 4-byte frame header (tag not included)."""
    (n,) = _LEN.unpack(header)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME} limit")
    return n


# -- the token file ---------------------------------------------------------------------------


def write_token_file(path: Path) -> bytes:
    """Create ``path`` holding a fresh random token, mode 0600, atomically; returns the token.

    The token is written to a temporary file created 0600 in the same folder, then renamed
    over ``path``: no reader ever sees a partial token or a file other users can read.
    """
    token = secrets.token_urlsafe(32).encode()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(token + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return token


def read_token_file(path: Path) -> bytes:
    """The token in ``path`` (surrounding whitespace stripped).

    Raises ``OSError`` when it cannot be read and ``ValueError`` naming the fix when it is
    empty. See :func:`token_file_warning` for its permissions.
    """
    token = Path(path).read_bytes().strip()
    if not token:
        raise ValueError(f"{path} is empty; write the job's secret into it")
    return token


def token_file_warning(path: Path) -> str | None:
    """A warning naming the fix when ``path`` is open to every user of the machine."""
    mode = Path(path).stat().st_mode
    if mode & stat.S_IRWXO:
        return (f"token file {path} is readable by every user of this machine (mode "
                f"{stat.S_IMODE(mode):o}): anyone who reads it can take part in the ring; "
                f"run `chmod 600 {path}`")
    return None
