"""Parsers for the Compute Engine zone operations the GCP driver reads as notices.

Design: one small parser per operation type, looked up by ``operationType``; an operation of
a type no parser knows is ignored, never an error (the rule of
:mod:`provisioner.drivers.aws_notices`, after Karpenter ``controllers/interruption/``).
Parsers are pure: an :class:`Operation` (the fields the driver read, and whether the VM the
operation names still exists) in, a :class:`~provisioner.drivers.base.Notice` or ``None`` out.

Kinds handled:

- ``compute.instances.preempted`` on a VM that still exists -> ``interruption``, deadline =
  the operation's time + the VM's preemption notice (``scheduling.preemptionNoticeDuration``,
  up to 120 s, during which ``instance/preempted`` reads TRUE on the VM) + the 30 s of the
  ACPI soft-off that follows it: its worker drains at a step boundary (it polls the metadata
  server itself) and the daemon replaces it meanwhile, deleting it once its worker has left;
- the same operation on a VM already gone -> ``preempted`` (nothing left to drain).

Rule for callers: pass every operation of a watched zone once (the driver keeps the ids it
has seen); ``alive`` is the VM's existence when the operation was read.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

from provisioner.drivers.base import INTERRUPTION, PREEMPTED, Notice

SOURCE = "gcp-operations"
#: Seconds between the end of a preemption notice (or the preemption, without one) and the
#: VM's stop: GCE's ACPI G2 soft-off window for SPOT VMs.
SOFT_OFF_S = 30.0
PREEMPTED_TYPE = "compute.instances.preempted"


@dataclass(frozen=True)
class Operation:
    """A zone operation as the driver read it (``target`` is the VM's ``<zone>/<name>``)."""

    id: str
    type: str
    target: str
    insert_time: str
    alive: bool = False


def _time(raw: str, default: datetime) -> datetime:
    with contextlib.suppress(ValueError, TypeError):
        return datetime.fromisoformat(raw).astimezone(timezone.utc)
    return default


def parse_preempted(op: Operation, notice_s: float, now: datetime) -> Notice | None:
    """``compute.instances.preempted``: an interruption while the VM lives, else preempted."""
    when = _time(op.insert_time, now)
    if op.alive:
        return Notice(op.target, INTERRUPTION, when,
                      deadline=when + timedelta(seconds=notice_s + SOFT_OFF_S), source=SOURCE)
    return Notice(op.target, PREEMPTED, when, source=SOURCE)


#: operationType -> parser. Add a kind by adding one function and one entry.
PARSERS: dict[str, Callable[[Operation, float, datetime], Notice | None]] = {
    PREEMPTED_TYPE: parse_preempted,
}


def parse_operation(op: Operation, notice_s: float, now: datetime) -> Notice | None:
    """The notice an operation gives, or ``None`` (a type no parser knows). Never raises."""
    parser = PARSERS.get(op.type)
    return parser(op, notice_s, now) if parser is not None else None
