"""What the coordinator knows and what it can do: the state, the snapshot and the actions of
:func:`trainer.control.decide.decide`, and the views the daemon reads.

Design: frozen dataclasses only (the decision returns a new :class:`ControlState`, never mutates
one); the actions are the only way the decision touches the world, and
:class:`trainer.control.coordinator.Coordinator` is their one executor.

Rule for callers: treat every value as immutable; read views through :func:`stats` and
:func:`members`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.control import plans
from trainer.protocol import messages as mb
from trainer.protocol.messages import EventKind, MemberState, JobOutcome, Plan

SPEED_POLL_S = 0.5  # how often members' reported samples/s are read (the first at once)


@dataclass(frozen=True)
class ControlSettings:
    heartbeat_timeout_s: float = 5.0
    rollcall_s: float = 0.5
    initial_world: int = 1


@dataclass(frozen=True)
class Tracked:
    """A member of the newest plan, or an admitted joiner."""

    member_id: int
    name: str
    joined_at: float  # wall clock, for display
    samples_per_s: float = 0.0
    batch: int = 0
    hb: int = -1
    hb_seen: float = 0.0  # active time at which the heartbeat last moved
    state: MemberState = MemberState.JOINING
    device: str = "cpu"
    zone: str = ""


@dataclass(frozen=True)
class Dropped:
    name: str
    when: float  # active time
    hb: int


@dataclass(frozen=True)
class RollCall:
    """A recovery in progress: who must show a heartbeat for ``plan``'s members to go on."""

    generation: int
    why: str
    dead: tuple[int, ...]  # found dead before the roll call (heartbeat stopped)
    base: Mapping[int, int]  # heartbeat of each other member when it started
    started: float  # active time


@dataclass(frozen=True)
class ControlState:
    """Everything the coordinator knows (see the module docstring)."""

    plan: Plan | None = None
    formed: bool = True
    formed_gen: int = 0  # the newest generation every member reported formed
    tracked: Mapping[int, Tracked] = field(default_factory=dict)
    ready: tuple[int, ...] = ()  # admitted joiners, oldest first
    draining: Mapping[int, str] = field(default_factory=dict)
    done: frozenset[int] = frozenset()
    done_sums: Mapping[int, tuple[int, str]] = field(default_factory=dict)  # id -> (step, digest)
    dropped: Mapping[int, Dropped] = field(default_factory=dict)
    unseen: Mapping[int, float] = field(default_factory=dict)  # id -> active time taken
    scan_from: int = 1
    reforms: plans.Reforms = plans.Reforms()
    rollcall: RollCall | None = None
    holders: frozenset[int] = frozenset()  # members that hold the state (formed a generation)
    deferred: frozenset[int] = frozenset()  # draining holders kept: no other member holds it
    failed_snapshots: Mapping[str, str] = field(default_factory=dict)  # name -> why it failed
    failures: int = 0  # recoveries in a row with no generation formed between (backoff)
    adopted: bool = False  # a restarted coordinator took over a running ring
    first_report: float | None = None  # active time of the first member report seen
    resumed_from: int | None = None  # the step of the snapshot the ring last resumed from
    progress: mb.ProgressReport = mb.ProgressReport()
    steps_lost: int = 0
    outcome: JobOutcome = JobOutcome.RUNNING
    failure: str = ""
    job: str = ""
    seen_counts: Mapping[str, int] = field(default_factory=dict)  # drains/dones/errors
    clock: float = 0.0  # active time
    last_now: float | None = None
    last_speed_poll: float = -SPEED_POLL_S
    malformed: int = 0


@dataclass(frozen=True)
class TickReads:
    """What one tick read: the monotonic and wall clocks and the values of :func:`reads`."""

    now: float
    wall: float
    values: Mapping[str, bytes | None]

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def count(self, key: str) -> int:
        return counter_value(self.values.get(key))


def counter_value(raw: bytes | None) -> int:
    """A store counter's value (0 when unset or not a number)."""
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True)
class Add:
    key: str
    delta: int


@dataclass(frozen=True)
class Delete:
    key: str


@dataclass(frozen=True)
class DeletePrefix:
    prefix: str  # ends with "/": a whole folder of keys


@dataclass(frozen=True)
class Emit:
    kind: EventKind
    name: str
    detail: str = ""
    generation: int | None = None
    data: Mapping[str, Any] | None = None


Action = Put | Add | Delete | DeletePrefix | Emit


# -- views ----------------------------------------------------------------------------------


def stats(ring: ControlState) -> dict[str, Any]:
    """The ring's progress as the daemon and the CLI show it (plain data)."""
    p = ring.progress
    out: dict[str, Any] = {
        "generation": ring.plan.generation if ring.plan else 0,
        "step": p.step, "epoch": p.epoch, "samples_done": p.samples_done,
        "world": len(ring.plan.members) if ring.plan else 0,
        "steps_lost": ring.steps_lost,
        "finished": ring.outcome is not JobOutcome.RUNNING,
        "outcome": ring.outcome.value,
        "lost": ring.outcome is JobOutcome.LOST,
        "completing": bool(ring.done),
        "malformed": ring.malformed,
        "adopted": ring.adopted,
        "resumed_from": ring.resumed_from,
    }
    if p.loss is not None:
        out["loss"] = p.loss
    if p.metrics:
        out["metrics"] = dict(p.metrics)
        if "accuracy" in p.metrics:
            out["accuracy"] = p.metrics["accuracy"]
    if ring.failure:
        out["failure"] = ring.failure
    return out


def members(ring: ControlState) -> list[mb.MemberInfo]:
    """Members of the newest generation and admitted joiners, by id."""
    gen = ring.plan.generation if ring.plan else 0
    return [mb.MemberInfo(id=tr.member_id, name=tr.name,
                          generation=gen if tr.state is not MemberState.JOINING else 0,
                          batch=tr.batch, samples_per_s=tr.samples_per_s,
                          state=tr.state.value, joined_at=tr.joined_at,
                          kept=tr.member_id in ring.deferred)
            for _, tr in sorted(ring.tracked.items())]


def as_dict(obj: Any) -> Any:
    """A frozen dataclass as plain data (for logs and tests)."""
    return dataclasses.asdict(obj)
