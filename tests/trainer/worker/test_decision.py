"""What a member does with what it reads (pure): every rule of trainer.worker.decision as a
row of data, as the coordinator's decide() is tested."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from trainer.protocol.messages import JobOutcome, Plan, finished_verdict
from trainer.worker import decision as dn
from trainer.worker.decision import MemberOutcome as O

ME = 7
BASE = dn.MemberView(member_id=ME, current=0, seen=0, was_member=False, notice=False,
                     latest=0)


def _plan(gen: int, members: tuple[int, ...] = (), **kw: object) -> Plan:
    return Plan(gen, members, tuple(f"w{m}" for m in members), **kw)  # type: ignore[arg-type]


def _outcome(action: dn.Action) -> O | None:
    return action.outcome if isinstance(action, dn.Leave) else None


# (what the member knows, the action it takes)
ROWS: list[tuple[str, dn.MemberView, dn.Action]] = [
    ("no new plan: the finished key is read first",
     replace(BASE, latest=3, seen=3), dn.ReadFinished()),
    ("no new plan, not finished: keep waiting",
     replace(BASE, latest=3, seen=3, finished=""), dn.KeepWaiting()),
    ("a newer plan is read",
     replace(BASE, latest=4, seen=3), dn.ReadPlan(4)),
    ("a plan no newer than the generation it is in is not read",
     replace(BASE, latest=4, current=4, seen=2, finished=""), dn.KeepWaiting()),
    ("a plan that names it: form at its rank",
     replace(BASE, latest=4, plan=_plan(4, (3, ME))), dn.Form(_plan(4, (3, ME)), 1)),
    ("a plan that drained it",
     replace(BASE, latest=4, was_member=True, current=3, plan=_plan(4, (3,), drained=(ME,))),
     dn.Leave(O.DRAINED, "drained at generation 4; leaving")),
    ("an unreadable plan is skipped (marked seen)",
     replace(BASE, latest=4, unreadable=True),
     dn.Skip(4, "generation 4: plan unreadable; waiting for the next", logging.ERROR)),
    ("a plan formed before a joiner's turn: wait on",
     replace(BASE, latest=4, plan=_plan(4, (3,))), dn.Skip(4)),
    ("an empty plan with a snapshot to resume does not end a joiner",
     replace(BASE, latest=4, plan=_plan(4, resume='{"step": 10}')), dn.Skip(4)),
]


@pytest.mark.parametrize(("view", "want"), [(v, a) for _, v, a in ROWS],
                         ids=[why for why, _, _ in ROWS])
def test_each_rule_as_data(view: dn.MemberView, want: dn.Action) -> None:
    assert dn.decide_on_plan(view) == want


def test_an_empty_plan_without_a_snapshot_is_a_lost_job_for_everyone() -> None:
    empty = _plan(5, lost=(3,), reason="no member holding the state is left")
    for who in (BASE, replace(BASE, was_member=True, current=4)):
        got = dn.decide_on_plan(replace(who, latest=5, plan=empty))
        assert _outcome(got) is O.LOST and "no member holding" in got.why  # type: ignore


def test_a_dropped_member_reads_the_plans_it_skipped_before_it_rejoins() -> None:
    """A drain and a kill in one step: the newest plan no longer names the member at all.
    Without the look back a drained member would take itself for a dropped one."""
    v = replace(BASE, was_member=True, current=4, latest=7, plan=_plan(7, (1,)))
    assert dn.decide_on_plan(v) == dn.ReadEarlier(5, 6)
    drained = replace(v, earlier=(_plan(5, (1, 2), drained=(ME,)), _plan(6, (1,), lost=(2,))))
    assert _outcome(dn.decide_on_plan(drained)) is O.DRAINED
    lost = replace(v, earlier=(_plan(5, (1, ME)), _plan(6, (1,), lost=(ME,))))
    got = dn.decide_on_plan(lost)
    assert _outcome(got) is O.REFUSED and got.level == logging.WARNING  # type: ignore
    assert _outcome(dn.decide_on_plan(replace(v, earlier=()))) is O.REFUSED  # all deleted
    # the very next generation: nothing in between to read
    nxt = replace(BASE, was_member=True, current=6, latest=7, plan=_plan(7, (1,)))
    assert _outcome(dn.decide_on_plan(nxt)) is O.REFUSED


def test_a_dropped_member_with_a_snapshot_plan_rejoins_to_resume_it() -> None:
    v = replace(BASE, was_member=True, current=3, latest=4, plan=_plan(4, resume='{"s": 1}'))
    assert _outcome(dn.decide_on_plan(v)) is O.REFUSED


@pytest.mark.parametrize(("finished", "was_member", "want", "failure"), [
    ("failed: job x: the job's forward raised", True, O.FAILED, "job x: the job's forward raised"),
    ("failed: boom", False, O.FAILED, "boom"),
    ("lost", True, O.LOST, ""),
    ("done", True, O.FINISHED, ""),
    ("done", False, O.NOTICED, ""),  # a joiner that never trained
])
def test_a_job_that_is_over_ends_the_membership_as_it_ended(finished: str, was_member: bool,
                                                           want: O, failure: str) -> None:
    got = dn.decide_on_plan(replace(BASE, latest=2, seen=2, was_member=was_member,
                                    finished=finished))
    assert isinstance(got, dn.Leave) and got.outcome is want and got.failure == failure


def test_a_joiner_with_a_notice_asks_for_a_drain_and_leaves_a_member_waits_on() -> None:
    joiner = replace(BASE, notice=True, finished="")
    got = dn.decide_on_plan(joiner)
    assert isinstance(got, dn.Leave) and got.outcome is O.NOTICED and got.ask_drain
    member = replace(joiner, was_member=True)
    assert dn.decide_on_plan(member) == dn.KeepWaiting()  # it leaves through a drain plan
    # a new plan comes first, even with a notice: the joiner forms it (and drains later)
    plan = _plan(3, (ME,))
    assert dn.decide_on_plan(replace(joiner, latest=3, plan=plan)) == dn.Form(plan, 0)


def test_the_decision_never_mutates_the_view() -> None:
    v = replace(BASE, was_member=True, current=4, latest=7, plan=_plan(7, (1,)), earlier=())
    before = replace(v)
    dn.decide_on_plan(v)
    assert v == before


@pytest.mark.parametrize(("outcome", "rejoin", "noticed", "want"), [
    (O.REFUSED, True, False, None),  # dropped while unresponsive: join again
    (O.REFUSED, False, False, dn.EXIT_REFUSED),  # --no-rejoin
    (O.REFUSED, True, True, dn.EXIT_REFUSED),  # it was leaving anyway
    (O.FINISHED, True, False, dn.EXIT_OK),
    (O.DRAINED, True, True, dn.EXIT_OK),
    (O.NOTICED, True, True, dn.EXIT_OK),
    (O.LOST, True, False, dn.EXIT_LOST),
    (O.FAILED, True, False, dn.EXIT_JOB),
])
def test_after_a_membership_the_worker_rejoins_or_exits_with_its_code(
        outcome: O, rejoin: bool, noticed: bool, want: int | None) -> None:
    assert dn.after_membership(outcome, rejoin=rejoin, noticed=noticed) == want


def test_a_refused_join_exits_by_how_the_job_ended() -> None:
    assert dn.refused_exit("refused: a different job")[0] == dn.EXIT_REFUSED
    assert dn.refused_exit(finished_verdict(JobOutcome.DONE).decode()) == (dn.EXIT_OK,
                                                                           logging.INFO)
    assert dn.refused_exit(finished_verdict(JobOutcome.LOST).decode())[0] == dn.EXIT_LOST
    assert dn.refused_exit(finished_verdict(JobOutcome.FAILED).decode())[0] == dn.EXIT_JOB
