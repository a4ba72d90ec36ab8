"""Pure membership vocabulary: next generation, message validation, plan round trips."""

from __future__ import annotations

import pytest

from trainer import membership as mb
from trainer import plans as pl
from trainer.membership import Plan
from trainer.plans import Joiner, next_plan
from trainer.errors import Malformed


def test_first_generation_waits_for_the_initial_world() -> None:
    assert next_plan(None, [Joiner(1, "a")], [], [], initial_world=2) is None
    p = next_plan(None, [Joiner(1, "a", 10.0), Joiner(2, "b", 20.0)], [], [], initial_world=2)
    assert p is not None and p.generation == 1 and p.members == (1, 2)
    assert p.joined == (1, 2) and p.priors == {"a/1": 10.0, "b/2": 20.0}


def test_survivors_keep_their_order_and_joiners_append() -> None:
    cur = Plan(3, (4, 1, 7), ("x", "y", "z"))
    assert next_plan(cur, [], [], []) is None
    p = next_plan(cur, [Joiner(9, "j", 5.0)], [1], [7], reason="r")
    assert p is not None
    assert p.generation == 4 and p.members == (4, 9) and p.names == ("x", "j")
    assert p.drained == (1,) and p.lost == (7,) and p.joined == (9,)
    assert p.rank_of(9) == 1 and p.rank_of(7) is None
    assert p.keys() == ["x/4", "j/9"]


def test_no_survivor_means_an_empty_terminal_plan_and_no_joiner_admitted() -> None:
    cur = Plan(2, (1, 2), ("a", "b"))
    p = next_plan(cur, [Joiner(3, "c")], [1], [2])
    assert p is not None and p.members == () and p.joined == ()
    assert "no member" in p.reason


def test_plan_json_round_trip() -> None:
    p = Plan(5, (1, 2), ("a", "b"), joined=(2,), drained=(3,), lost=(4,),
             priors={"b/2": 12.5}, reason="why")
    assert Plan.from_json(p.to_json()) == p


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"name": ""}', b'{"name": 5}',
                                 b'{"name": "a", "prior": "fast"}',
                                 b'{"name": "a", "prior": Infinity}', "x" * 10, b"\xff\xfe"])
def test_a_malformed_hello_is_refused_as_malformed(raw: bytes) -> None:
    with pytest.raises(Malformed):
        mb.Hello.parse(raw)


def test_messages_round_trip_and_reject_wrong_types() -> None:
    h = mb.Hello("w", 12.5, "abc")
    assert mb.Hello.parse(h.to_json()) == h
    f = mb.Formed("c0ffee", 10, 1, 0, 100, 2.5)
    assert mb.Formed.parse(f.to_json()) == f
    p = mb.ProgressReport(3, 40, 2, 2560, 2, 0.5, {"accuracy": 0.9, "r2": float("nan")})
    q = mb.ProgressReport.parse(p.to_json())
    assert q.step == 40 and q.metrics["accuracy"] == 0.9
    for bad in (b'{"step": -1}', b'{"step": true}', b'{"metrics": {"a": "x"}}',
                b'{"finished": true, "step": "9"}'):
        with pytest.raises(Malformed):
            mb.ProgressReport.parse(bad)
    with pytest.raises(Malformed):
        mb.Formed.parse(b'{"checksum": 5, "step": 1}')
    with pytest.raises(Malformed):
        mb.Plan.from_json(b'{"generation": 2, "members": [1, 1], "names": ["a", "a"]}')
    with pytest.raises(Malformed):
        mb.Plan.from_json(b'{"generation": 0, "members": [], "names": []}')
    assert mb.parse_drain(b"") == "drain requested"


def test_the_same_set_is_re_formed_up_to_the_limit_then_the_member_that_never_forms_goes() -> None:
    plan = Plan(7, (1, 2, 3), ("a", "b", "c"))
    h = pl.Reforms()
    for n in range(1, pl.MAX_SAME_REFORMS + 1):  # 3 never starts forming; no step commits
        h, drop = pl.reform_or_drop(h, plan, started=[1, 2], formed=[], step=40)
        assert drop == () and h.count == n
    h, drop = pl.reform_or_drop(h, plan, started=[1, 2], formed=[], step=40)
    assert drop == (3,) and h == pl.Reforms()


def test_a_committed_step_or_another_set_restarts_the_count() -> None:
    plan = Plan(7, (1, 2, 3), ("a", "b", "c"))
    h, _ = pl.reform_or_drop(pl.Reforms(), plan, [1, 2], [], step=40, limit=1)
    h2, drop = pl.reform_or_drop(h, plan, [1, 2], [], step=41, limit=1)  # progress made
    assert drop == () and h2.count == 1
    h3, drop = pl.reform_or_drop(h, Plan(8, (1, 2), ("a", "b")), [1], [], step=40, limit=1)
    assert drop == () and h3.count == 1


def test_started_but_not_formed_while_others_formed_is_dropped_and_nobody_if_all_alike() -> None:
    plan = Plan(4, (1, 2), ("a", "b"))
    h = pl.Reforms(members=(1, 2), count=5, step=9)
    assert pl.reform_or_drop(h, plan, [1, 2], [1], step=9)[1] == (2,)
    # nothing singles anyone out: everybody started and formed, or nobody started
    assert pl.reform_or_drop(h, plan, [1, 2], [1, 2], step=9)[1] == ()
    assert pl.reform_or_drop(h, plan, [], [], step=9)[1] == ()
    assert pl.reform_or_drop(h, plan, [1, 2], [], step=9)[1] == ()
    with pytest.raises(ValueError, match="limit"):
        pl.reform_or_drop(h, plan, [1, 2], [], step=9, limit=0)


def test_the_verdict_for_a_job_that_is_over_says_how_it_ended() -> None:
    from trainer.membership import JobOutcome, finished_verdict, verdict_outcome

    for outcome in (JobOutcome.DONE, JobOutcome.LOST, JobOutcome.FAILED):
        assert verdict_outcome(finished_verdict(outcome).decode()) is outcome
    assert verdict_outcome("finished: the job is over") is JobOutcome.DONE  # said nothing more
    assert verdict_outcome("refused: a different job") is None
    assert verdict_outcome("ok") is None
