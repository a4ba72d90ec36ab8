"""The run's artifacts: the exact spotring wheel the daemon runs, and the user's code, stored
where its workers fetch them, and the launch values that pin them.

Design: nothing a cloud worker installs comes from a package index by name (issue 32). At its
start the daemon locates the wheel of the code it runs (:func:`locate_wheel`: ``[cloud]
wheel``, else a wheel built from the source tree it was imported from, in a copy, never in the
checkout), stores it content-addressed under ``[cloud] artifacts`` (``<artifacts>/<sha256>/
<file>``: a stored wheel is never overwritten, and one already there is not uploaded again)
and returns ``SPOTRING_WHEEL`` (its URL) and ``SPOTRING_WHEEL_SHA256`` for every launch
(:mod:`provisioner.drivers.boot`). The worker's boot script fetches the URL, checks the
SHA-256 and installs it with ``pip --require-hashes --no-deps``. The user's code, packed by
:mod:`provisioner.drivers.code`, goes the same way (``<artifacts>/<sha256>/code.tar.gz``) as
``SPOTRING_CODE`` and ``SPOTRING_CODE_SHA256``, with ``SPOTRING_JOB`` the job's path inside
it. Stores: a folder
(``file://`` or a path: the local cloud, tests), S3 and GCS, behind :class:`ArtifactStore`,
with only the calls below (S3 ``head_object``/``put_object``/``list_objects_v2``/
``get_object``; GCS ``blob.exists``/``upload_from_filename``/``list_blobs``/
``download_as_bytes``). ``list`` and ``read`` serve the workers' shipped logs
(:mod:`provisioner.drivers.shiplog`).

Rule for callers: call :func:`ship` once before the first launch; it raises
:class:`~provisioner.errors.ConfigError` naming ``[cloud] artifacts`` or ``[cloud] wheel``
(one line, exit 2) when it cannot ship, and returns ``{}`` when ``[cloud] artifacts`` is unset
and no code travels (the boot scripts then install the wheel terraform uploaded, or the
pinned index opt-in); code needs ``[cloud] artifacts``.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from provisioner.drivers.code import Packed

from provisioner.errors import ConfigError

if TYPE_CHECKING:
    from provisioner.config import Settings

log = logging.getLogger(__name__)

#: The source tree a wheel is built from (what pyproject.toml packages).
SOURCES = ("pyproject.toml", "README.md", "pricing", "provisioner", "trainer", "examples")


@dataclass(frozen=True)
class Wheel:
    """A wheel file (or any artifact) and its SHA-256 (hex)."""

    path: Path
    sha256: str


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_tree() -> Path | None:
    """The checkout this package runs from (pyproject.toml beside the packages), or None
    when it runs from an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "trainer").is_dir() else None


def build_wheel(src: Path, out: Path) -> Path:
    """Build the wheel of the tree ``src`` into ``out`` (``pip wheel --no-deps
    --no-build-isolation`` in a copy, so no build/ or egg-info lands in the checkout).

    Raises ConfigError when the build fails.
    """
    copy = Path(tempfile.mkdtemp(prefix="spotring-src-"))
    try:
        for name in SOURCES:
            path = src / name
            if path.is_dir():
                shutil.copytree(path, copy / name, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.pyc"))
            elif path.is_file():
                shutil.copy2(path, copy / name)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                               "--no-build-isolation", "--disable-pip-version-check", "-q",
                               "-w", str(out), str(copy)], capture_output=True, text=True,
                              timeout=600)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    found = sorted(out.glob("spotring-*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1][:160]
        raise ConfigError(f"[cloud] wheel: unset, and building one from {src} failed ({last}); "
                          f"build it (`pip wheel --no-deps -w dist .`) and name it there")
    return found[-1]


def locate_wheel(configured: str | None, workdir: Path) -> Wheel:
    """The wheel to ship: ``configured`` (a .whl path), else one built from this checkout
    into ``workdir``. Raises ConfigError naming ``[cloud] wheel``."""
    if configured:
        path = Path(configured).expanduser()
        if not (path.is_file() and path.name.endswith(".whl")):
            raise ConfigError(f"[cloud] wheel = {configured!r}: not a .whl file; name the "
                              f"spotring wheel this daemon runs (`pip wheel --no-deps -w dist .`)")
        return Wheel(path.resolve(), sha256_of(path))
    src = source_tree()
    if src is None:
        raise ConfigError("[cloud] wheel: unset, and this spotring was installed from a wheel, "
                          "not run from a checkout; name that wheel file there")
    path = build_wheel(src, workdir)
    return Wheel(path, sha256_of(path))


def content_type(key: str) -> str:
    """The MIME type of an artifact by its name (a wheel is a zip; the code a gzip'd tar)."""
    return "application/gzip" if key.endswith(".gz") else "application/zip"


class ArtifactStore(Protocol):
    """Where a run's artifacts live; keys are ``/``-separated, under the store's prefix."""

    def url(self, key: str) -> str:
        """The URL a worker fetches ``key`` from."""
        ...

    def exists(self, key: str) -> bool: ...

    def put(self, key: str, path: Path) -> None: ...

    def list(self, prefix: str) -> list[str]:
        """The keys under ``prefix`` (a ``/``-ended folder of keys), sorted."""
        ...

    def read(self, key: str) -> bytes:
        """The bytes of ``key``; raises KeyError when there is none."""
        ...


class DirStore:
    """A folder (``file:///abs`` or a path): the local cloud's and the tests'."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def url(self, key: str) -> str:
        return (self.root / key).as_uri()

    def exists(self, key: str) -> bool:
        return (self.root / key).is_file()

    def put(self, key: str, path: Path) -> None:
        dest = self.root / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        shutil.copyfile(path, tmp)
        tmp.replace(dest)

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))

    def read(self, key: str) -> bytes:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None


class S3Store:
    """``s3://bucket/prefix`` (boto3; ``endpoint_url``: a moto server)."""

    def __init__(self, bucket: str, prefix: str, region: str,
                 endpoint_url: str | None = None) -> None:
        from pricing.sources.boto import make_client

        self.bucket, self.prefix = bucket, prefix
        self._s3 = make_client("s3", region, endpoint_url=endpoint_url)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def put(self, key: str, path: Path) -> None:
        with open(path, "rb") as fh:
            self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=fh,
                                ContentType=content_type(key))

    def list(self, prefix: str) -> list[str]:
        full, cut = self._key(prefix), len(self._key(""))
        keys: list[str] = []
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                        Prefix=full):
            keys.extend(o["Key"][cut:] for o in page.get("Contents", []))
        return sorted(keys)

    def read(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self._s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise KeyError(key) from None
            raise


class GcsStore:
    """``gs://bucket/prefix`` (google-cloud-storage; ``api_endpoint``: a fake)."""

    def __init__(self, bucket: str, prefix: str, api_endpoint: str | None = None) -> None:
        from google.cloud import storage

        kwargs: dict = {}
        if api_endpoint:
            from google.auth.credentials import AnonymousCredentials

            kwargs = {"credentials": AnonymousCredentials(), "project": "spotring",
                      "client_options": {"api_endpoint": api_endpoint}}
        self.prefix = prefix
        self._bucket = storage.Client(**kwargs).bucket(bucket)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str) -> str:
        return f"gs://{self._bucket.name}/{self._key(key)}"

    def exists(self, key: str) -> bool:
        return bool(self._bucket.blob(self._key(key)).exists())

    def put(self, key: str, path: Path) -> None:
        self._bucket.blob(self._key(key)).upload_from_filename(str(path),
                                                               content_type=content_type(key))

    def list(self, prefix: str) -> list[str]:
        cut = len(self._key(""))
        return sorted(b.name[cut:] for b in self._bucket.client.list_blobs(
            self._bucket, prefix=self._key(prefix)))

    def read(self, key: str) -> bytes:
        from google.api_core.exceptions import NotFound

        try:
            return self._bucket.blob(self._key(key)).download_as_bytes()
        except NotFound:
            raise KeyError(key) from None


