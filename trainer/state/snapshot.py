"""Durable snapshots of the ring's state: taken off the step path, kept by the coordinator.

Design. Peers are the fast path (a joiner gets the state from a member, never from a file);
snapshots are the floor: when every member holding the state is gone at once (a zone-wide
reclaim, a stall of the host, Ctrl-C), the next members resume from the newest complete
snapshot and the job loses at most one interval, never the run.

* **Who writes.** Rank 0 of the generation, at a step boundary, every ``every_steps`` steps
  or ``every_s`` seconds (:func:`due`, pure). It copies the state to host memory there (the
  only part on the step path: a memory copy, measured by ``benchmarks/ring_loss.py``) and a
  background thread encodes it (:mod:`trainer.state.codec`: tensors and plain data, no pickle) and
  uploads it in chunks over its own authenticated connection to the coordinator; a snapshot
  still uploading when the next one is due makes that one skip. While the coordinator is
  away (the daemon restarting) rank 0 writes it to the store itself, signed the same way
  (:mod:`trainer.state.direct`), so a kill then costs one interval too.
* **Who keeps.** The coordinator's :class:`Vault` stages the chunks in a file, checks size
  and SHA-256 against the manifest, then stores the snapshot and, last, its manifest (so a
  snapshot without a manifest is incomplete and never used) in a :class:`BlobStore`: a
  directory on the daemon host (default), S3 or GCS (the daemon holds the credentials;
  workers need none). It keeps the newest ``keep`` and publishes the newest manifest in its
  key-value store (``snapshot/latest``), where the coordinator's decision reads it.
* **Who reads.** When a generation must resume (:attr:`trainer.protocol.messages.Plan.resume`),
  its rank 0 downloads the snapshot from the coordinator (:func:`fetch`), checks it, loads
  it and becomes the state source of the others. One that fails (download, digest, decoding)
  is reported (``snapshot/failed/<name>``) and the coordinator names the next older one.
* **Who is trusted.** Whoever can write the snapshot folder or bucket is not: the vault signs
  each manifest it commits with a key derived from the job token (``mac``, HMAC-SHA256 over
  every other field, the data's SHA-256 included) and lists only manifests whose ``mac``
  holds; one that fails is refused with one log line, never loaded, never deleted. Manifests
  and the state header are parsed bounded (size and depth).

Rule for callers: a snapshot is complete only once its manifest is stored
(:func:`put_manifest`, last); never read a snapshot without one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import torch

from trainer.errors import BadState, Malformed, SnapshotError
from trainer.protocol import messages as mb
from trainer.state import codec as st

log = logging.getLogger(__name__)

LATEST = mb.SNAPSHOT  # the newest complete manifest (JSON), in the coordinator's store
CONFIG = mb.SNAPSHOT_CONFIG  # when rank 0 takes them (JSON), in the coordinator's store
CHUNK = 4 << 20
_NAME = re.compile(r"^step-\d{10}-[0-9a-f]{8}$")


@dataclass(frozen=True)
class SnapshotSettings:
    """Where snapshots go and how often (``every_steps`` 0: by time only).

    ``url``: ``file:///abs/dir`` or a plain path, ``s3://bucket/prefix``, ``gs://bucket/prefix``;
    ``endpoint_url`` (S3) / ``api_endpoint`` (GCS) point the client elsewhere (tests, fakes).
    """

    url: str
    every_s: float = 300.0
    every_steps: int = 0
    keep: int = 3
    endpoint_url: str | None = None
    api_endpoint: str | None = None
    direct: bool | None = None  # may rank 0 write to the store itself while the coordinator
    # is away? None: when the store is a directory and the coordinator listens on loopback
    # (every worker is on this host); an S3/GCS store needs True and a put grant for workers

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("snapshot url: empty; give a directory, s3://bucket/prefix or "
                             "gs://bucket/prefix")
        if not (self.every_s > 0 and self.every_s < 1e9):
            raise ValueError(f"snapshot every_s={self.every_s}: must be a positive number of "
                             "seconds")
        if not isinstance(self.every_steps, int) or self.every_steps < 0:
            raise ValueError(f"snapshot every_steps={self.every_steps}: must be an int >= 0")
        if not isinstance(self.keep, int) or self.keep < 1:
            raise ValueError(f"snapshot keep={self.keep}: must be an int >= 1")


@dataclass(frozen=True)
class Manifest:
    """A complete snapshot: its name, the step and epoch position it holds, size, digest."""

    name: str
    step: int
    epoch: int
    samples_done: int
    bytes: int
    sha256: str
    job: str
    time: float
    mac: str = ""  # HMAC-SHA256 of every other field under the vault's key (hex; "" unsigned)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def _signed_part(self) -> bytes:
        d = asdict(self)
        d.pop("mac")
        return json.dumps(d, sort_keys=True).encode()

    def signed(self, key: bytes) -> Manifest:
        """This manifest with its ``mac`` under ``key`` (pure)."""
        return replace(self, mac=hmac.new(key, self._signed_part(), hashlib.sha256).hexdigest())

    def verify(self, key: bytes) -> bool:
        """Does ``mac`` hold under ``key``? (A forged or another job's manifest does not.)"""
        want = hmac.new(key, self._signed_part(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, self.mac)

    @classmethod
    def parse(cls, raw: bytes | str) -> Manifest:
        """Parse and validate a manifest (bounded: at most 64 KiB, no nesting). Raises
        ``ValueError`` for anything else."""
        d = mb.parse_json(raw, "manifest", max_bytes=64 << 10, max_depth=1)
        if not isinstance(d, dict):
            raise Malformed("manifest: not an object")
        try:
            m = cls(name=str(d["name"]), step=int(d["step"]), epoch=int(d["epoch"]),
                    samples_done=int(d["samples_done"]), bytes=int(d["bytes"]),
                    sha256=str(d["sha256"]), job=str(d.get("job", "")),
                    time=float(d["time"]), mac=str(d.get("mac", "")))
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise Malformed(f"manifest: {type(e).__name__}: {str(e)[:100]}") from None
        if not _NAME.match(m.name) or m.step < 0 or m.bytes <= 0 or len(m.sha256) != 64:
            raise Malformed(f"manifest of {m.name[:80]!r}: out of range")
        return m


def is_name(name: str) -> bool:
    """Is ``name`` a snapshot's name (what :func:`name_for` makes)?"""
    return bool(_NAME.match(name))


def name_for(step: int) -> str:
    """A fresh snapshot name for ``step`` (sortable by step; unique across writers)."""
    return f"step-{step:010d}-{os.urandom(4).hex()}"


def due(step: int, now: float, last_step: int, last_time: float, every_steps: int,
        every_s: float) -> bool:
    """Is a snapshot due after ``step`` (pure)? By steps when ``every_steps`` > 0, and by time
    when ``every_s`` seconds passed since the last one (``last_time`` < 0: never taken)."""
    if step <= last_step:
        return False
    if every_steps > 0 and step - max(last_step, 0) >= every_steps:
        return True
    return last_time >= 0 and now - last_time >= every_s


# -- where they are kept -------------------------------------------------------------------------


class BlobStore(Protocol):
    """A flat namespace of objects (the snapshot and its manifest)."""

    def put_file(self, name: str, path: Path) -> None: ...

    def put_bytes(self, name: str, data: bytes) -> None: ...

    def read(self, name: str, offset: int, length: int) -> bytes: ...

    def names(self) -> list[str]: ...

    def delete(self, name: str) -> None: ...


class DirStore:
    """Objects as files in a directory on this host (written whole: temporary + rename)."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create:  # a worker writing directly: only into the coordinator's own folder
            if not self.path.is_dir():
                raise SnapshotError(f"not on this host: snapshot directory {self.path}")
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SnapshotError(f"snapshot directory {self.path}: {e.strerror}; choose a "
                                "writable directory") from e

    def put_file(self, name: str, path: Path) -> None:
        dst = self.path / name
        shutil.move(str(path), str(dst))

    def put_bytes(self, name: str, data: bytes) -> None:
        tmp = self.path / f".{name}.{os.getpid()}.tmp"  # the coordinator's or a worker's
        tmp.unlink(missing_ok=True)  # never through a link left there: a new file, private
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path / name)

    def read(self, name: str, offset: int, length: int) -> bytes:
        with open(self.path / name, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir() if not p.name.startswith("."))

    def delete(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)


class S3Store:
    """Objects under ``s3://bucket/prefix`` (boto3, with botocore's standard retries)."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as e:  # pragma: no cover - the aws extra
            raise SnapshotError("s3:// snapshots need boto3: pip install 'spotring[aws]'") from e
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._s3 = boto3.client("s3", endpoint_url=endpoint_url,
                                config=Config(retries={"mode": "standard", "max_attempts": 5}))

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put_file(self, name: str, path: Path) -> None:
        self._s3.upload_file(str(path), self.bucket, self._key(name))
        Path(path).unlink(missing_ok=True)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def read(self, name: str, offset: int, length: int) -> bytes:
        r = self._s3.get_object(Bucket=self.bucket, Key=self._key(name),
                                Range=f"bytes={offset}-{offset + length - 1}")
        return r["Body"].read()

    def names(self) -> list[str]:
        out: list[str] = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else "")
        for page in pages:
            out += [o["Key"].rsplit("/", 1)[-1] for o in page.get("Contents", [])]
        return sorted(out)

    def delete(self, name: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(name))


class GCSStore:
    """Objects under ``gs://bucket/prefix`` (google-cloud-storage)."""

    def __init__(self, bucket: str, prefix: str, api_endpoint: str | None = None) -> None:
        try:
            from google.cloud import storage
        except ImportError as e:  # pragma: no cover - the gcp extra
            raise SnapshotError("gs:// snapshots need google-cloud-storage: pip install "
                                "'spotring[gcp]'") from e
        kw: dict[str, Any] = {}
        if api_endpoint:
            from google.auth.credentials import AnonymousCredentials

            kw = {"client_options": {"api_endpoint": api_endpoint},
                  "credentials": AnonymousCredentials(), "project": "spotring"}
        self._bucket = storage.Client(**kw).bucket(bucket)
        self.prefix = prefix.strip("/")

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put_file(self, name: str, path: Path) -> None:
        self._bucket.blob(self._key(name)).upload_from_filename(str(path))
        Path(path).unlink(missing_ok=True)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._bucket.blob(self._key(name)).upload_from_string(data)

    def read(self, name: str, offset: int, length: int) -> bytes:
        return self._bucket.blob(self._key(name)).download_as_bytes(
            start=offset, end=offset + length - 1)

    def names(self) -> list[str]:
        prefix = f"{self.prefix}/" if self.prefix else ""
        return sorted(b.name.rsplit("/", 1)[-1]
                      for b in self._bucket.client.list_blobs(self._bucket, prefix=prefix))

    def delete(self, name: str) -> None:
        self._bucket.blob(self._key(name)).delete()


def open_store(settings: SnapshotSettings, *, create: bool = True) -> BlobStore:
    """The :class:`BlobStore` a snapshot URL names (``create`` False: a directory must exist
    already). Raises :class:`SnapshotError`."""
    u = urlparse(settings.url)
    if u.scheme in ("", "file"):
        return DirStore(Path(u.path if u.scheme else settings.url), create=create)
    if u.scheme == "s3" and u.netloc:
        return S3Store(u.netloc, u.path, settings.endpoint_url)
    if u.scheme == "gs" and u.netloc:
        return GCSStore(u.netloc, u.path, settings.api_endpoint)
    raise SnapshotError(f"snapshot url {settings.url!r}: expected a directory, "
                        "s3://bucket/prefix or gs://bucket/prefix")


# -- the coordinator's vault ---------------------------------------------------------------


class Vault:
    """The coordinator's keeper of snapshots (the store server's blob handler).

    Chunks of a snapshot being written are staged in a temporary file on this host; a
    commit checks the size and the SHA-256 its manifest announces, stores the snapshot, then
    its manifest (``<name>.json``), forgets the oldest beyond ``keep`` and calls
    ``on_commit(manifest_json)``. Writes never exceed the size a manifest may claim
    (``max_bytes``). With a ``key`` (derived from the job token) it signs each manifest it
    commits and lists only those whose signature holds (a refused one: one warning line).
    """

    def __init__(self, store: BlobStore, *, keep: int = 3,
                 on_commit: Callable[[bytes], None] | None = None,
                 max_bytes: int = 1 << 40, key: bytes | None = None) -> None:
        self.store, self.keep, self._on_commit = store, keep, on_commit
        self._max = max_bytes
        self._key = key
        self._refused: set[str] = set()  # manifests already warned about
        self._staging = Path(tempfile.mkdtemp(prefix="spotring-snap-"))
        self._lock = threading.Lock()

    def close(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)

    def _stage(self, name: str) -> Path:
        if not _NAME.match(name):
            raise ValueError(f"snapshot name {name!r}")
        return self._staging / name

    def put(self, name: str, offset: int, data: bytes) -> None:
        path = self._stage(name)
        if offset < 0 or offset + len(data) > self._max:
            raise ValueError("snapshot chunk out of range")
        with self._lock, open(path, "r+b" if path.exists() else "wb") as f:
            f.seek(offset)
            f.write(data)

    def commit(self, name: str, manifest: bytes) -> bytes:
        m = Manifest.parse(manifest)
        path = self._stage(name)
        if m.name != name or not path.exists() or path.stat().st_size != m.bytes:
            raise ValueError(f"snapshot {name}: incomplete (size differs from its manifest)")
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                h.update(chunk)
        if h.hexdigest() != m.sha256:
            path.unlink(missing_ok=True)
            raise ValueError(f"snapshot {name}: digest differs from its manifest")
        self.store.put_file(name, path)
        m = put_manifest(self.store, m, self._key)  # complete from here on
        self._forget_old()
        if self._on_commit is not None:
            self._on_commit(m.to_json().encode())
        log.info("snapshot of step %d stored (%d bytes)", m.step, m.bytes)
        return m.to_json().encode()

    def get(self, name: str, offset: int, length: int) -> bytes:
        if not _NAME.match(name):
            raise ValueError(f"snapshot name {name!r}")
        return self.store.read(name, offset, length)

    def manifests(self) -> list[Manifest]:
        """Every complete snapshot, oldest first."""
        out = []
        for n in self.store.names():
            if n.endswith(".json") and _NAME.match(n[:-5]):
                try:
                    m = Manifest.parse(self.store.read(n, 0, 64 << 10))
                    if m.name != n[:-5]:
                        raise Malformed(f"it names {m.name}")
                except (ValueError, OSError) as e:
                    self._refuse(n, f"unreadable ({str(e)[:120]})")
                    continue
                if self._key is not None and not m.verify(self._key):
                    self._refuse(n, "its HMAC does not hold under this job's token (written "
                                 "by someone without the token, or by another job)")
                    continue
                out.append(m)
        return sorted(out, key=lambda m: (m.step, m.time))

    def _refuse(self, name: str, why: str) -> None:
        if name not in self._refused:
            self._refused.add(name)
            log.warning("snapshot manifest %s refused: %s; never loaded (older ones are used), "
                        "left in place", name, why)

    def record_end(self, end: dict[str, Any]) -> None:
        """Record the job's end next to its snapshots (``END``: the outcome and progress,
        signed like a manifest), so whoever reads the snapshots later (a daemon killed right
        after the ring finished) never takes the run for unfinished."""
        body = dict(end)
        if self._key is not None:
            body["mac"] = _sign(self._key, body)
        self.store.put_bytes(END, json.dumps(body, sort_keys=True).encode())

    def published(self) -> bytes:
        """Every usable manifest, newest first, as the JSON list the coordinator publishes
        (``snapshot/all``)."""
        return json.dumps([json.loads(m.to_json()) for m in reversed(self.manifests())]
                          ).encode()

    def latest(self) -> Manifest | None:
        ms = self.manifests()
        return ms[-1] if ms else None

    def _forget_old(self) -> None:
        for m in self.manifests()[: -self.keep]:
            self.store.delete(f"{m.name}.json")  # incomplete first: never half a snapshot
            self.store.delete(m.name)


def put_manifest(store: BlobStore, m: Manifest, key: bytes | None) -> Manifest:
    """Sign ``m`` under ``key`` (none: unsigned) and store it as ``<name>.json``: the last
    write of a snapshot, after its data (the coordinator's vault and a worker writing
    directly alike). Returns the stored manifest."""
    m = replace(m, mac="")
    if key is not None:
        m = m.signed(key)
    store.put_bytes(f"{m.name}.json", m.to_json().encode())
    return m


END = "run.end.json"  # the job's end, recorded by the coordinator beside the snapshots


def _sign(key: bytes, body: dict[str, Any]) -> str:
    part = json.dumps({k: v for k, v in body.items() if k != "mac"}, sort_keys=True).encode()
    return hmac.new(key, part, hashlib.sha256).hexdigest()


def recorded_end(store: BlobStore, key: bytes | None) -> dict[str, Any] | None:
    """The job's end recorded beside its snapshots (:meth:`Vault.record_end`), or None when
    there is none, it does not parse, or (with ``key``) its signature does not hold."""
    if END not in store.names():
        return None
    try:
        d = mb.parse_json(store.read(END, 0, 64 << 10), "end", max_bytes=64 << 10,
                          max_depth=3)
    except (Malformed, OSError):
        return None
    if not isinstance(d, dict) or str(d.get("outcome")) not in ("done", "lost", "failed"):
        return None
    if key is not None and not hmac.compare_digest(str(d.get("mac", "")), _sign(key, d)):
        log.warning("%s refused: its HMAC does not hold under this job's token", END)
        return None
    return d


# -- the worker's side ---------------------------------------------------------------------


def host_copy(tree: Any) -> Any:
    """``tree`` with every tensor copied to host memory (what a snapshot holds of this
    instant; training goes on with the originals): :func:`trainer.state.codec.to_host`."""
    return st.to_host(tree, copy=True)


RETRY_S = 2.0  # a failed snapshot is taken again after this, doubling while it fails


class Snapshotter:
    """Rank 0's snapshots: :meth:`due` asked for each step, :meth:`take` at its commit, the
    upload on a thread. An upload that failed (the coordinator restarting, the store away)
    is taken again after :data:`RETRY_S`, doubling while it keeps failing up to the
    interval, not a whole interval later: a restarted daemon gets a fresh snapshot as soon
    as it answers, so a kill that follows does not send the ring back an interval more."""

    def __init__(self, connect: Callable[[], Any], every_steps: int, every_s: float,
                 clock: Callable[[], float] = time.monotonic, direct: Any = None) -> None:
        self._connect = connect  # a fresh store connection for the upload thread
        self._direct = direct  # a trainer.state.direct.DirectWriter: the store itself, used
        # when the coordinator fails (None: through the coordinator only)
        self.direct = 0  # snapshots written to the store directly (the coordinator away)
        self._away = False  # the last one went to the store directly
        self.every_steps, self.every_s = every_steps, every_s
        self._clock = clock
        self._last_step = -1
        self._last_time = clock()
        self._thread: threading.Thread | None = None
        self.taken = 0
        self.skipped = 0
        self.copy_s = 0.0  # time spent on the step path (the host copies)
        self.failed: str | None = None
        self._failures = 0  # uploads failed in a row
        self._retry_at: float | None = None  # a failed upload is taken again from then

    def due(self, step: int) -> bool:
        """Is a snapshot due once ``step`` is committed: an interval passed since the last
        one and no upload is in flight? (One that is due while an upload runs is counted
        in :attr:`skipped` and asked again at the next step.)"""
        now = self._clock()
        retry = self._retry_at is not None and now >= self._retry_at and step > self._last_step
        if not retry and not due(step, now, self._last_step, self._last_time, self.every_steps,
                                 self.every_s):
            return False
        if self._thread is not None and self._thread.is_alive():
            self.skipped += 1
            return False
        return True

    def take(self, step: int, get_state: Callable[[], dict[str, Any]], job: str,
             epoch: int, samples_done: int) -> None:
        """Take a snapshot of ``get_state()`` at ``step`` now: a host copy on the caller's
        thread (training goes on with the originals), the upload on a thread of its own.
        Call it when :meth:`due` said so, at the commit of ``step`` (a skipped one is not
        taken: an upload is in flight)."""
        if self._thread is not None and self._thread.is_alive():
            self.skipped += 1
            return
        t0 = time.perf_counter()
        tree = host_copy(get_state())
        self.copy_s += time.perf_counter() - t0
        self._last_step, self._last_time = step, self._clock()
        self._thread = threading.Thread(
            target=self._upload, args=(tree, step, job, epoch, samples_done),
            name="spotring-snapshot", daemon=True)
        self._thread.start()

    def _upload(self, tree: Any, step: int, job: str, epoch: int, samples_done: int) -> None:
        try:
            payload = st.encode(tree).numpy()
            data = memoryview(payload.tobytes())
            name = name_for(step)
            m = Manifest(name, step, epoch, samples_done, len(data),
                         hashlib.sha256(data).hexdigest(), job, time.time())
            try:
                conn = self._connect()
                try:
                    for off in range(0, len(data), CHUNK):
                        conn.blob_put(name, off, data[off:off + CHUNK])
                    conn.blob_commit(name, m.to_json().encode())
                finally:
                    conn.close()
                self._away = False
            except Exception as e:  # noqa: BLE001 - the coordinator away: the store itself
                if self._direct is None:
                    raise
                self._write_direct(name, data, m, e)
            self.taken += 1
            self.failed, self._failures, self._retry_at = None, 0, None
        except Exception as e:  # noqa: BLE001 - taken again soon; training goes on
            self.failed = f"{type(e).__name__}: {str(e)[:200]}"
            self._failures += 1
            wait = min(RETRY_S * 2 ** (self._failures - 1), max(RETRY_S, self.every_s))
            self._retry_at = self._clock() + wait
            # once per outage: one line, not one per try (the count is in self._failures)
            log.log(logging.WARNING if self._failures == 1 else logging.DEBUG,
                    "snapshot of step %d failed: %s (training goes on; taken again in %.0f s, "
                    "doubling up to the interval while it fails)", step, self.failed, wait)

    def _write_direct(self, name: str, data: memoryview, m: Manifest, why: Exception) -> None:
        """The coordinator failed (``why``): write the snapshot to the store itself, signed
        as the vault signs it. Raises when the store fails too (both reasons named)."""
        assert self._direct is not None
        try:
            self._direct.write(name, data, m)
        except Exception as e:  # noqa: BLE001 - both ways failed: the caller retries
            raise SnapshotError(f"the coordinator: {type(why).__name__}: {str(why)[:120]}; "
                                f"the store itself: {type(e).__name__}: {str(e)[:120]}"
                                ) from e
        self.direct += 1
        log.log(logging.INFO if self._away else logging.WARNING,  # one warning per outage
                "snapshot of step %d written to the store directly (the coordinator: %s)",
                m.step, f"{type(why).__name__}: {str(why)[:120]}")
        self._away = True

    def wait(self, timeout: float = 60.0) -> None:
        """Wait for an upload in flight (at the end of a run)."""
        if self._thread is not None:
            self._thread.join(timeout)


def fetch(conn: Any, manifest: Manifest) -> dict[str, Any]:
    """Download and decode the snapshot ``manifest`` names from the coordinator, checking its
    size and digest. Raises :class:`SnapshotError`."""
    buf = bytearray()
    try:
        while len(buf) < manifest.bytes:
            chunk = conn.blob_get(manifest.name, len(buf), min(CHUNK, manifest.bytes - len(buf)))
            if not chunk:
                break
            buf += chunk
    except Exception as e:  # noqa: BLE001 - the coordinator's store or the network
        raise SnapshotError(f"snapshot {manifest.name}: download failed: {e}") from e
    if len(buf) != manifest.bytes or hashlib.sha256(buf).hexdigest() != manifest.sha256:
        raise SnapshotError(f"snapshot {manifest.name}: size or digest differs from its "
                            "manifest")
    try:
        tree = st.decode(bytes(buf))
    except BadState as e:
        raise SnapshotError(f"snapshot {manifest.name}: {e}") from e
    if not isinstance(tree, dict) or tree.get("step") != manifest.step:
        raise SnapshotError(f"snapshot {manifest.name}: it does not hold step {manifest.step}")
    return tree
