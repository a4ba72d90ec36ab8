"""Instance metadata servers for fake instances: AWS IMDSv2 and the GCE metadata server.

Design: a fake instance (:mod:`tests.fakes.instances`) reaches "169.254.169.254" and
"metadata.google.internal" through an HTTP proxy of its own (``http_proxy`` in its
environment, as a VM reaches its link-local metadata service): one :class:`MetadataServer`
per instance, so the server knows who asks. curl in the boot scripts and ``urllib`` in the
trainer's notice poller honour ``http_proxy`` themselves: the boot scripts and the trainer run
unchanged. What the server answers comes live from the emulated cloud, through a *view*:

- :class:`AwsView`: the moto instance (``describe_instances``): instance id, zone, instance
  tags (``tags/instance``, as with instance metadata tags enabled), and the spot interruption
  notice (``spot/instance-action``) and rebalance recommendation that a test sets. IMDSv2 as
  the launch template asks (``http_tokens = required``): ``PUT /latest/api/token`` with a TTL
  header gives a token, and every ``GET`` without a valid one is 401.
- :class:`GcpView`: the VM in :class:`tests.fakes.gcp_fake.GcpFake`: name, id, zone
  (``projects/N/zones/Z``), ``instance/attributes/<key>`` from its metadata items, and
  ``instance/preempted`` (``TRUE`` once the fake preempts it, during its notice). Every request
  needs ``Metadata-Flavor: Google`` (403 otherwise).

Anything else through the proxy (another host) is refused with 502: a fake instance has no
other network through it.

Rule for callers: ``with MetadataServer(view) as server``; give the instance
``http_proxy=server.endpoint`` (and ``no_proxy`` for 127.0.0.1, where the cloud fakes and the
coordinator listen).
"""

from __future__ import annotations

import json
import secrets
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import urlparse

from tests.fakes.http_fake import HttpFake

AWS_HOST = "169.254.169.254"
GCP_HOST = "metadata.google.internal"


class NotFound(KeyError):
    """No such metadata path (404)."""


class View(Protocol):
    host: str

    def get(self, path: str) -> str:
        """The answer at ``path`` (below the metadata root). Raises NotFound."""
        ...


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class AwsView:
    """What IMDS says on one moto instance (see the module docstring)."""

    host = AWS_HOST

    def __init__(self, ec2: Any, instance_id: str) -> None:
        self.ec2 = ec2
        self.instance_id = instance_id
        self.action: dict[str, str] | None = None  # spot/instance-action, once noticed
        self.rebalance: dict[str, str] | None = None

    def interrupt(self) -> None:
        """The 2-minute spot interruption notice (what EC2 shows the instance)."""
        self.action = {"action": "terminate", "time": _now()}

    def recommend_rebalance(self) -> None:
        self.rebalance = {"noticeTime": _now()}

    def _raw(self) -> dict[str, Any]:
        res = self.ec2.describe_instances(InstanceIds=[self.instance_id])
        return res["Reservations"][0]["Instances"][0]

    def get(self, path: str) -> str:
        if path == "instance-id":
            return self.instance_id
        if path == "placement/availability-zone":
            return str(self._raw()["Placement"]["AvailabilityZone"])
        if path.startswith("tags/instance"):
            tags = {t["Key"]: t["Value"] for t in self._raw().get("Tags", [])}
            key = path[len("tags/instance"):].lstrip("/")
            if not key:
                return "\n".join(sorted(tags))
            if key in tags:
                return tags[key]
            raise NotFound(path)
        if path == "spot/instance-action" and self.action is not None:
            return json.dumps(self.action)
        if path == "events/recommendations/rebalance" and self.rebalance is not None:
            return json.dumps(self.rebalance)
        raise NotFound(path)


class GcpView:
    """What the GCE metadata server says on one VM of the fake (see the module docstring)."""

    host = GCP_HOST

    def __init__(self, fake: Any, project: str, zone: str, name: str) -> None:
        self.fake, self.project, self.zone, self.name = fake, project, zone, name

    def _vm(self) -> dict[str, Any]:
        with self.fake.lock:
            vm = self.fake.instances.get((self.project, self.zone, self.name))
            return dict(vm) if vm is not None else {}

    def get(self, path: str) -> str:
        vm = self._vm()
        if path == "instance/name":
            return self.name
        if path == "instance/id":
            return str(vm.get("id", "0"))
        if path == "instance/zone":
            return f"projects/123456789012/zones/{self.zone}"
        if path == "instance/preempted":
            return "TRUE" if self.fake.is_preempted(self.project, self.zone, self.name) \
                else "FALSE"
        if path.startswith("instance/attributes/"):
            key = path[len("instance/attributes/"):]
            items = {i["key"]: i["value"] for i in vm.get("metadata", {}).get("items", [])}
            if key in items:
                return str(items[key])
        raise NotFound(path)


class MetadataServer(HttpFake):
    """The metadata service of one fake instance, served as its HTTP proxy."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.tokens: set[str] = set()
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []  # (method, path) answered

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler(self)


def _handler(server: MetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet (http.server API)
            return

        def _answer(self, status: int, body: str = "", ctype: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            url = urlparse(self.path)  # a proxy request: the absolute URL
            host = url.hostname or self.headers.get("Host", "").split(":")[0]
            if host != server.view.host:
                return self._answer(502, f"no route to {host} from this instance")
            with server.lock:
                server.requests.append((method, url.path))
            if host == AWS_HOST:
                return self._aws(method, url.path)
            return self._gcp(method, url.path)

        def _aws(self, method: str, path: str) -> None:
            if method == "PUT" and path == "/latest/api/token":
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._answer(400, "missing or invalid TTL")
                token = secrets.token_urlsafe(24)
                with server.lock:
                    server.tokens.add(token)
                return self._answer(200, token)
            if method != "GET":
                return self._answer(405)
            with server.lock:
                valid = self.headers.get("X-aws-ec2-metadata-token") in server.tokens
            if not valid:  # http_tokens = required: IMDSv1 is off
                return self._answer(401)
            prefix = "/latest/meta-data/"
            if not path.startswith(prefix):
                return self._answer(404)
            try:
                return self._answer(200, server.view.get(path[len(prefix):]))
            except NotFound:
                return self._answer(404)

        def _gcp(self, method: str, path: str) -> None:
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403, "Missing required header \"Metadata-Flavor\": \"Google\"")
            prefix = "/computeMetadata/v1/"
            if method != "GET" or not path.startswith(prefix):
                return self._answer(404)
            try:
                answer = server.view.get(path[len(prefix):])
            except NotFound:
                return self._answer(404)
            self.send_response(200)
            data = answer.encode()
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_PUT(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self._route("PUT")

    return Handler
