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
from typing import Mapping, Protocol, Sequence, runtime_checkable

from pricing.model import Offering

# Instance states as the drivers report them (each driver maps its cloud's states here).
PENDING = "pending"
RUNNING = "running"
STOPPING = "stopping"
TERMINATED = "terminated"
STATES = (PENDING, RUNNING, STOPPING, TERMINATED)

# Notice kinds.
INTERRUPTION = "interruption"  # will be taken back soon (AWS 2-minute warning, local notice)
REBALANCE = "rebalance"  # elevated risk (AWS rebalance recommendation)
PREEMPTED = "preempted"  # already taken back (GCP preemption, AWS state change)
TERMINATED_NOTICE = "terminated"  # gone for any other reason
NOTICE_KINDS = (INTERRUPTION, REBALANCE, PREEMPTED, TERMINATED_NOTICE)


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
    state: str
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
    kind: str
    time: datetime
    deadline: datetime | None = None  # when the instance will be taken back, if known
    source: str = ""


def can_place(driver: object, offering: Offering) -> bool:
    """Can ``driver`` launch ``offering``? Drivers limited to some regions or zones (e.g. the
    AWS driver to its region and configured subnets) define ``can_place(offering)``; others
    place anything. The daemon plans only over offerings its driver can place."""
    check = getattr(driver, "can_place", None)
    return True if check is None else bool(check(offering))


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
