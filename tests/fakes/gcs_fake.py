"""A small local HTTP fake of the Cloud Storage JSON API, for the snapshots' GCS store.

Design: the real ``google-cloud-storage`` client (``Client(project=..., credentials=
AnonymousCredentials(), client_options={"api_endpoint": fake.endpoint})``) talks to this
server, so uploads, downloads, listings, deletes, the client's retries and its error mapping
are exercised for real (as ``tests/fakes/gcp_fake.py`` does for Compute Engine). It serves
the paths that client uses and no more:

- uploads ``POST /upload/storage/v1/b/B/o?uploadType=multipart|media|resumable`` (a
  multipart/related body; a resumable session answered with a ``Location`` whose ``PUT``
  chunks carry ``Content-Range``, 308 until the last);
- downloads ``GET /download/storage/v1/b/B/o/NAME?alt=media`` (and ``/storage/v1/...``
  with ``alt=media``), ``Range`` honoured (206), with ``x-goog-hash`` (md5, crc32c when
  ``google-crc32c`` is installed) and ``x-goog-generation`` so the client's checksum check runs;
- object metadata ``GET``/``PATCH``/``DELETE /storage/v1/b/B/o/NAME``, listing ``GET
  /storage/v1/b/B/o`` (``prefix``, ``delimiter``, ``maxResults``, ``pageToken``),
  ``rewriteTo``/``copyTo``; buckets ``GET /storage/v1/b/B`` and ``POST /storage/v1/b``;
- preconditions ``ifGenerationMatch`` (0: only if absent) and ``ifGenerationNotMatch``
  (412 when unmet); generations count up per write.

Grants: :meth:`GcsFake.creator_only` holds every request from then on to a conditioned
``roles/storage.objectCreator`` (what terraform/gcp gives the workers): creating a new object
whose name starts with one of the prefixes is allowed; an overwrite, a delete, a read, a
listing or a create elsewhere answers 403, as GCS does. The fake has no principals (the client
runs with anonymous credentials), so a test switches it on while it acts as the worker.

Fault injection: :meth:`GcsFake.fail_next` answers the next matching requests with an HTTP
error (503 and 429 are retried by the client). Object names in paths are percent-encoded
(``a%2Fb``) and decoded here.

Rule for callers: use it as a context manager (``with GcsFake(buckets=["b"]) as fake``); it
serves on an ephemeral port from a daemon thread and is thread-safe.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterable
from urllib.parse import parse_qs, quote, unquote, urlparse

from tests.fakes.http_fake import HttpFake, JsonHandler

_OBJECT = re.compile(r"^/(?:download/)?storage/v1/b/([^/]+)/o/([^/]+)$")
_OBJECTS = re.compile(r"^/storage/v1/b/([^/]+)/o$")
_UPLOAD = re.compile(r"^/upload/storage/v1/b/([^/]+)/o$")
_BUCKET = re.compile(r"^/storage/v1/b/([^/]+)$")
_COPY = re.compile(r"^/storage/v1/b/([^/]+)/o/([^/]+)/(rewriteTo|copyTo)/b/([^/]+)/o/([^/]+)$")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _crc32c(data: bytes) -> str | None:
    try:
        import google_crc32c
    except ImportError:
        return None
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


class GcsFake(HttpFake):
    """The fake's buckets and controls; :attr:`endpoint` is the URL to point the client at."""

    def __init__(self, buckets: Iterable[str] = ()) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str], tuple[dict[str, Any], bytes]] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.failures: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.create_prefixes: tuple[str, ...] | None = None  # creator_only
        self._gen = itertools.count(1_700_000_000_000_000)
        for b in buckets:
            self.create_bucket(b)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler(self)

    # -- controls -----------------------------------------------------------------------------

    def create_bucket(self, name: str) -> None:
        with self.lock:
            self.buckets.setdefault(name, {"kind": "storage#bucket", "id": name, "name": name,
                                           "timeCreated": _now(), "metageneration": "1",
                                           "location": "US", "storageClass": "STANDARD"})

    def fail_next(self, status: int, *, method: str | None = None, path_contains: str = "",
                  times: int = 1) -> None:
        """Answer the next ``times`` requests matching method/path with HTTP ``status``."""
        with self.lock:
            self.failures.append(dict(status=status, method=method, path=path_contains,
                                      times=times))

    def creator_only(self, prefixes: Iterable[str] | None) -> None:
        """From now on, only create new objects under ``prefixes`` (None: everything again)."""
        with self.lock:
            self.create_prefixes = None if prefixes is None else tuple(prefixes)

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        """The object names in ``bucket`` under ``prefix``, sorted."""
        with self.lock:
            return sorted(n for b, n in self.objects if b == bucket and n.startswith(prefix))

    def data(self, bucket: str, name: str) -> bytes:
        with self.lock:
            return self.objects[(bucket, name)][1]

    # -- internals ----------------------------------------------------------------------------

    def _take_failure(self, method: str, path: str) -> dict[str, Any] | None:
        with self.lock:
            for f in self.failures:
                if f["method"] in (None, method) and f["path"] in path:
                    f["times"] -= 1
                    if f["times"] <= 0:
                        self.failures.remove(f)
                    return f
        return None

    def _store(self, bucket: str, name: str, data: bytes, meta: dict[str, Any]) -> dict[str, Any]:
        """Write an object (caller holds the lock); returns its resource."""
        gen = str(next(self._gen))
        old = self.objects.get((bucket, name))
        res = {
            "kind": "storage#object", "id": f"{bucket}/{name}/{gen}", "name": name,
            "bucket": bucket, "generation": gen, "metageneration": "1",
            "contentType": meta.get("contentType") or "application/octet-stream",
            "size": str(len(data)), "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(),
            "timeCreated": old[0]["timeCreated"] if old else _now(), "updated": _now(),
            "storageClass": "STANDARD",
            "selfLink": f"{self.endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
            "mediaLink": f"{self.endpoint}/download/storage/v1/b/{bucket}/o/"
                         f"{quote(name, safe='')}?generation={gen}&alt=media",
        }
        crc = _crc32c(data)
        if crc:
            res["crc32c"] = crc
        if meta.get("metadata"):
            res["metadata"] = dict(meta["metadata"])
        self.objects[(bucket, name)] = (res, data)
        return res


