"""A small local HTTP fake of the Compute Engine v1 REST API, for the GCP driver's tests.

Design: the real ``google-cloud-compute`` client (``transport="rest"``,
``ClientOptions(api_endpoint="http://127.0.0.1:PORT")``, ``AnonymousCredentials()``) talks to
this server, so the driver's requests, the client's JSON mapping, its retries and its error
mapping are all exercised for real (httpx ``MockTransport`` style: a fake beside the real
thing). It implements what the driver calls and no more:

- ``POST/GET/DELETE /compute/v1/projects/P/zones/Z/instances[/NAME]`` (insert, list, get,
  delete), ``GET /compute/v1/projects/P/aggregated/instances``, with ``filter`` equality terms
  (``labels.k = "v"``, ``status = RUNNING``) joined by AND, and ``maxResults``/``pageToken``;
- ``GET /compute/v1/projects/P/zones/Z/operations[/OP]`` with the same filters;
- insert honours ``requestId`` (a retried insert returns the first operation) and answers
  409 for an existing name; operations complete synchronously (status ``DONE``).

Fault injection: :meth:`GcpFake.fail_next` answers the next matching requests (after letting
``after`` of them through) with an HTTP error (429, 503, 403 quota...);
:meth:`GcpFake.stockout` makes inserts in a zone end in a ``ZONE_RESOURCE_POOL_EXHAUSTED``
operation; :meth:`GcpFake.slow_inserts` leaves a zone's insert operations ``RUNNING`` (the VM
``PROVISIONING``) until turned off; :meth:`GcpFake.preempt` deletes an instance and records a
``compute.instances.preempted`` operation, as a SPOT VM with termination action DELETE does
(with ``notice_s``: the operation first, ``instance/preempted`` reads TRUE on the VM
(:meth:`GcpFake.is_preempted`, for :mod:`tests.fakes.metadata`) and the VM goes
``notice_s`` later, as with ``scheduling.preemptionNoticeDuration``).

Secret Manager's ``GET /v1/projects/P/secrets/S/versions/latest:access`` answers what
:meth:`GcpFake.set_secret` stored (the fake ``gcloud`` of the boot tests reads the ring token
there).

Rule for callers: use it as a context manager (``with GcpFake() as fake``); it serves on an
ephemeral port from a daemon thread (the scaffold of :mod:`tests.fakes.http_fake`) and is
thread-safe.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.fakes.http_fake import HttpFake, JsonHandler

_TERM = re.compile(r'([A-Za-z][\w.\-]*)\s*(=|!=|eq|ne)\s*"?([^"\s)]+)"?')
_ZONE_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)"
                        r"(?:/([^/]+))?$")
_AGG_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instances$")
_SECRET_PATH = re.compile(r"^/v1/projects/([^/]+)/secrets/([^/]+)/versions/latest:access$")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _lookup(resource: dict[str, Any], dotted: str) -> Any:
    value: Any = resource
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def matches(resource: dict[str, Any], filter_text: str | None) -> bool:
    """True when ``resource`` satisfies every ``field op value`` term of ``filter_text``."""
    if not filter_text:
        return True
    for field, op, expected in _TERM.findall(filter_text):
        actual = _lookup(resource, field)
        equal = actual is not None and str(actual) == expected
        if (op in ("=", "eq")) != equal:
            return False
    return True


class GcpFake(HttpFake):
    """The fake's state and controls; :attr:`endpoint` is the URL to point the client at."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.operations: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.by_request_id: dict[str, dict[str, Any]] = {}
        self.stockout_zones: set[str] = set()
        self.slow_zones: set[str] = set()
        self.failures: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.secrets: dict[tuple[str, str], str] = {}  # (project, secret) -> latest value
        self.noticed: set[tuple[str, str, str]] = set()  # VMs told of their preemption
        self._ids = itertools.count(1000)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler(self)

    # -- controls -----------------------------------------------------------------------------

    def fail_next(self, status: int, *, method: str | None = None, path_contains: str = "",
                  times: int = 1, reason: str = "", message: str = "injected",
                  after: int = 0) -> None:
        """Answer the next ``times`` requests matching method/path with HTTP ``status``, once
        ``after`` matching requests have been served normally."""
        with self.lock:
            self.failures.append(dict(status=status, method=method, path=path_contains,
                                      times=times, reason=reason, message=message, after=after))

    def stockout(self, zone: str, on: bool = True) -> None:
        """Make inserts in ``zone`` fail with ZONE_RESOURCE_POOL_EXHAUSTED (or stop that)."""
        with self.lock:
            (self.stockout_zones.add if on else self.stockout_zones.discard)(zone)

    def slow_inserts(self, zone: str, on: bool = True) -> None:
        """Leave inserts in ``zone`` running (VM ``PROVISIONING``, operation ``RUNNING``); off:
        finish those waiting (VM ``RUNNING``, operation ``DONE``)."""
        with self.lock:
            if on:
                self.slow_zones.add(zone)
                return
            self.slow_zones.discard(zone)
            for (_p, z), ops in self.operations.items():
                for op in ops:
                    if z == zone and op["status"] == "RUNNING":
                        op.update(status="DONE", progress=100, endTime=_now())
            for (_p, z, _n), inst in self.instances.items():
                if z == zone and inst["status"] == "PROVISIONING":
                    inst["status"] = "RUNNING"

    def preempt(self, project: str, zone: str, name: str, notice_s: float = 0.0) -> None:
        """Take a SPOT VM back: record a compute.instances.preempted operation and delete it,
        at once or, with ``notice_s``, after a notice during which the VM's
        ``instance/preempted`` reads TRUE (unless something deleted it first)."""
        key = (project, zone, name)
        with self.lock:
            inst = self.instances[key]
            self._operation(project, zone, "compute.instances.preempted", inst)
            self.noticed.add(key)
            if notice_s <= 0:
                self.instances.pop(key)
                return

        def gone() -> None:
            with self.lock:
                self.instances.pop(key, None)

        timer = threading.Timer(notice_s, gone)
        timer.daemon = True
        timer.start()

    def is_preempted(self, project: str, zone: str, name: str) -> bool:
        """Has the VM been told of its preemption (``instance/preempted`` TRUE)?"""
        with self.lock:
            return (project, zone, name) in self.noticed

    def set_secret(self, project: str, secret: str, value: str) -> None:
        """Store a Secret Manager secret's latest version."""
        with self.lock:
            self.secrets[(project, secret)] = value

    def alive(self, project: str) -> list[dict[str, Any]]:
        """Every instance of ``project`` still present."""
        with self.lock:
            return [dict(i) for (p, _, _), i in self.instances.items() if p == project]

    # -- internals ----------------------------------------------------------------------------

    def _operation(self, project: str, zone: str, kind: str, inst: dict[str, Any],
                   error: tuple[int, str, str] | None = None,
                   done: bool = True) -> dict[str, Any]:
        op_id = str(next(self._ids))
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": op_id, "name": f"operation-{op_id}",
            "zone": f"{self.endpoint}/compute/v1/projects/{project}/zones/{zone}",
            "operationType": kind, "targetLink": inst.get("selfLink", ""),
            "targetId": inst.get("id", ""), "status": "DONE" if done else "RUNNING",
            "progress": 100 if done else 0, "insertTime": _now(), "startTime": _now(),
            "selfLink": f"{self.endpoint}/compute/v1/projects/{project}/zones/{zone}/operations/"
                        f"operation-{op_id}",
        }
        if done:
            op["endTime"] = _now()
        if error is not None:
            status, code, message = error
            op["error"] = {"errors": [{"code": code, "message": message}]}
            op["httpErrorStatusCode"] = status
            op["httpErrorMessage"] = message
        self.operations.setdefault((project, zone), []).append(op)
        return op

    def _take_failure(self, method: str, path: str) -> dict[str, Any] | None:
        with self.lock:
            for f in self.failures:
                if (f["method"] in (None, method)) and f["path"] in path:
                    if f["after"] > 0:
                        f["after"] -= 1
                        return None
                    f["times"] -= 1
                    if f["times"] <= 0:
                        self.failures.remove(f)
                    return f
        return None


