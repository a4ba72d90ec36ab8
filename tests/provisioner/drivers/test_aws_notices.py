"""The EventBridge event parsers: one per kind, unknown or malformed input ignored."""

from __future__ import annotations

import json

from provisioner.drivers.aws_notices import PARSERS, parse_message
from provisioner.drivers.base import INTERRUPTION, REBALANCE, TERMINATED_NOTICE


def event(kind: str, **detail) -> str:
    return json.dumps({"detail-type": kind, "source": "aws.ec2", "time": "2026-11-21T12:00:00Z",
                       "detail": detail})


def test_interruption_has_a_two_minute_deadline():
    n = parse_message(event("EC2 Spot Instance Interruption Warning", **{
        "instance-id": "i-0abc", "instance-action": "terminate"}))
    assert n.instance_id == "i-0abc" and n.kind == INTERRUPTION
    assert n.time.isoformat() == "2026-11-21T12:00:00+00:00"
    assert n.deadline.isoformat() == "2026-11-21T12:02:00+00:00"


def test_rebalance_and_state_changes():
    assert parse_message(event("EC2 Instance Rebalance Recommendation",
                               **{"instance-id": "i-1"})).kind == REBALANCE
    for state in ("shutting-down", "terminated", "stopping", "stopped"):
        n = parse_message(event("EC2 Instance State-change Notification",
                                **{"instance-id": "i-2", "state": state}))
        assert n.kind == TERMINATED_NOTICE
    for state in ("pending", "running", None):
        assert parse_message(event("EC2 Instance State-change Notification",
                                   **{"instance-id": "i-2", "state": state})) is None


def test_sns_envelope_is_unwrapped():
    inner = event("EC2 Instance Rebalance Recommendation", **{"instance-id": "i-3"})
    n = parse_message(json.dumps({"Type": "Notification", "Message": inner}))
    assert n.instance_id == "i-3"


def test_unknown_and_malformed_are_ignored():
    assert parse_message(event("EC2 Fleet Error", **{"instance-id": "i-4"})) is None
    assert parse_message("{not json") is None
    assert parse_message("[1, 2]") is None
    assert parse_message(json.dumps({"detail-type": "EC2 Instance Rebalance Recommendation",
                                     "detail": "oops"})) is None
    assert parse_message(event("EC2 Spot Instance Interruption Warning",
                               **{"instance-id": 42})) is None
    assert len(PARSERS) == 3
