"""Cloud revocation notices: the poller against a local HTTP server speaking AWS and GCP."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from trainer.worker.notice import NoticePoller, is_notice


class _Metadata(http.server.BaseHTTPRequestHandler):
    notice = False
    seen_headers: list[dict[str, str]] = []

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def do_PUT(self) -> None:  # IMDSv2 session token
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"tok-123")

    def do_GET(self) -> None:
        type(self).seen_headers.append(dict(self.headers))
        if self.path.endswith("/spot/instance-action"):
            if not type(self).notice:
                self.send_response(404)
                self.end_headers()
                return
            body = b'{"action": "terminate", "time": "2026-11-21T23:59:00Z"}'
        elif self.path.endswith("/instance/preempted"):
            body = b"TRUE" if type(self).notice else b"FALSE"
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def server() -> Iterator[str]:
    _Metadata.notice = False
    _Metadata.seen_headers = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.mark.parametrize("path, expect", [
    ("/latest/meta-data/spot/instance-action", "AWS spot/instance-action"),
    ("/computeMetadata/v1/instance/preempted", "GCP instance/preempted"),
])
def test_poller_calls_back_once_when_the_notice_appears(server: str, path: str,
                                                        expect: str) -> None:
    got: list[str] = []
    fired = threading.Event()
    poller = NoticePoller(server + path, lambda r: (got.append(r), fired.set()),
                          interval_s=0.05)
    assert poller.poll_once() is None  # no notice yet
    poller.start()
    assert not fired.wait(0.3)
    _Metadata.notice = True
    assert fired.wait(5)
    poller.stop()
    assert len(got) == 1 and got[0].startswith(expect)
    if "instance-action" in path:
        assert _Metadata.seen_headers[-1].get("X-Aws-Ec2-Metadata-Token") == "tok-123"
    else:
        assert _Metadata.seen_headers[-1].get("Metadata-Flavor") == "Google"


def test_unreachable_metadata_is_not_a_notice() -> None:
    assert NoticePoller("http://127.0.0.1:9/latest/meta-data/spot/instance-action",
                        lambda r: None, timeout_s=0.2).poll_once() is None


def test_parser_ignores_unknown_answers() -> None:
    assert is_notice("http://x/instance/preempted", 200, "FALSE") is None
    assert is_notice("http://x/spot/instance-action", 404, "") is None
    assert is_notice("http://x/spot/instance-action", 200, "<html>oops</html>") is None

