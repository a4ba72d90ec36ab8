"""The planning rules of the next generation (pure): who is in it, and the bound on re-forms."""

from __future__ import annotations

import pytest

from trainer.control import plans as pl
from trainer.control.plans import Joiner, next_plan
from trainer.protocol.messages import Plan


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


def test_drains_now_keeps_the_last_holders_and_lets_the_others_go() -> None:
    from trainer.control.plans import drains_now
    assert drains_now([1, 2, 3], {1, 2, 3}, [1, 2]) == ([1, 2], [])  # 3 holds it
    assert drains_now([1, 2, 3], {1}, [1, 3]) == ([3], [1])  # 2 never received it
    assert drains_now([1, 2], {1, 2}, [1, 2]) == ([], [1, 2])
    assert drains_now([1, 2], set(), [1, 2]) == ([1, 2], [])  # nothing held yet
    assert drains_now([1, 2, 3], {1, 2}, [1], dead=[2]) == ([], [1])


def test_instance_of_agrees_with_the_provisioner() -> None:
    from provisioner.drivers.identity import instance_of as prov
    from trainer.control.plans import instance_of
    for name in ("i-0abc", "i-0abc/3", "us-central1-a/sr-1a-0/1", "loc-1/0", "a", "x/", "/3",
                 "zone/name-9"):
        assert instance_of(name) == prov(name), name


def test_proven_holders_hold_a_state_and_share_the_digest_of_their_step() -> None:
    from trainer.control.plans import proven_holders
    from trainer.protocol.messages import Report

    def rep(m: int, step: int, holds: bool = True, digest: str = "") -> Report:
        return Report(m, f"w{m}", step=step, holds=holds, digest=digest)

    # reported at different moments while the ring trained on: all hold it
    assert proven_holders([rep(1, 100), rep(2, 104), rep(3, 97)]) == {1, 2, 3}
    assert proven_holders([rep(1, 0, holds=False), rep(2, 0, holds=False)]) == frozenset()
    assert proven_holders([rep(1, 50, digest="x"), rep(2, 50, digest="x"),
                           rep(3, 50, digest="y"), rep(4, 52, digest="z")]) == {1, 2, 4}
    # one honest, one forged at the same step: nothing tells which, so neither proves it
    # (the ring resumes from a snapshot rather than train on the forger's state)
    assert proven_holders([rep(1, 50, digest="x"), rep(2, 50, digest="y")]) == frozenset()
    assert proven_holders([rep(1, 50, digest="y"), rep(2, 50, digest="x"),
                           rep(3, 50)]) == {3}
