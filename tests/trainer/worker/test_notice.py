"""Cloud revocation notices: the poller against a local HTTP server speaking AWS and GCP."""

from __future__ import annotations

import http.server
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from trainer.worker.config import WorkerConfig
from trainer.worker.loop import Worker
from trainer.worker.notice import NoticePoller, is_notice, seconds_left


class _Metadata(http.server.BaseHTTPRequestHandler):
    notice = False
    rebalance = False
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
            when = datetime.fromtimestamp(time.time() + 100, timezone.utc)
            body = json.dumps({"action": "terminate",
                               "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
        elif self.path.endswith("/events/recommendations/rebalance"):
            if not type(self).rebalance:
                self.send_response(404)
                self.end_headers()
                return
            body = b'{"noticeTime": "2026-11-21T23:58:00Z"}'
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
    _Metadata.rebalance = False
    _Metadata.seen_headers = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.mark.parametrize("path, flag, expect, left", [
    ("/latest/meta-data/spot/instance-action", "notice", "AWS spot/instance-action", 100),
    ("/latest/meta-data/spot/instance-action", "rebalance", "AWS rebalance recommendation",
     math.inf),
    ("/computeMetadata/v1/instance/preempted", "notice", "GCP instance/preempted", 30),
])
def test_poller_calls_back_once_when_the_notice_appears(server: str, path: str, flag: str,
                                                        expect: str, left: float) -> None:
    got: list[tuple[str, float]] = []
    fired = threading.Event()
    poller = NoticePoller(server + path, lambda r, s: (got.append((r, s)), fired.set()),
                          interval_s=0.05)
    assert poller.poll_once() is None  # no notice yet
    poller.start()
    assert not fired.wait(0.3)
    setattr(_Metadata, flag, True)
    assert fired.wait(5)
    poller.stop()
    assert len(got) == 1 and got[0][0].startswith(expect), got
    assert got[0][1] == pytest.approx(left, abs=5)
    if "instance-action" in path:
        assert _Metadata.seen_headers[-1].get("X-Aws-Ec2-Metadata-Token") == "tok-123"
    else:
        assert _Metadata.seen_headers[-1].get("Metadata-Flavor") == "Google"


def test_unreachable_metadata_is_not_a_notice() -> None:
    assert NoticePoller("http://127.0.0.1:9/latest/meta-data/spot/instance-action",
                        lambda r, s: None, timeout_s=0.2).poll_once() is None


def test_parser_ignores_unknown_answers() -> None:
    assert is_notice("http://x/instance/preempted", 200, "FALSE") is None
    assert is_notice("http://x/spot/instance-action", 404, "") is None
    assert is_notice("http://x/spot/instance-action", 200, "<html>oops</html>") is None



def test_seconds_left_of_each_source() -> None:
    url = "http://x/latest/meta-data/spot/instance-action"
    now = datetime(2026, 11, 21, 23, 57, tzinfo=timezone.utc).timestamp()
    assert seconds_left(url, '{"action": "stop", "time": "2026-11-21T23:59:00Z"}', now) == 120
    assert seconds_left(url, '{"action": "stop", "time": "2026-11-21T23:00:00Z"}', now) == 0
    assert seconds_left(url, "garbage", now) == 120
    assert seconds_left("http://x/latest/meta-data/events/recommendations/rebalance", "{}",
                        now) == math.inf


def test_the_job_s_on_notice_runs_once_on_a_thread_and_its_error_is_only_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """27.6: on every member that got a notice, within a second, never delaying the drain."""
    w = Worker(WorkerConfig("127.0.0.1", 1, b"t", "job.py", "w"))
    calls: list[tuple[float, str]] = []
    ran = threading.Event()
    release = threading.Event()

    def on_notice(left: float) -> None:
        calls.append((left, threading.current_thread().name))
        ran.set()
        release.wait(5)  # a slow hook: the worker does not wait for it
        raise RuntimeError("the user's upload failed")

    w.job = SimpleNamespace(on_notice=on_notice)  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR):
        w.give_notice("AWS spot/instance-action", 95.0)
        assert w.notice == "AWS spot/instance-action"  # the drain is asked at once
        w.give_notice("SIGTERM", 30.0)  # a second source: the hook ran already
        assert ran.wait(1.0)
        release.set()
        for _ in range(100):
            if "on_notice" in caplog.text:
                break
            time.sleep(0.02)
    assert calls == [(95.0, "spotring-on-notice")]
    assert "the drain goes on" in caplog.text
    w.give_notice("batch planner: too slow")  # not a revocation: no hook
    assert len(calls) == 1
