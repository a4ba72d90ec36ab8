"""Membership of the elastic ring: every wire key and message, the states, and the plan.

Design: the coordinator is the only writer of generations. A generation is a :class:`Plan`:
an ordered tuple of member ids (the order is the rank order of that generation's process
group), plus who left it and why. This module is the vocabulary of the protocol: the key
names used over the coordinator's control store (:mod:`trainer.protocol.store`, reachable only by
token holders), one parser per message that validates it (a message that does not parse is
:class:`Malformed`: the reader ignores and counts it, it is never fatal), member states and
outcomes as enums, and the plan. The planning rules (:mod:`trainer.control.plans`) and the decision
of a whole coordinator tick (:func:`trainer.control.decide.decide`) are built on it.

Protocol (all keys live in the coordinator's store):

* ``ids``: counter; a joiner takes a fresh member id with ``add("ids", 1)``.
* ``join/<id>/hello`` (:class:`Hello`: name, profiled samples/s, job fingerprint) ->
  ``join/<id>/verdict`` (``ok``, ``refused: ...`` or ``finished: ...``). The connection that
  carries it has already proved the job token (:mod:`trainer.protocol.admission`).
* ``hb/<id>``: heartbeat counter, bumped by a worker thread; the coordinator watches it
  change with its own clock (no clock agreement needed) and its own ticks (a pause of the
  coordinator itself is never taken for the death of its members).
* ``drain/<id>``: a worker asks to leave at the next step boundary (SIGTERM, cloud notice);
  the counter ``drains`` tells the coordinator to look.
* ``gen/latest``: counter of the newest published generation; ``gen/<n>``: its plan (JSON).
  Members read ``gen/latest`` before each step's reduction and carry what they saw inside
  the reduction, so every member switches after the same step.
* ``broken/<n>``: counter; a member whose collective failed (or the coordinator, when a
  member's heartbeat stops) bumps it; every member of generation ``n`` then abandons its
  collective, and the coordinator takes a roll call before publishing ``n + 1``.
* ``forming/<n>/<id>``: a member starts forming generation ``n``; ``formed/<n>/<id>``
  (:class:`Formed`) its report after forming it, counted by ``formedn/<n>``.
* ``stats`` (:class:`ProgressReport`, rank 0's report), ``speed/<id>`` (:class:`Speed`),
  ``done/<id>`` (:class:`Done`, counter ``dones``), ``error/<id>`` (:class:`JobFailure`: the
  user's code raised; counter ``errors``) and ``finished`` (the coordinator's
  :class:`JobOutcome`).
* ``snapshot/latest``, ``snapshot/all`` and ``snapshot/config``: the newest durable snapshot,
  every usable one (newest first) and when rank 0 takes them (:mod:`trainer.state.snapshot`);
  ``snapshot/now``: counter, the coordinator asks rank 0 for one at once;
  ``snapshot/failed/<name>``: a member could not resume from that snapshot, and why.
* ``coord/incarnation`` changes when the coordinator is restarted; every member then
  appends a :class:`Report` line to ``reports`` so the new coordinator adopts the ring
  without stopping it.

Every parser goes through :func:`parse_json`, which bounds size and nesting depth before
decoding and turns any failure (``RecursionError`` included) into :class:`Malformed`.

Rule for callers: never assume a static rank or world size; ranks are positions in the
current plan only. Parse every value read from the store with its message's ``parse``.
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.errors import Malformed

# -- key names ------------------------------------------------------------------------------

IDS = "ids"
LATEST = "gen/latest"
STATS = "stats"
FINISHED = "finished"
EXPORT = "export"  # counter: the daemon asks rank 0 to write the trained model now
SNAPSHOT_NOW = "snapshot/now"  # counter: the coordinator asks rank 0 for a snapshot now (a
# notice would leave no member holding the state: the final snapshot)
DRAINS, DONES, ERRORS = "drains", "dones", "errors"
INCARNATION = "coord/incarnation"  # a fresh value per coordinator process: a change means
# the coordinator was restarted and the members must report themselves (REPORTS)
REPORTS = "reports"  # members append one Report line each to a restarted coordinator
SNAPSHOT = "snapshot/latest"  # the newest complete snapshot's manifest (JSON)
SNAPSHOTS = "snapshot/all"  # every usable snapshot's manifest, newest first (a JSON list)
SNAPSHOT_CONFIG = "snapshot/config"  # {"every_s", "every_steps"[, "direct"]}: when rank 0 takes
# them (and, "direct", the store it writes to itself while the coordinator is away)


def k_hello(member_id: int) -> str:
    return f"join/{member_id}/hello"


def k_verdict(member_id: int) -> str:
    return f"join/{member_id}/verdict"


def k_heartbeat(member_id: int) -> str:
    return f"hb/{member_id}"


def k_drain(member_id: int) -> str:
    return f"drain/{member_id}"


def k_plan(generation: int) -> str:
    return f"gen/{generation}"


def k_broken(generation: int) -> str:
    return f"broken/{generation}"


def k_forming(generation: int, member_id: int) -> str:
    return f"forming/{generation}/{member_id}"


def k_formed(generation: int, member_id: int) -> str:
    return f"formed/{generation}/{member_id}"


def k_formed_count(generation: int) -> str:
    return f"formedn/{generation}"


def k_speed(member_id: int) -> str:
    return f"speed/{member_id}"


def k_resume_failed(snapshot_name: str) -> str:
    return f"snapshot/failed/{snapshot_name}"


def k_done(member_id: int) -> str:
    return f"done/{member_id}"


def k_error(member_id: int) -> str:
    return f"error/{member_id}"


def group_prefix(generation: int) -> str:
    """The store prefix of generation ``generation``'s process-group rendezvous."""
    return f"g{generation}/"


