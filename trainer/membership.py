"""Membership of the elastic ring: generations, joins, drains, losses and the token check.

Design: the coordinator is the only writer of generations. A generation is a :class:`Plan`:
an ordered tuple of member ids (the order is the rank order of that generation's process
group), plus who left it and why. This module is the pure half of the protocol: the key
names used over the ``TCPStore``, the plan type and its JSON form, the HMAC challenge, and
:func:`next_plan`, which decides the next generation from data and returns data.

Protocol (all keys live in the coordinator's ``TCPStore``):

* ``ids``: counter; a joiner takes a fresh member id with ``add("ids", 1)``.
* ``join/<id>/hello`` (joiner) -> ``join/<id>/nonce`` (coordinator) -> ``join/<id>/proof``
  (joiner: HMAC-SHA256 of the token over id, name and nonce) -> ``join/<id>/verdict``.
  The token never travels; a wrong proof is refused and logged, nothing else changes.
* ``hb/<id>``: heartbeat counter, bumped by a worker thread; the coordinator watches it
  change with its own clock (no clock agreement needed).
* ``drain/<id>``: a worker asks to leave at the next step boundary (SIGTERM, cloud notice).
* ``gen/latest``: counter of the newest published generation; ``gen/<n>``: its plan (JSON).
  Members read ``gen/latest`` before each step's reduction and carry what they saw inside
  the reduction, so every member switches after the same step.
* ``broken/<n>``: counter; a member whose collective failed (or the coordinator, when a
  member's heartbeat stops) bumps it; every member of generation ``n`` then abandons its
  collective, and the coordinator takes a roll call before publishing ``n + 1``.
* ``forming/<n>/<id>``: a member starts forming generation ``n``; ``formed/<n>/<id>``: its
  report after forming it (checksum of its parameters, step, discarded steps). A member
  that answers roll calls but never forms is found by these (:func:`reform_or_drop`).
* ``stats``, ``speed/<id>``, ``done/<id>``, ``finished``: progress reports; the counters
  ``drains``, ``dones`` and ``formedn/<n>`` tell the coordinator when to look.

Rule for callers: never assume a static rank or world size; ranks are positions in the
current plan only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field

# -- key names ------------------------------------------------------------------------------

IDS = "ids"
LATEST = "gen/latest"
STATS = "stats"
FINISHED = "finished"


def k_hello(member_id: int) -> str:
    return f"join/{member_id}/hello"


def k_nonce(member_id: int) -> str:
    return f"join/{member_id}/nonce"


def k_proof(member_id: int) -> str:
    return f"join/{member_id}/proof"


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


def k_speed(member_id: int) -> str:
    return f"speed/{member_id}"


def k_done(member_id: int) -> str:
    return f"done/{member_id}"


# -- token check ----------------------------------------------------------------------------


def make_proof(token: bytes, member_id: int, name: str, nonce: str) -> str:
    """HMAC-SHA256 of ``token`` over the member id, its name and the coordinator's nonce.

    Returns the hex digest. The token itself never leaves the process.
    """
    msg = f"spotring-join|{member_id}|{name}|{nonce}".encode()
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


def check_proof(token: bytes, member_id: int, name: str, nonce: str, proof: str) -> bool:
    """True when ``proof`` is :func:`make_proof` of the same inputs (constant-time compare)."""
    return hmac.compare_digest(make_proof(token, member_id, name, nonce), proof)


# -- plans ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One generation of the ring.

    ``members``: member ids in rank order; ``names``: their worker names (same order);
    ``joined``: ids new in this generation (they receive the state); ``drained``: ids that
    left with notice; ``lost``: ids dropped without notice (killed, hung, failed roll call);
    ``priors``: member key -> samples/s measured by a joiner's profiling steps.
    """

    generation: int
    members: tuple[int, ...]
    names: tuple[str, ...]
    joined: tuple[int, ...] = ()
    drained: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    priors: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""

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
    def from_json(cls, text: str | bytes) -> Plan:
        d = json.loads(text)
        return cls(
            generation=int(d["generation"]),
            members=tuple(d["members"]),
            names=tuple(d["names"]),
            joined=tuple(d.get("joined", ())),
            drained=tuple(d.get("drained", ())),
            lost=tuple(d.get("lost", ())),
            priors={str(k): float(v) for k, v in d.get("priors", {}).items()},
            reason=str(d.get("reason", "")),
        )


def member_key(name: str, member_id: int) -> str:
    """The planner's key of a member: its name and id (a rejoin gets a new id, a new key)."""
    return f"{name}/{member_id}"


@dataclass(frozen=True)
class Joiner:
    """An admitted joiner waiting for a generation: id, name, profiled samples/s."""

    member_id: int
    name: str
    samples_per_s: float = 0.0


