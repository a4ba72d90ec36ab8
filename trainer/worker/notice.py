"""Cloud revocation notices polled from instance metadata (AWS and GCP), as a small thread.

Design: one pure parser decides whether a metadata answer is a notice
(:func:`is_notice`) and another how long the instance has left (:func:`seconds_left`);
:class:`NoticePoller` fetches its URLs every ``interval_s`` with ``urllib`` and calls
``on_notice(reason, seconds_left)`` once. Supported URLs:

* AWS ``http://169.254.169.254/latest/meta-data/spot/instance-action``: 404 until a notice,
  then 200 with ``{"action": "terminate", "time": ...}`` (the seconds left run to that time).
  An IMDSv2 session token is fetched first (``PUT /latest/api/token``); without one the
  request goes out plain (IMDSv1). The same host's rebalance recommendation
  (``/latest/meta-data/events/recommendations/rebalance``: 404, then 200 with
  ``{"noticeTime": ...}``; no deadline: ``inf`` seconds left) is polled beside it: an
  instance at elevated risk leaves at a step boundary before its interruption notice.
* GCP ``http://metadata.google.internal/computeMetadata/v1/instance/preempted`` (header
  ``Metadata-Flavor: Google``): ``FALSE`` until preempted, then ``TRUE`` (30 s left).

Unknown answers are ignored safely (logged at debug); network errors are retried at the next
interval, never raised into the training loop.

Rule for callers: ``on_notice`` runs in the poller thread; it must only set a flag (the
worker runs the job's own ``on_notice`` hook on a thread of its own).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime

log = logging.getLogger(__name__)

REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
GCP_NOTICE_S = 30.0  # GCP's preemption notice
AWS_NOTICE_S = 120.0  # AWS's interruption notice, when its time cannot be read


def is_notice(url: str, status: int, body: str) -> str | None:
    """The notice reason when (``status``, ``body``) of ``url`` announces a revocation, else None."""
    text = body.strip()
    if status != 200 or not text:
        return None
    if "preempted" in url:
        return "GCP instance/preempted" if text.upper() == "TRUE" else None
    if "instance-action" in url:
        return f"AWS spot/instance-action {text[:120]}" if "action" in text else None
    if url.endswith(REBALANCE_PATH):
        return (f"AWS rebalance recommendation {text[:120]}" if "noticeTime" in text
                else None)
    return f"metadata notice {text[:120]}" if text.upper() not in ("FALSE", "NONE") else None


def seconds_left(url: str, body: str, now: float) -> float:
    """How long the instance has once ``url`` answered the notice ``body`` at epoch time
    ``now`` (pure): AWS's ``time`` (at least 0), GCP's 30 s, ``inf`` for a recommendation."""
    if url.endswith(REBALANCE_PATH):
        return math.inf
    if "preempted" in url:
        return GCP_NOTICE_S
    try:
        when = datetime.fromisoformat(str(json.loads(body)["time"]).replace("Z", "+00:00"))
        return max(0.0, when.timestamp() - now)
    except (ValueError, KeyError, TypeError):
        return AWS_NOTICE_S if "instance-action" in url else math.inf


class NoticePoller:
    """Polls a metadata URL in a daemon thread and calls ``on_notice`` once."""

    def __init__(self, url: str, on_notice: Callable[[str, float], None],
                 interval_s: float = 1.0, timeout_s: float = 1.0) -> None:
        self.url = url
        parts = urllib.parse.urlsplit(url)
        self.urls = [url]  # AWS: the rebalance recommendation beside the interruption notice
        if "instance-action" in url:
            self.urls.append(f"{parts.scheme}://{parts.netloc}{REBALANCE_PATH}")
        self.seconds_left = math.inf  # of the last notice found
        self._on_notice = on_notice
        self._interval = interval_s
        self._timeout = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotring-notice", daemon=True)

    def start(self) -> NoticePoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _aws_token(self) -> str | None:
        parts = urllib.parse.urlsplit(self.url)
        req = urllib.request.Request(
            f"{parts.scheme}://{parts.netloc}/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as r:  # noqa: S310
                return r.read().decode()
        except (urllib.error.URLError, OSError):
            return None

    def poll_once(self) -> str | None:
        """Fetch every URL once. Returns the first notice's reason (its seconds left in
        :attr:`seconds_left`), or None (no notice or no answer)."""
        headers = {"Metadata-Flavor": "Google"}
        if "instance-action" in self.url:
            token = self._aws_token()
            if token:
                headers["X-aws-ec2-metadata-token"] = token
        for url in self.urls:
            req = urllib.request.Request(url, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self._timeout) as r:  # noqa: S310
                    body = r.read().decode(errors="replace")
                    reason = is_notice(url, r.status, body)
            except urllib.error.HTTPError as e:
                reason, body = is_notice(url, e.code, ""), ""
            except (urllib.error.URLError, OSError) as e:
                log.debug("notice poll failed: %s", e)
                continue
            if reason:
                self.seconds_left = seconds_left(url, body, time.time())
                return reason
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            reason = self.poll_once()
            if reason:
                log.warning("revocation notice: %s (%.0fs left)", reason, self.seconds_left)
                self._on_notice(reason, self.seconds_left)
                return
            self._stop.wait(self._interval)