# -- states and outcomes ----------------------------------------------------------------------


class MemberState(str, enum.Enum):
    """Where a tracked member stands (a str, so it prints and serialises as its value)."""

    JOINING = "joining"  # admitted, waiting for a generation
    ACTIVE = "active"
    DRAINING = "draining"  # asked to leave at the next step boundary


class JobOutcome(str, enum.Enum):
    """How the job ended (``finished`` key), or that it has not."""

    RUNNING = "running"
    DONE = "done"  # every member finished the last epoch
    LOST = "lost"  # no member holding the state is left and no snapshot to resume from
    FAILED = "failed"  # the user's code raised (the same on every member)


def finished_verdict(outcome: JobOutcome) -> bytes:
    """The join verdict for a job that is over, saying how it ended."""
    return f"finished: the job is over ({outcome.value})".encode()


def verdict_outcome(verdict: str) -> JobOutcome | None:
    """How the job ended, from a :func:`finished_verdict` (None: not one, or no outcome)."""
    if not verdict.startswith("finished:"):
        return None
    _, _, tail = verdict.rpartition("(")
    try:
        return JobOutcome(tail.rstrip(")"))
    except ValueError:
        return JobOutcome.DONE  # a coordinator that did not say: the job was over


class EventKind(str, enum.Enum):
    """Kinds of the coordinator's membership events."""

    JOIN = "join"
    REFUSED = "refused"
    DRAIN = "drain"
    LEAVE = "leave"
    LOST = "lost"
    GENERATION = "generation"  # a plan was published
    FORMED = "formed"  # every member reported a generation formed (``data``: checksums ...)
    FINISHED = "finished"
    JOB_ERROR = "job-error"
    MALFORMED = "malformed"
    ADOPTED = "adopted"  # a restarted coordinator took over the running ring
    RESUMED = "resumed"  # a generation resumed from a durable snapshot


# -- messages -----------------------------------------------------------------------------------


class _Message:
    """A message of the protocol: a frozen dataclass that writes itself as JSON."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=dict)  # type: ignore[call-overload]


MAX_MESSAGE = 1 << 20  # bytes: no message of the protocol comes near it
MAX_NESTING = 16  # no message of the protocol nests deeper
MAX_REPORTS = 4096  # report lines one restarted coordinator reads
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = {ord(c): None for c in map(chr, range(0x80)) if c not in "[]{}"}


def nesting(text: str) -> int:
    """How deep ``text``'s JSON brackets nest, outside strings (C-speed scans; pure)."""
    if text.count("[") + text.count("{") <= 1:
        return text.count("[") + text.count("{")
    marks = _STRING.sub("", text).translate(_BRACKETS)
    marks = "".join(c for c in marks if c in "[]{}") if not marks.isascii() else marks
    return max(itertools.accumulate(1 if c in "[{" else -1 for c in marks), default=0)