def next_plan(
    current: Plan | None,
    ready: Sequence[Joiner],
    draining: Sequence[int],
    dead: Sequence[int],
    *,
    initial_world: int = 1,
    reason: str = "",
) -> Plan | None:
    """The next generation, or None when nothing changes.

    ``current``: the newest published plan (None before the first). ``ready``: admitted
    joiners, oldest first. ``draining``: members leaving with notice; ``dead``: members to
    drop without notice. Survivors keep their relative order (rank 0 stays the oldest
    member); joiners are appended. The first generation waits for ``initial_world`` joiners.
    When no member holding the state survives, the plan has no members: state lives only in
    members, so the job stops (joiners are not admitted into an empty ring).
    """
    if current is None:
        if len(ready) < max(1, initial_world):
            return None
        return Plan(
            generation=1,
            members=tuple(j.member_id for j in ready),
            names=tuple(j.name for j in ready),
            joined=tuple(j.member_id for j in ready),
            priors={member_key(j.name, j.member_id): j.samples_per_s for j in ready},
            reason=reason or "first generation",
        )
    gone_drain = [m for m in current.members if m in set(draining)]
    gone_dead = [m for m in current.members if m in set(dead) and m not in set(draining)]
    if not ready and not gone_drain and not gone_dead:
        return None
    keep = [
        (m, n)
        for m, n in zip(current.members, current.names, strict=True)
        if m not in set(gone_drain) and m not in set(gone_dead)
    ]
    if not keep:
        return Plan(
            generation=current.generation + 1,
            members=(),
            names=(),
            drained=tuple(gone_drain),
            lost=tuple(gone_dead),
            reason="no member holding the state is left; the job stops (no checkpoints)",
        )
    members = [m for m, _ in keep] + [j.member_id for j in ready]
    names = [n for _, n in keep] + [j.name for j in ready]
    return Plan(
        generation=current.generation + 1,
        members=tuple(members),
        names=tuple(names),
        joined=tuple(j.member_id for j in ready),
        drained=tuple(gone_drain),
        lost=tuple(gone_dead),
        priors={member_key(j.name, j.member_id): j.samples_per_s for j in ready},
        reason=reason,
    )


MAX_SAME_REFORMS = 3  # re-forms of one unchanged set, with no step between, before dropping


@dataclass(frozen=True)
class Reforms:
    """Recoveries in a row that re-formed the same members because every one of them
    answered the roll call, with no step committed in between.

    ``members``: the set re-formed; ``count``: how many times in a row; ``step``: the ring's
    newest committed step at the last one.
    """

    members: tuple[int, ...] = ()
    count: int = 0
    step: int = -1


def reform_or_drop(
    history: Reforms,
    plan: Plan,
    started: Collection[int],
    formed: Collection[int],
    step: int,
    *,
    limit: int = MAX_SAME_REFORMS,
) -> tuple[Reforms, tuple[int, ...]]:
    """Decide a recovery of ``plan`` in which every member answered the roll call and
    nothing else changes (the same set would form the next generation again).

    ``started`` / ``formed``: the members that reported starting / completing the forming
    of ``plan``'s generation; ``step``: the ring's newest committed step. A re-form counts
    one more when it is the same set as the last one and no step was committed since;
    otherwise the count starts again at 1. Once the count passes ``limit``, the members
    that answer the roll call but never complete forming are dropped (they must join again
    as new members) and the count starts over: those that never even started forming, or
    else those that started but never completed while others did. When that singles out
    nobody, or everybody (nothing tells who is at fault), nobody is dropped (the caller
    re-forms again and logs it).

    Returns ``(history, drop)``: the new history and the member ids to drop (``()``: re-form
    the same set). Never mutates its inputs.
    """
    if limit < 1:
        raise ValueError(f"limit: {limit}; need at least 1 re-form before dropping")
    members = tuple(sorted(plan.members))
    same = history.members == members and history.step == step
    count = history.count + 1 if same else 1
    if count <= limit:
        return Reforms(members, count, step), ()
    drop = tuple(m for m in plan.members if m not in set(started))
    if not drop and formed:
        drop = tuple(m for m in plan.members if m not in set(formed))
    if not drop or len(drop) == len(plan.members):
        return Reforms(members, count, step), ()
    return Reforms(), drop


@dataclass(frozen=True)
class MemberInfo:
    """What :meth:`Coordinator.members` reports for one member or admitted joiner.

    ``state``: ``joining`` (admitted, waiting for a generation), ``active``, ``draining``.
    ``batch``: its local batch at the last reported step (0 when unknown).
    """

    id: int
    name: str
    generation: int
    batch: int
    samples_per_s: float
    state: str
    joined_at: float
