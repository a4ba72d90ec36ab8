"""How the next generation is made: pure planning rules over
:class:`trainer.protocol.messages.Plan`.

Design: :func:`next_plan` turns the current plan, the admitted joiners and the members that
leave (with notice or without) into the next plan; :func:`drains_now` says which drains may be
applied now (never one that leaves no member holding the state: the last holders stay until
a joiner has received it, or until their notice window ends and they die);
:func:`instance_of` groups members of one instance (one worker per GPU) so they drain
together; :func:`reform_or_drop` bounds the re-forms
of an unchanged set whose generation keeps breaking; :func:`choose_backend` picks the
collectives' backend from the members' devices. Data in, data out: no store, no clock.

Rule for callers: survivors keep their relative order (rank 0 stays the oldest member);
never mutate a plan, make the next one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from trainer.protocol.messages import Plan, Report, member_key

BACKOFF_S = 0.25  # the first wait between generations that keep failing to form
MAX_BACKOFF_S = 8.0  # the longest (active time)


def choose_backend(devices: Sequence[str]) -> str:
    """NCCL when every member computes on a GPU of its own, else gloo (pure).

    NCCL refuses two ranks on one GPU and cannot reach a CPU member; gloo reduces CUDA
    tensors too, through host memory.
    """
    if devices and all(d.startswith("cuda:") for d in devices) and len(set(devices)) == len(
            devices):
        return "nccl"
    return "gloo"


def instance_of(name: str) -> str:
    """The instance a member's name belongs to: ``"i-0abc/3"`` -> ``"i-0abc"`` (one worker per
    GPU), ``"i-0abc"`` -> itself (pure). The trainer's side of
    :func:`provisioner.drivers.identity.instance_of` (the same rule: a last part of digits
    after a slash is the GPU index); a test holds the two to the same answers."""
    head, slash, tail = name.rpartition("/")
    if slash and head and tail.isascii() and tail.isdigit():
        return head
    return name


def drains_now(members: Sequence[int], holders: Collection[int], draining: Collection[int],
               dead: Collection[int] = ()) -> tuple[list[int], list[int]]:
    """Split the drains of ``members`` into ``(apply, defer)`` (pure).

    A drain is applied when some member that stays (neither draining nor dead) holds the
    state, or when no member holds any yet (nothing can be lost). Otherwise the draining
    members that hold it are deferred: they keep training (a joiner receives the state from
    them in the next generation, after which their drains apply) until their notice window
    ends; drains of members that hold nothing apply at once. Order follows ``members``.
    """
    leaving = [m for m in members if m in set(draining)]
    staying = [m for m in members if m not in set(draining) and m not in set(dead)]
    if not holders or any(m in holders for m in staying):
        return leaving, []
    defer = [m for m in leaving if m in holders and m not in set(dead)]
    return [m for m in leaving if m not in set(defer)], defer


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
    job: str = "",
) -> Plan | None:
    """The next generation, or None when nothing changes.

    ``current``: the newest published plan (None before the first). ``ready``: admitted
    joiners, oldest first. ``draining``: members leaving with notice; ``dead``: members to
    drop without notice. Survivors keep their relative order (rank 0 stays the oldest
    member); joiners are appended. The first generation waits for ``initial_world`` joiners.
    When no member holding the state survives, the plan has no members (joiners are not
    admitted into it): the caller resumes from a snapshot or ends the job.
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
            job=job,
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
            reason="no member holding the state is left",
            job=current.job,
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
        job=current.job,
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


def proven_holders(reports: list[Report]) -> frozenset[int]:
    """The members whose reports prove they hold the ring's state (pure): they hold one
    (``holds``: not fresh, no failed resume) and, where reports at the same step carry
    digests, theirs is the one most of those share (a tie: none of them). Steps are not compared across members:
    a formed ring commits in lockstep, but its members report at their own moments while it
    trains on (they differ by several steps; the state transfer of the next generation
    agrees on the newest). The others are not adopted as holders: a generation of them alone
    would break forever (issue 30.3: it did, 1,092 times)."""
    holding = [r for r in reports if r.holds]
    by_step: dict[int, list[str]] = {}
    for r in holding:
        if r.digest:
            by_step.setdefault(r.step, []).append(r.digest)
    common: dict[int, str | None] = {}
    for step, ds in by_step.items():
        top = Counter(ds).most_common(2)  # a tie proves nobody: honest members agree, so
        common[step] = top[0][0] if len(top) == 1 or top[0][1] > top[1][1] else None
    return frozenset(r.member_id for r in holding  # one of them forged or diverged
                     if not r.digest or r.digest == common.get(r.step))


def backoff_s(failures: int) -> float:
    """How long a roll call waits at least before the next generation, after ``failures``
    recoveries in a row with no generation formed (pure): 0 for the first, then
    ``BACKOFF_S`` doubling up to ``MAX_BACKOFF_S``. A generation that keeps breaking costs
    a bounded number of attempts per minute, not hundreds."""
    if failures < 1:
        return 0.0
    return min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (failures - 1))
