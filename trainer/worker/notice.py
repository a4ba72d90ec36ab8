"""Cloud revocation notices polled from instance metadata (AWS and GCP), as a small thread.

Design: one pure parser decides whether a metadata answer is a notice
(:func:`is_notice`); :class:`NoticePoller` fetches the URL every ``interval_s`` with
``urllib`` and calls ``on_notice(reason)`` once. Supported URLs:

* AWS ``http://169.254.169.254/latest/meta-data/spot/instance-action``: 404 until a notice,
  then 200 with ``{"action": "terminate", "time": ...}``. An IMDSv2 session token is fetched
  first (``PUT /latest/api/token``); without one the request goes out plain (IMDSv1).
* GCP ``http://metadata.google.internal/computeMetadata/v1/instance/preempted`` (header
  ``Metadata-Flavor: Google``): ``FALSE`` until preempted, then ``TRUE``.

Unknown answers are ignored safely (logged at debug); network errors are retried at the next
interval, never raised into the training loop.

Rule for callers: ``on_notice`` runs in the poller thread; it must only set a flag.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

log = logging.getLogger(__name__)


def is_notice(url: str, status: int, body: str) -> str | None:
    """The notice reason when (``status``, ``body``) of ``url`` announces a revocation, else None."""
    text = body.strip()
    if status != 200 or not text:
        return None
    if "preempted" in url:
        return "GCP instance/preempted" if text.upper() == "TRUE" else None
    if "instance-action" in url:
        return f"AWS spot/instance-action {text[:120]}" if "action" in text else None
    return f"metadata notice {text[:120]}" if text.upper() not in ("FALSE", "NONE") else None


class NoticePoller:
    """Polls a metadata URL in a daemon thread and calls ``on_notice`` once."""

    def __init__(self, url: str, on_notice: Callable[[str], None], interval_s: float = 1.0,
                 timeout_s: float = 1.0) -> None:
        self.url = url
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
        """Fetch the URL once. Returns the notice reason, or None (no notice or no answer)."""
        headers = {"Metadata-Flavor": "Google"}
        if "instance-action" in self.url:
            token = self._aws_token()
            if token:
                headers["X-aws-ec2-metadata-token"] = token
        req = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as r:  # noqa: S310
                return is_notice(self.url, r.status, r.read().decode(errors="replace"))
        except urllib.error.HTTPError as e:
            return is_notice(self.url, e.code, "")
        except (urllib.error.URLError, OSError) as e:
            log.debug("notice poll failed: %s", e)
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            reason = self.poll_once()
            if reason:
                log.warning("revocation notice: %s", reason)
                self._on_notice(reason)
                return
            self._stop.wait(self._interval)