def _error_body(status: int, message: str, reason: str = "") -> dict[str, Any]:
    return {"error": {"code": status, "message": message,
                      "errors": [{"message": message, "domain": "global",
                                  "reason": reason or "backendError"}]}}


def _page(items: list[dict[str, Any]], query: dict[str, list[str]]) -> tuple[list, str | None]:
    size = int(query.get("maxResults", ["500"])[0])
    start = int(query.get("pageToken", ["0"])[0] or 0)
    nxt = str(start + size) if start + size < len(items) else None
    return items[start:start + size], nxt


def _handler(fake: GcpFake) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"

        def _dispatch(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            with fake.lock:
                fake.requests.append((method, url.path))
            failure = fake._take_failure(method, url.path)
            if failure is not None:
                return self._send(failure["status"], _error_body(
                    failure["status"], failure["message"], failure["reason"]))
            m = _AGG_PATH.match(url.path)
            if m and method == "GET":
                return self._aggregated(m.group(1), query)
            m = _SECRET_PATH.match(url.path)
            if m and method == "GET":
                with fake.lock:
                    value = fake.secrets.get((m.group(1), m.group(2)))
                if value is None:
                    return self._send(404, _error_body(404, f"Secret [{m.group(2)}] not found",
                                                       "notFound"))
                return self._send(200, {"name": url.path.removeprefix("/v1/"), "payload": {
                    "data": base64.b64encode(value.encode()).decode()}})
            m = _ZONE_PATH.match(url.path)
            if not m:
                return self._send(404, _error_body(404, f"no route {url.path}", "notFound"))
            project, zone, collection, name = m.groups()
            if collection == "operations":
                return self._operations(project, zone, name, query)
            if method == "POST" and name is None:
                return self._insert(project, zone, body, query)
            if method == "GET" and name is None:
                with fake.lock:
                    items = [i for (p, z, _), i in fake.instances.items()
                             if p == project and z == zone and matches(i, query.get(
                                 "filter", [None])[0])]
                page, nxt = _page(items, query)
                out: dict[str, Any] = {"kind": "compute#instanceList", "items": page}
                if nxt:
                    out["nextPageToken"] = nxt
                return self._send(200, out)
            with fake.lock:
                inst = fake.instances.get((project, zone, name))
                if inst is None:
                    return self._send(404, _error_body(
                        404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                             f"was not found", "notFound"))
                if method == "GET":
                    return self._send(200, inst)
                if method == "DELETE":
                    del fake.instances[(project, zone, name)]
                    return self._send(200, fake._operation(project, zone, "delete", inst))
            return self._send(405, _error_body(405, "method not allowed"))

        def _insert(self, project: str, zone: str, body: dict[str, Any],
                    query: dict[str, list[str]]) -> None:
            request_id = query.get("requestId", [None])[0]
            name = body.get("name", "")
            with fake.lock:
                if request_id and request_id in fake.by_request_id:
                    return self._send(200, fake.by_request_id[request_id])
                if (project, zone, name) in fake.instances:
                    return self._send(409, _error_body(
                        409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                             f"already exists", "alreadyExists"))
                inst = dict(body)
                inst.update(id=str(next(fake._ids)), status="RUNNING", kind="compute#instance",
                            zone=f"{fake.endpoint}/compute/v1/projects/{project}/zones/{zone}",
                            selfLink=f"{fake.endpoint}/compute/v1/projects/{project}/zones/"
                                     f"{zone}/instances/{name}",
                            creationTimestamp=_now())
                if zone in fake.stockout_zones:
                    op = fake._operation(project, zone, "insert", inst, error=(
                        503, "ZONE_RESOURCE_POOL_EXHAUSTED",
                        f"The zone '{zone}' does not have enough resources available"))
                else:
                    slow = zone in fake.slow_zones
                    if slow:
                        inst["status"] = "PROVISIONING"
                    fake.instances[(project, zone, name)] = inst
                    op = fake._operation(project, zone, "insert", inst, done=not slow)
                if request_id:
                    fake.by_request_id[request_id] = op
            return self._send(200, op)

        def _aggregated(self, project: str, query: dict[str, list[str]]) -> None:
            flt = query.get("filter", [None])[0]
            with fake.lock:
                zones: dict[str, list[dict[str, Any]]] = {}
                for (p, z, _), inst in fake.instances.items():
                    if p == project and matches(inst, flt):
                        zones.setdefault(f"zones/{z}", []).append(inst)
            self._send(200, {"kind": "compute#instanceAggregatedList",
                             "items": {k: {"instances": v} for k, v in zones.items()}})

        def _operations(self, project: str, zone: str, name: str | None,
                        query: dict[str, list[str]]) -> None:
            with fake.lock:
                ops = list(fake.operations.get((project, zone), []))
            if name is not None:
                found = [o for o in ops if o["name"] == name]
                if not found:
                    return self._send(404, _error_body(404, f"operation {name} not found"))
                return self._send(200, found[0])
            flt = query.get("filter", [None])[0]
            page, nxt = _page([o for o in ops if matches(o, flt)], query)
            out: dict[str, Any] = {"kind": "compute#operationList", "items": page}
            if nxt:
                out["nextPageToken"] = nxt
            return self._send(200, out)

        def do_GET(self) -> None:  # noqa: N802
            self._dispatch("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._dispatch("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._dispatch("DELETE")

    return Handler