def parse_json(raw: bytes | bytearray | memoryview | str | None, what: str, *,
               max_bytes: int = MAX_MESSAGE, max_depth: int = MAX_NESTING) -> Any:
    """Decode JSON read from the network or a disk, bounded: at most ``max_bytes`` and
    ``max_depth`` levels of nesting, checked before decoding. Raises :class:`Malformed` for
    anything else (too big, too deep, truncated, not UTF-8, not JSON), never another error."""
    if raw is None:
        raise Malformed(f"{what}: missing")
    if not isinstance(raw, (bytes, bytearray, memoryview, str)):
        raise Malformed(f"{what}: not text")
    if len(raw) > max_bytes:
        raise Malformed(f"{what}: {len(raw)} bytes, more than {max_bytes}")
    try:
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
    except UnicodeError:
        raise Malformed(f"{what}: not UTF-8") from None
    if nesting(text) > max_depth:
        raise Malformed(f"{what}: nested deeper than {max_depth}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError, TypeError):
        raise Malformed(f"{what}: not JSON") from None


def _obj(raw: bytes | str, what: str) -> dict[str, Any]:
    d = parse_json(raw, what)
    if not isinstance(d, dict):
        raise Malformed(f"{what}: not a JSON object")
    return d


def _int(d: Mapping[str, Any], k: str, what: str, *, default: int | None = None,
         low: int = 0) -> int:
    v = d.get(k, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low or v >= 1 << 63:
        raise Malformed(f"{what}.{k}: expected an integer from {low} to 2**63-1")
    return v


def _num(d: Mapping[str, Any], k: str, what: str, *, default: float | None = None,
         allow_nan: bool = False) -> float:
    v = d.get(k, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Malformed(f"{what}.{k}: expected a number")
    try:
        v = float(v)
    except OverflowError:  # an integer of 400 digits
        raise Malformed(f"{what}.{k}: expected a finite number") from None
    if math.isinf(v) or (math.isnan(v) and not allow_nan):
        raise Malformed(f"{what}.{k}={v!r}: expected a finite number")
    return v


def _str(d: Mapping[str, Any], k: str, what: str, *, default: str | None = None,
         limit: int = 256) -> str:
    v = d.get(k, default)
    if not isinstance(v, str) or len(v) > limit:
        raise Malformed(f"{what}.{k}: expected a string of at most {limit} characters")
    return v


def _metrics(d: Any, what: str) -> dict[str, float]:
    if d is None:
        return {}
    if not isinstance(d, dict) or len(d) > 64:
        raise Malformed(f"{what}.metrics: expected an object of at most 64 numbers")
    out = {}
    for k, v in d.items():
        if not isinstance(k, str) or len(k) > 64:
            raise Malformed(f"{what}.metrics: bad name {k!r}")
        out[k] = _num(d, k, f"{what}.metrics", allow_nan=True)
    return out


@dataclass(frozen=True)
class Hello(_Message):
    """A joiner's introduction: its name, profiled samples/s, job fingerprint and device
    (``cpu`` or ``cuda:<GPU UUID>``, see :mod:`trainer.worker.devices`)."""

    name: str
    prior: float = 0.0
    job: str = ""
    device: str = "cpu"
    zone: str = ""


    @classmethod
    def parse(cls, raw: bytes | str) -> Hello:
        d = _obj(raw, "hello")
        name = _str(d, "name", "hello")
        if not name:
            raise Malformed("hello.name: empty")
        prior = _num(d, "prior", "hello", default=0.0)
        device = _str(d, "device", "hello", default="cpu", limit=128)
        if device != "cpu" and not device.startswith("cuda:"):
            raise Malformed(f"hello.device={device!r}: expected cpu or cuda:<id>")
        return cls(name, max(0.0, prior), _str(d, "job", "hello", default=""), device,
                   _str(d, "zone", "hello", default="", limit=128))


@dataclass(frozen=True)
class Formed(_Message):
    """A member's report after forming a generation (``checksum`` of its whole state)."""

    checksum: str
    step: int
    discarded: int = 0
    src: int = 0
    bytes: int = 0
    switch_ms: float = 0.0


    @classmethod
    def parse(cls, raw: bytes | str) -> Formed:
        d = _obj(raw, "formed")
        return cls(_str(d, "checksum", "formed", limit=128), _int(d, "step", "formed"),
                   _int(d, "discarded", "formed", default=0),
                   _int(d, "src", "formed", default=0), _int(d, "bytes", "formed", default=0),
                   _num(d, "switch_ms", "formed", default=0.0))


@dataclass(frozen=True)
class ProgressReport(_Message):
    """Rank 0's report of the ring's progress (``stats``)."""

    generation: int = 0
    step: int = 0
    epoch: int = 0
    samples_done: int = 0
    world: int = 0
    loss: float | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    metrics_step: int = -1  # the step of the last evaluation (-1: none yet)


    @classmethod
    def parse(cls, raw: bytes | str) -> Progress:
        d = _obj(raw, "stats")
        loss = d.get("loss")
        return cls(_int(d, "generation", "stats", default=0), _int(d, "step", "stats", default=0),
                   _int(d, "epoch", "stats", default=0),
                   _int(d, "samples_done", "stats", default=0),
                   _int(d, "world", "stats", default=0),
                   None if loss is None else _num(d, "loss", "stats", allow_nan=True),
                   _metrics(d.get("metrics"), "stats"),
                   _int(d, "metrics_step", "stats", default=-1, low=-1))


@dataclass(frozen=True)
class Speed(_Message):
    """A member's measured samples/s and its local batch."""

    samples_per_s: float = 0.0
    batch: int = 0


    @classmethod
    def parse(cls, raw: bytes | str) -> Speed:
        d = _obj(raw, "speed")
        return cls(max(0.0, _num(d, "samples_per_s", "speed", default=0.0)),
                   _int(d, "batch", "speed", default=0))


@dataclass(frozen=True)
class Done(_Message):
    """A member's report that it finished the last epoch."""

    checksum: str
    step: int
    metrics: Mapping[str, float] = field(default_factory=dict)


    @classmethod
    def parse(cls, raw: bytes | str) -> Done:
        d = _obj(raw, "done")
        return cls(_str(d, "checksum", "done", limit=128), _int(d, "step", "done"),
                   _metrics(d.get("metrics"), "done"))


@dataclass(frozen=True)
class JobFailure(_Message):
    """The user's code raised on a member: where, and the one-line message with the fix."""

    step: int
    message: str


    @classmethod
    def parse(cls, raw: bytes | str) -> JobFailure:
        d = _obj(raw, "error")
        return cls(_int(d, "step", "error", default=0),
                   _str(d, "message", "error", limit=2000))


@dataclass(frozen=True)
class Report(_Message):
    """A member's account of itself to a restarted coordinator: who it is and the plan it
    runs (``plan``: its JSON, empty for an admitted joiner not yet in a generation)."""

    member_id: int
    name: str
    plan: str = ""
    step: int = 0
    device: str = "cpu"
    job: str = ""
    prior: float = 0.0
    draining: str = ""
    formed: bool = True  # False: its group broke (or never formed) while nobody coordinated
    zone: str = ""
    holds: bool = True  # it holds the training state (False: fresh, or its resume failed)
    digest: str = ""  # a digest of the state it holds at ``step`` ("" when not computed)


    @classmethod
    def parse(cls, raw: bytes | str) -> Report:
        d = _obj(raw, "report")
        r = cls(_int(d, "member_id", "report", low=1), _str(d, "name", "report"),
                _str(d, "plan", "report", default="", limit=1 << 20),
                _int(d, "step", "report", default=0),
                _str(d, "device", "report", default="cpu", limit=128),
                _str(d, "job", "report", default="", limit=128),
                max(0.0, _num(d, "prior", "report", default=0.0)),
                _str(d, "draining", "report", default="", limit=512),
                d.get("formed", True) is True, _str(d, "zone", "report", default="", limit=128),
                d.get("holds", True) is True, _str(d, "digest", "report", default="", limit=128))
        if r.plan:
            Plan.from_json(r.plan)  # validated here: a report with a bad plan is malformed
        return r


def parse_reports(raw: bytes | None) -> tuple[list[Report], int]:
    """The report lines appended to ``reports``: ``(reports, malformed lines)``."""
    out: list[Report] = []
    bad = 0
    lines = (raw or b"").splitlines()
    if len(lines) > MAX_REPORTS:  # a flood of lines: the newest are the members' own
        bad += len(lines) - MAX_REPORTS
        lines = lines[-MAX_REPORTS:]
    for line in lines:
        if not line.strip():
            continue
        try:
            out.append(Report.parse(line))
        except Malformed:
            bad += 1
    return out, bad


def parse_drain(raw: bytes | str) -> str:
    """A drain request's reason (any short text)."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise Malformed("drain: not UTF-8") from None
    if len(text) > 512:
        raise Malformed("drain: reason longer than 512 characters")
    return text or "drain requested"


# -- plans ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One generation of the ring.

    ``members``: member ids in rank order; ``names``: their worker names (same order);
    ``joined``: ids new in this generation (they receive the state); ``drained``: ids that
    left with notice; ``lost``: ids dropped without notice (killed, hung, failed roll call);
    ``priors``: member key -> samples/s measured by a joiner's profiling steps; ``job``: the
    job fingerprint every member's state must match (:func:`trainer.state.codec.fingerprint`);
    ``backend``: the collectives' backend (:func:`choose_backend`); ``fresh_start``: no
    state exists yet (no generation has formed): every member builds it, rank 0's counts;
    ``resume``: the manifest (JSON) of the durable snapshot rank 0 loads, when no member
    holds the state (every holder was lost at once); ``zones``: each member's zone.
    """

    generation: int
    members: tuple[int, ...]
    names: tuple[str, ...]
    joined: tuple[int, ...] = ()
    drained: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    priors: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""
    job: str = ""
    backend: str = "gloo"
    fresh_start: bool = False
    resume: str = ""
    zones: tuple[str, ...] = ()  # each member's zone (same order as members; "" unknown)

    def rank_of(self, member_id: int) -> int | None:
        """This member's rank in the generation, or None when it is not a member."""
        try:
            return self.members.index(member_id)
        except ValueError:
            return None

    def keys(self) -> list[str]:
        """Per-member keys used by the batch planner, in rank order (``name/id``)."""
        return [member_key(n, i) for n, i in zip(self.names, self.members, strict=True)]

    def to_json(self) -> str:
        d = asdict(self)
        d["priors"] = dict(self.priors)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: bytes | str) -> Plan:
        """Parse and validate a plan. Raises :class:`Malformed`."""
        d = _obj(text, "plan")

        def ids(k: str) -> tuple[int, ...]:
            v = d.get(k, [])
            if not isinstance(v, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in v):
                raise Malformed(f"plan.{k}: expected a list of member ids")
            return tuple(v)

        names = d.get("names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise Malformed("plan.names: expected a list of names")
        members = ids("members")
        if len(names) != len(members) or len(set(members)) != len(members):
            raise Malformed("plan: members and names differ in length, or a member repeats")
        priors = d.get("priors", {})
        if not isinstance(priors, dict):
            raise Malformed("plan.priors: expected an object")
        return cls(generation=_int(d, "generation", "plan", low=1), members=members,
                   names=tuple(names), joined=ids("joined"), drained=ids("drained"),
                   lost=ids("lost"),
                   priors={str(k): _num(priors, k, "plan.priors") for k in priors},
                   reason=_str(d, "reason", "plan", default="", limit=2000),
                   job=_str(d, "job", "plan", default="", limit=128),
                   backend=_backend(d), fresh_start=d.get("fresh_start") is True,
                   resume=_str(d, "resume", "plan", default="", limit=4096),
                   zones=_zones(d, len(members)))


def _zones(d: Mapping[str, Any], n: int) -> tuple[str, ...]:
    z = d.get("zones", [])
    if not isinstance(z, list) or not all(isinstance(x, str) and len(x) <= 128 for x in z) or (
            z and len(z) != n):
        raise Malformed("plan.zones: expected one zone name per member")
    return tuple(z)


def _backend(d: Mapping[str, Any]) -> str:
    b = d.get("backend", "gloo")
    if b not in ("gloo", "nccl"):
        raise Malformed(f"plan.backend={b!r}: expected gloo or nccl")
    return str(b)


def member_key(name: str, member_id: int) -> str:
    """The planner's key of a member: its name and id (a rejoin gets a new id, a new key)."""
    return f"{name}/{member_id}"


@dataclass(frozen=True)
class MemberInfo:
    """What :meth:`Coordinator.members` reports for one member or admitted joiner.

    ``state``: a :class:`MemberState` value. ``batch``: its local batch at the last reported
    step (0 when unknown). ``kept``: it is draining, but the ring keeps it because no other
    member holds the state yet (it leaves once a joiner does, or when it dies).
    """

    id: int
    name: str
    generation: int
    batch: int
    samples_per_s: float
    state: str
    joined_at: float
    kept: bool = False