def open_store(url: str, settings: "Settings") -> ArtifactStore:
    """The store of ``[cloud] artifacts`` (s3://, gs://, file:// or a folder)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return DirStore(Path(url).expanduser().resolve())
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if scheme == "file":
        return DirStore(Path(rest))
    if scheme == "s3":
        return S3Store(bucket, prefix, settings.aws.region,
                       settings.snapshot.endpoint_url or settings.aws.endpoint_url)
    if scheme == "gs":
        return GcsStore(bucket, prefix, settings.snapshot.api_endpoint)
    raise ConfigError(f"[cloud] artifacts = {url!r}: use s3://bucket/prefix, gs://bucket/prefix "
                      f"or a folder")


def store_wheel(wheel: Wheel, store: ArtifactStore) -> str:
    """Put ``wheel`` (any artifact) at ``<sha256>/<file name>`` unless it is there; returns
    its URL."""
    key = f"{wheel.sha256}/{wheel.path.name}"
    if store.exists(key):
        log.info("artifacts: %s already stored", store.url(key))
    else:
        store.put(key, wheel.path)
        log.info("artifacts: stored %s", store.url(key))
    return store.url(key)


def ship(settings: "Settings", code: Packed | None = None) -> dict[str, str]:
    """Store the daemon's wheel, and ``code`` when given (:func:`provisioner.drivers.code.
    pack`), with the run; the launch values that pin them (see the module docstring). A wheel
    built from the checkout lives in a temporary folder until stored.

    Raises ConfigError (one line naming the setting) when the wheel cannot be located or
    stored, or when code travels without ``[cloud] artifacts``; returns ``{}`` when
    ``[cloud] artifacts`` is unset and no code travels.
    """
    url = settings.cloud.artifacts
    if not url:
        if code is not None:
            raise ConfigError(f"[cloud] artifacts: unset, and the job {code.job} travels with "
                              f"its code (--code), which the workers fetch from there; set it "
                              f"(s3://bucket/prefix or gs://bucket/prefix, the terraform "
                              f"module's artifacts output)")
        return {}
    with tempfile.TemporaryDirectory(prefix="spotring-wheel-") as tmp:
        wheel = locate_wheel(settings.cloud.wheel, Path(tmp))
        what = "the wheel"
        try:
            store = open_store(url, settings)
            where = store_wheel(wheel, store)
            if code is not None:
                what = "the code"
                code_url = store_wheel(Wheel(code.path, code.sha256), store)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - the SDKs' own errors, translated here
            first = (str(exc).splitlines() or [""])[0][:160]
            raise ConfigError(f"[cloud] artifacts = {url!r}: cannot store {what} there "
                              f"({type(exc).__name__}: {first}); check the bucket and this "
                              f"host's credentials") from None
    out = {"SPOTRING_WHEEL": where, "SPOTRING_WHEEL_SHA256": wheel.sha256}
    if code is not None:
        out.update(SPOTRING_CODE=code_url, SPOTRING_CODE_SHA256=code.sha256,
                   SPOTRING_JOB=code.job)
    return out
