"""What a member does with what it reads from the coordinator, as pure functions.

Design (torch elastic's ``_RendezvousJoinOp``, as the coordinator's :func:`trainer.control.
decide.decide`): the member skeleton (:class:`trainer.worker.member.Member`) reads the store
into a :class:`MemberView`, calls :func:`decide_on_plan` and executes the action it returns;
an action that asks for more reading (:class:`ReadPlan`, :class:`ReadFinished`,
:class:`ReadEarlier`) comes back with the view completed, so each decision is a function of
data alone and every rule below is tested as a table (``tests/trainer/worker/
test_decision.py``). Nothing here blocks, sleeps or touches the store.

The rules, in order, for a member waiting for a generation:

1. A plan newer than the generation it is in and than any it has read is read first.
   An unreadable one is skipped (only token holders write plans: a bug, not an attack).
2. A plan that names it: **form** it at the rank it gives.
3. A plan that drained it: leave, **drained** (exit 0).
4. An empty plan with no snapshot to resume: every holder of the state was lost, leave,
   **lost**. (An empty plan *with* a snapshot is the coordinator waiting for members: a
   joiner waits on, a dropped member joins again and resumes it.)
5. A plan without it, for a member that was in an earlier generation: when generations were
   published between, it reads them first; one of them drained it (a drain and a kill in
   one step) -> **drained**; else it was dropped (hung, missed a roll call) -> **refused**,
   and the worker joins again as a new member.
6. A plan formed before a joiner's turn: skipped, the joiner waits on.
7. No new plan: the ``finished`` key, when set, says how the job ended (``failed: ...``,
   ``lost``, else done: **finished** for a member, **noticed** for a joiner that never
   trained).
8. A joiner with a notice that never joined a generation asks for a drain and leaves,
   **noticed**; everyone else keeps waiting.

After a membership, :func:`after_membership` says whether the worker joins again or exits,
and with which code; :func:`refused_exit` maps a refused join to an exit code.

Rule for callers: build the view from one read of the store; apply the action, then decide
again with what the action read.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from trainer.protocol.messages import JobOutcome, Plan, verdict_outcome

EXIT_OK, EXIT_JOB, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_LOST = 0, 2, 3, 4, 5


class MemberOutcome(str, enum.Enum):
    """How one membership ended."""

    FINISHED = "finished"  # the job completed
    DRAINED = "drained"  # left with notice at a generation boundary
    REFUSED = "refused"  # dropped while unresponsive: join again as a new member
    LOST = "lost"  # the ring lost every member holding the state
    NOTICED = "noticed"  # a notice came before this worker ever joined a generation
    FAILED = "failed"  # the job's code raised (here or on another member)


EXIT_CODES = {MemberOutcome.FINISHED: EXIT_OK, MemberOutcome.DRAINED: EXIT_OK,
              MemberOutcome.NOTICED: EXIT_OK, MemberOutcome.REFUSED: EXIT_REFUSED,
              MemberOutcome.LOST: EXIT_LOST, MemberOutcome.FAILED: EXIT_JOB}


@dataclass(frozen=True)
class MemberView:
    """What a waiting member knows: itself, and what it read of the store so far.

    ``current``: the generation it is in or last formed (0: none); ``seen``: the newest
    generation whose plan it read; ``latest``: the ``gen/latest`` counter; ``plan``: the
    plan of ``latest`` once read (``unreadable`` when it did not parse); ``earlier``: the
    readable plans of the generations between ``current`` and ``latest``, once read;
    ``finished``: the ``finished`` key (None: not read yet; ``""``: not set).
    """

    member_id: int
    current: int
    seen: int
    was_member: bool
    notice: bool
    latest: int
    plan: Plan | None = None
    unreadable: bool = False
    earlier: tuple[Plan, ...] | None = None
    finished: str | None = None


@dataclass(frozen=True)
class ReadPlan:
    """Read the plan of ``generation`` (``gen/<n>``) into the view."""

    generation: int


@dataclass(frozen=True)
class ReadEarlier:
    """Read the plans of generations ``first .. last`` (those that still parse)."""

    first: int
    last: int


@dataclass(frozen=True)
class ReadFinished:
    """Read the ``finished`` key into the view."""


@dataclass(frozen=True)
class KeepWaiting:
    """Nothing to do yet: poll again shortly."""


@dataclass(frozen=True)
class Skip:
    """Mark ``generation`` seen and wait for a newer one (``why`` is logged at ``level``)."""

    generation: int
    why: str = ""
    level: int = logging.DEBUG


@dataclass(frozen=True)
class Form:
    """Form ``plan`` as ``rank``."""

    plan: Plan
    rank: int


@dataclass(frozen=True)
class Leave:
    """End this membership with ``outcome``; ``why`` is logged at ``level``; ``failure``:
    the job's failure message (an outcome of ``FAILED``); ``ask_drain``: ask the
    coordinator to drain this member first (a joiner that got a notice)."""

    outcome: MemberOutcome
    why: str = ""
    level: int = logging.INFO
    failure: str = ""
    ask_drain: bool = False


Action = ReadPlan | ReadEarlier | ReadFinished | KeepWaiting | Skip | Form | Leave


def decide_on_plan(v: MemberView) -> Action:
    """The next action of a waiting member (the rules in the module docstring). Pure."""
    if v.latest > v.current and v.latest > v.seen:
        if v.unreadable:
            return Skip(v.latest, f"generation {v.latest}: plan unreadable; waiting for the "
                        "next", logging.ERROR)
        if v.plan is None:
            return ReadPlan(v.latest)
        return _on_plan(v, v.plan)
    if v.finished is None:
        return ReadFinished()
    if v.finished:
        return _ended(v.finished, v.was_member)
    if not v.was_member and v.notice:
        return Leave(MemberOutcome.NOTICED, "a notice came before this worker joined a "
                     "generation", ask_drain=True)
    return KeepWaiting()


def _on_plan(v: MemberView, plan: Plan) -> Action:
    rank = plan.rank_of(v.member_id)
    if rank is not None:
        return Form(plan, rank)
    if v.member_id in plan.drained:
        return Leave(MemberOutcome.DRAINED, f"drained at generation {plan.generation}; "
                     "leaving")
    if not plan.members and not plan.resume:
        return Leave(MemberOutcome.LOST, "the ring lost every member holding the state: "
                     f"{plan.reason}", logging.ERROR)
    if v.was_member:
        if v.earlier is None and plan.generation - v.current > 1:
            return ReadEarlier(v.current + 1, plan.generation - 1)
        for p in v.earlier or ():
            if v.member_id in p.drained:
                return Leave(MemberOutcome.DRAINED, f"drained at generation {p.generation}; "
                             "leaving")
        return Leave(MemberOutcome.REFUSED, f"refused: dropped from the ring at generation "
                     f"{plan.generation} ({plan.reason})", logging.WARNING)
    return Skip(plan.generation)  # formed before my turn (or waiting for members): wait on


def _ended(how: str, was_member: bool) -> Leave:
    """The job is over (``finished`` is set): how, for this member."""
    if how.startswith("failed"):
        failure = how.removeprefix("failed: ")
        return Leave(MemberOutcome.FAILED, f"the job failed: {failure}", logging.ERROR,
                     failure=failure)
    if how == "lost":
        return Leave(MemberOutcome.LOST, "the job was lost", logging.ERROR)
    return Leave(MemberOutcome.FINISHED if was_member else MemberOutcome.NOTICED,
                 "the job is over")


def after_membership(outcome: MemberOutcome, *, rejoin: bool, noticed: bool) -> int | None:
    """What the worker does once a membership ended: None to join again as a new member (it
    was dropped while unresponsive, may rejoin and has no notice), else its exit code."""
    if outcome is MemberOutcome.REFUSED and rejoin and not noticed:
        return None
    return EXIT_CODES[outcome]


def refused_exit(verdict: str) -> tuple[int, int]:
    """``(exit code, log level)`` for a join the coordinator refused with ``verdict``: a job
    already over exits 0 unless it ended lost or failed (a late joiner never turns a lost
    job into a success); any other refusal exits ``EXIT_REFUSED``."""
    ended = verdict_outcome(verdict)
    if ended is None:
        return EXIT_REFUSED, logging.ERROR
    code = {JobOutcome.LOST: EXIT_LOST, JobOutcome.FAILED: EXIT_JOB}.get(ended, EXIT_OK)
    return code, logging.INFO if code == EXIT_OK else logging.ERROR
