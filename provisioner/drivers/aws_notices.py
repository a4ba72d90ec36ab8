"""Parsers for the EC2 events that EventBridge delivers to the AWS driver's SQS queue.

Design: one small parser per event kind, looked up by the event's ``detail-type``; an event
of a kind no parser knows is ignored (and its message deleted), never an error (Karpenter
``controllers/interruption/``). Parsers are pure: a decoded event in, a
:class:`~provisioner.drivers.base.Notice` or ``None`` out, no I/O.

Kinds handled:

- ``EC2 Spot Instance Interruption Warning`` -> ``interruption`` with a deadline 2 minutes
  after the event time (AWS's documented warning window).
- ``EC2 Instance Rebalance Recommendation`` -> ``rebalance`` (elevated risk, no deadline).
- ``EC2 Instance State-change Notification`` -> ``terminated`` when the state is
  ``shutting-down``, ``terminated``, ``stopping`` or ``stopped``; other states are ignored.

Rule for callers: :func:`parse_message` takes the SQS message *body* as delivered by an
EventBridge rule with an SQS target (the event JSON itself) or through SNS (an envelope whose
``Message`` is the event JSON); anything else returns ``None`` and should be deleted.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from provisioner.drivers.base import INTERRUPTION, REBALANCE, TERMINATED_NOTICE, Notice

log = logging.getLogger(__name__)

#: AWS gives two minutes between the interruption warning and the reclaim.
SPOT_WARNING_WINDOW = timedelta(minutes=2)
#: Instance states that mean the instance is going or gone.
GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})

SOURCE = "aws-eventbridge"


def _event_time(event: Mapping[str, Any]) -> datetime:
    raw = event.get("time")
    if isinstance(raw, str):
        try:
            return datetime.fromisoformat(raw.replace("Z", "+00:00")).astimezone(timezone.utc)
        except ValueError:
            pass
    return datetime.now(timezone.utc)


def _instance_id(event: Mapping[str, Any]) -> str | None:
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        return None
    iid = detail.get("instance-id")
    return iid if isinstance(iid, str) and iid.startswith("i-") else None


def parse_interruption(event: Mapping[str, Any]) -> Notice | None:
    """``EC2 Spot Instance Interruption Warning``: taken back 2 minutes after ``time``."""
    iid = _instance_id(event)
    if iid is None:
        return None
    when = _event_time(event)
    return Notice(iid, INTERRUPTION, when, deadline=when + SPOT_WARNING_WINDOW, source=SOURCE)


def parse_rebalance(event: Mapping[str, Any]) -> Notice | None:
    """``EC2 Instance Rebalance Recommendation``: elevated risk, no deadline."""
    iid = _instance_id(event)
    if iid is None:
        return None
    return Notice(iid, REBALANCE, _event_time(event), source=SOURCE)


def parse_state_change(event: Mapping[str, Any]) -> Notice | None:
    """``EC2 Instance State-change Notification``: a notice only when the instance is going."""
    iid = _instance_id(event)
    if iid is None:
        return None
    state = event["detail"].get("state")
    if state not in GONE_STATES:
        return None
    return Notice(iid, TERMINATED_NOTICE, _event_time(event), source=SOURCE)


#: detail-type -> parser. Add a kind by adding one function and one entry.
PARSERS: dict[str, Callable[[Mapping[str, Any]], Notice | None]] = {
    "EC2 Spot Instance Interruption Warning": parse_interruption,
    "EC2 Instance Rebalance Recommendation": parse_rebalance,
    "EC2 Instance State-change Notification": parse_state_change,
}


def parse_message(body: str) -> Notice | None:
    """Decode one SQS message body into a notice, or ``None`` (unknown, malformed, ignored).

    Never raises: a message no parser understands is logged and dropped by the caller.
    """
    try:
        event = json.loads(body)
    except (TypeError, ValueError):
        log.warning("aws notice: dropping a message that is not JSON: %.80r", body)
        return None
    if isinstance(event, dict) and event.get("Type") == "Notification" and "Message" in event:
        return parse_message(event["Message"])  # delivered through SNS
    if not isinstance(event, dict):
        log.warning("aws notice: dropping a message that is not a JSON object: %.80r", body)
        return None
    kind = event.get("detail-type")
    parser = PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        log.debug("aws notice: ignoring event detail-type=%r", kind)
        return None
    notice = parser(event)
    if notice is None:
        log.debug("aws notice: %r event without a usable instance id or state", kind)
    return notice