def _error(status: int, message: str, reason: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message,
                      "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def _denied(permission: str) -> dict[str, Any]:
    return _error(403, f"the caller does not have {permission} access", "forbidden")


def _missing(bucket: str, name: str) -> dict[str, Any]:
    return _error(404, f"No such object: {bucket}/{name}", "notFound")


def _precondition(query: dict[str, list[str]], current: dict[str, Any] | None) -> bool:
    """True when ``ifGenerationMatch`` / ``ifGenerationNotMatch`` hold for ``current``."""
    gen = current["generation"] if current else "0"
    match = query.get("ifGenerationMatch", [None])[0]
    if match is not None and match != gen:
        return False
    not_match = query.get("ifGenerationNotMatch", [None])[0]
    return not (not_match is not None and not_match == gen)


def _multipart(body: bytes, content_type: str) -> tuple[dict[str, Any], bytes]:
    """(metadata, media) of a multipart/related upload body."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise ValueError("multipart upload without a boundary")
    sep = b"--" + m.group(1).encode()
    parts = [p for p in body.split(sep) if p.strip() not in (b"", b"--")]
    out = []
    for part in parts[:2]:
        _head, _, payload = part.partition(b"\r\n\r\n")
        out.append(payload[:-2] if payload.endswith(b"\r\n") else payload)
    return json.loads(out[0] or b"{}"), out[1] if len(out) > 1 else b""


def _handler(fake: GcsFake) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"

        def handle(self) -> None:
            try:
                super().handle()
            except (ConnectionResetError, BrokenPipeError):
                pass  # the client closed a kept-alive connection: not the fake's news

        def _dispatch(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with fake.lock:
                fake.requests.append((method, url.path))
            failure = fake._take_failure(method, url.path)
            if failure is not None:
                return self._send(failure["status"], _error(failure["status"], "injected",
                                                            "backendError"))
            with fake.lock:
                creator_only = fake.create_prefixes is not None
            if creator_only and not (_UPLOAD.match(url.path) and method in ("POST", "PUT")):
                return self._send(403, _denied(f"storage.objects.{method.lower()}"))
            if _UPLOAD.match(url.path):
                bucket = unquote(_UPLOAD.match(url.path).group(1))  # type: ignore[union-attr]
                if method == "POST":
                    return self._upload(bucket, query, body)
                if method == "PUT":
                    return self._chunk(bucket, query, body)
            m = _COPY.match(url.path)
            if m and method == "POST":
                return self._copy(*(unquote(g) for g in m.groups()), query=query)
            m = _OBJECT.match(url.path)
            if m:
                return self._object(method, unquote(m.group(1)), unquote(m.group(2)), query, body)
            m = _OBJECTS.match(url.path)
            if m and method == "GET":
                return self._list(unquote(m.group(1)), query)
            m = _BUCKET.match(url.path)
            if m and method == "GET":
                with fake.lock:
                    b = fake.buckets.get(unquote(m.group(1)))
                return self._send(200, b) if b else self._send(
                    404, _error(404, "The specified bucket does not exist.", "notFound"))
            if url.path == "/storage/v1/b" and method == "POST":
                name = json.loads(body or b"{}").get("name", "")
                fake.create_bucket(name)
                with fake.lock:
                    return self._send(200, fake.buckets[name])
            return self._send(404, _error(404, f"no route {method} {url.path}", "notFound"))

        def _no_bucket(self, bucket: str) -> bool:
            with fake.lock:
                if bucket in fake.buckets:
                    return False
            self._send(404, _error(404, "The specified bucket does not exist.", "notFound"))
            return True

        def _upload(self, bucket: str, query: dict[str, list[str]], body: bytes) -> None:
            if self._no_bucket(bucket):
                return
            kind = query.get("uploadType", ["media"])[0]
            if kind == "resumable":
                meta = json.loads(body or b"{}")
                name = meta.get("name") or query.get("name", [""])[0]
                sid = f"s{next(fake._gen)}"
                with fake.lock:
                    fake.sessions[sid] = {"bucket": bucket, "name": name, "meta": meta,
                                          "data": bytearray(), "query": query}
                self.send_response(200)
                self.send_header("Location", f"{fake.endpoint}/upload/storage/v1/b/{bucket}/o"
                                             f"?uploadType=resumable&upload_id={sid}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if kind == "multipart":
                meta, data = _multipart(body, self.headers.get("Content-Type", ""))
            else:
                meta, data = {"name": query.get("name", [""])[0]}, body
            self._write(bucket, meta.get("name") or query.get("name", [""])[0], data, meta,
                        query)

        def _write(self, bucket: str, name: str, data: bytes, meta: dict[str, Any],
                   query: dict[str, list[str]]) -> None:
            with fake.lock:
                current = fake.objects.get((bucket, name))
                allowed = fake.create_prefixes
                if allowed is not None and (current is not None or not name.startswith(allowed)):
                    return self._send(403, _denied("storage.objects.delete" if current
                                                   else "storage.objects.create"))
                if not _precondition(query, current[0] if current else None):
                    return self._send(412, _error(412, "At least one of the pre-conditions "
                                                  "you specified did not hold.",
                                                  "conditionNotMet"))
                res = fake._store(bucket, name, data, meta)
            return self._send(200, res)

        def _chunk(self, bucket: str, query: dict[str, list[str]], body: bytes) -> None:
            sid = query.get("upload_id", [""])[0]
            with fake.lock:
                sess = fake.sessions.get(sid)
            if sess is None:
                return self._send(404, _error(404, "No such upload session", "notFound"))
            rng = self.headers.get("Content-Range", "")
            m = re.fullmatch(r"bytes (\*|(\d+)-(\d+))/(\*|\d+)", rng.strip())
            total = None
            if m:
                if m.group(2) is not None and int(m.group(2)) != len(sess["data"]):
                    return self._send(400, _error(400, "chunk out of order", "invalid"))
                total = None if m.group(4) == "*" else int(m.group(4))
            sess["data"] += body
            if total is not None and len(sess["data"]) >= total or not m:
                with fake.lock:
                    fake.sessions.pop(sid, None)
                return self._write(sess["bucket"], sess["name"], bytes(sess["data"]),
                                   sess["meta"], sess["query"])
            self.send_response(308)
            if sess["data"]:
                self.send_header("Range", f"bytes=0-{len(sess['data']) - 1}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _object(self, method: str, bucket: str, name: str, query: dict[str, list[str]],
                    body: bytes) -> None:
            if self._no_bucket(bucket):
                return
            with fake.lock:
                found = fake.objects.get((bucket, name))
            if found is None:
                return self._send(404, _missing(bucket, name))
            res, data = found
            if not _precondition(query, res):
                return self._send(412 if method != "GET" else 304,
                                  _error(412, "precondition failed", "conditionNotMet"))
            if method == "DELETE":
                with fake.lock:
                    fake.objects.pop((bucket, name), None)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if method == "PATCH":
                patch = json.loads(body or b"{}")
                with fake.lock:
                    res = dict(res, metadata={**res.get("metadata", {}),
                                              **(patch.get("metadata") or {})},
                               metageneration=str(int(res["metageneration"]) + 1))
                    fake.objects[(bucket, name)] = (res, data)
                return self._send(200, res)
            if method != "GET":
                return self._send(405, _error(405, "method not allowed", "invalid"))
            if query.get("alt", [""])[0] != "media":
                return self._send(200, res)
            self._media(res, data)

        def _media(self, res: dict[str, Any], data: bytes) -> None:
            status, start, end = 200, 0, len(data) - 1
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "").strip())
            if m:
                start = int(m.group(1))
                end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                status = 206
            chunk = data[start:end + 1]
            self.send_response(status)
            self.send_header("Content-Type", res["contentType"])
            self.send_header("Content-Length", str(len(chunk)))
            self.send_header("x-goog-generation", res["generation"])
            self.send_header("x-goog-stored-content-length", str(len(data)))
            hashes = [f"md5={res['md5Hash']}"] + ([f"crc32c={res['crc32c']}"]
                                                  if "crc32c" in res else [])
            self.send_header("x-goog-hash", ",".join(hashes))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.end_headers()
            self.wfile.write(chunk)

        def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
            if self._no_bucket(bucket):
                return
            prefix = query.get("prefix", [""])[0]
            delim = query.get("delimiter", [None])[0]
            with fake.lock:
                found = sorted((n, r) for (b, n), (r, _) in fake.objects.items()
                               if b == bucket and n.startswith(prefix))
            items, prefixes = [], set()
            for n, r in found:
                rest = n[len(prefix):]
                if delim and delim in rest:
                    prefixes.add(prefix + rest.split(delim, 1)[0] + delim)
                else:
                    items.append(r)
            size = int(query.get("maxResults", ["1000"])[0])
            start = int(query.get("pageToken", ["0"])[0] or 0)
            out: dict[str, Any] = {"kind": "storage#objects", "items": items[start:start + size]}
            if start + size < len(items):
                out["nextPageToken"] = str(start + size)
            if prefixes:
                out["prefixes"] = sorted(prefixes)
            self._send(200, out)

        def _copy(self, bucket: str, name: str, _verb: str, dst_bucket: str, dst_name: str, *,
                  query: dict[str, list[str]]) -> None:
            if self._no_bucket(bucket) or self._no_bucket(dst_bucket):
                return
            with fake.lock:
                found = fake.objects.get((bucket, name))
                if found is None:
                    return self._send(404, _missing(bucket, name))
                current = fake.objects.get((dst_bucket, dst_name))
                if not _precondition(query, current[0] if current else None):
                    return self._send(412, _error(412, "precondition failed", "conditionNotMet"))
                res = fake._store(dst_bucket, dst_name, found[1], found[0])
            if _verb == "copyTo":
                return self._send(200, res)
            size = res["size"]
            return self._send(200, {"kind": "storage#rewriteResponse", "done": True,
                                    "totalBytesRewritten": size, "objectSize": size,
                                    "resource": res})

        def do_GET(self) -> None:  # noqa: N802
            self._dispatch("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._dispatch("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._dispatch("PUT")

        def do_PATCH(self) -> None:  # noqa: N802
            self._dispatch("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self._dispatch("DELETE")

    return Handler
