"""The CloudDriver protocol: launch, terminate, list, notices.

Design: one small Protocol with the same verbs for every cloud (AWS, GCP, local); the
orchestration (what to launch, retries across offerings, draining) lives outside the drivers
in the reconciler and the daemon (SkyPilot ``sky/provision/``). Each driver translates its
SDK's errors into :mod:`provisioner.errors` and tags every instance with the job id, so
``list(job_id)`` finds everything the job owns even after the daemon lost its state.

Rule for callers: pass the same ``LaunchRequest.token`` when retrying a launch; a driver must
return the instances of the first attempt rather than launch again (AWS ClientToken).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Mapping, Protocol, Sequence, runtime_checkable

from pricing.model import Offering

class InstanceState(StrEnum):
    """Instance states as the drivers report them (each driver maps its cloud's states here).

    PENDING -> RUNNING -> STOPPING -> TERMINATED; a launch may go straight to TERMINATED
    (refused after acceptance), and a preemption from any state to TERMINATED."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATED = "terminated"


class NoticeKind(StrEnum):
    """What a notice says about an instance."""

    INTERRUPTION = "interruption"  # will be taken back soon (AWS 2-minute warning, local)
    REBALANCE = "rebalance"  # elevated risk (AWS rebalance recommendation)
    PREEMPTED = "preempted"  # already taken back (GCP preemption, AWS state change)
    TERMINATED = "terminated"  # gone for any other reason


# The members under the names the drivers and tests import.
PENDING, RUNNING, STOPPING, TERMINATED = (InstanceState.PENDING, InstanceState.RUNNING,
                                          InstanceState.STOPPING, InstanceState.TERMINATED)
STATES = tuple(InstanceState)
INTERRUPTION, REBALANCE, PREEMPTED = (NoticeKind.INTERRUPTION, NoticeKind.REBALANCE,
                                      NoticeKind.PREEMPTED)
TERMINATED_NOTICE = NoticeKind.TERMINATED
NOTICE_KINDS = tuple(NoticeKind)


@dataclass(frozen=True)
class LaunchRequest:
    """Launch ``count`` instances of one offering for a job.

    ``token`` makes the launch idempotent: the same token never launches twice.
    ``env`` is passed to the worker (e.g. coordinator address, token file contents).
    """

    offering: Offering
    count: int
    job_id: str
    token: str
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Instance:
    id: str
    offering: Offering
    state: InstanceState
    launched_at: datetime | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchResult:
    """What a launch produced: instances started (possibly fewer than asked) and why not."""

    instances: tuple[Instance, ...]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Notice:
    """A revocation or risk signal about one instance."""

    instance_id: str
    kind: NoticeKind
    time: datetime
    deadline: datetime | None = None  # when the instance will be taken back, if known
    source: str = ""


@runtime_checkable
class CloudDriver(Protocol):
    name: str

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start instances. Raises CapacityError when the offering has no capacity,
        CredentialsError without credentials, DriverError on other failures."""
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate instances; unknown or already terminated ids are not an error."""
        ...

    def list(self, job_id: str) -> list[Instance]:
        """Every non-terminated instance tagged with ``job_id``."""
        ...

    def notices(self) -> list[Notice]:
        """Notices received since the last call (each delivered once)."""
        ...

    def can_place(self, offering: Offering) -> bool:
        """Can this driver launch ``offering``? (The AWS driver: its region and configured
        subnets; others: anything.) The daemon plans only over offerings it can place."""
        ...
