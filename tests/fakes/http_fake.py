"""The scaffold the local HTTP fakes of cloud APIs share: a JSON answer, quiet logs, and a
threaded server on an ephemeral port started and stopped as a context manager.

Design: each fake (tests/fakes/gcp_fake.py for Compute Engine, tests/fakes/gcp_catalog_fake.py
for the billing catalog) is a real HTTP server that the real client libraries talk to; what
differs is only the routing, so a fake subclasses :class:`HttpFake` and returns its request
handler class (a subclass of :class:`JsonHandler`) from :meth:`HttpFake.handler`.

Rule for callers: use a fake as a context manager; :attr:`HttpFake.endpoint` is valid inside.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that answers JSON and does not log every request to stderr."""

    def log_message(self, *args: Any) -> None:  # quiet (http.server API)
        return

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class HttpFake:
    """Serves :meth:`handler` on 127.0.0.1 (port 0) from a daemon thread while entered."""

    _server: ThreadingHTTPServer | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class of this fake (it may close over ``self``)."""
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not serving: use it as a context manager")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> Any:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
