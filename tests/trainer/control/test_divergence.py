"""Members whose digests differ end the run, naming what differs (issue 26.4): at a
generation change (the formed reports) and at the end (the done reports)."""

from __future__ import annotations

from tests.trainer.control.test_decide import World, _two_members
from trainer.protocol import messages as mb
from trainer.protocol.messages import JobOutcome

SAME = "parameters:aa buffers:bb optimizer:cc scheduler:dd extra:-"
SCHED = "parameters:aa buffers:bb optimizer:c2 scheduler:d2 extra:-"


def test_a_generation_whose_members_differ_fails_the_run_with_the_cause() -> None:
    w = World()
    a, b = _two_members(w)
    c = w.hello(mb.Hello("c", 10.0, "job1").to_json())
    w.beat(a, b, c)
    w.tick()
    plan = w.ring.plan
    assert plan is not None and c in plan.members
    for m, s in zip(plan.members, (SAME, SAME, SCHED), strict=True):  # the joiner differs
        w.kv[mb.k_formed(plan.generation, m)] = mb.Formed(s, 7).to_json().encode()
        w.add(mb.k_formed_count(plan.generation))
    w.beat(a, b, c)
    w.tick()
    assert w.ring.outcome is JobOutcome.FAILED, w.kinds()
    failure = w.ring.failure
    assert "differs at generation" in failure and "optimizer, scheduler" in failure
    assert "evaluate" in failure and "Job.scheduler" in failure  # the likely cause, named
    assert w.kv[mb.FINISHED].startswith(b"failed")
    assert int(w.kv[mb.k_broken(plan.generation)]) >= 1  # every member stops and reads it
    assert "job-error" in w.kinds()


def test_members_finishing_with_different_digests_fail_the_run() -> None:
    w = World()
    a, b = _two_members(w)
    for m, s in ((a, SAME), (b, SAME.replace("extra:-", "extra:e1"))):
        w.kv[mb.k_done(m)] = mb.Done(s, 40, {}).to_json().encode()
        w.add(mb.DONES)
        w.tick()
    assert w.ring.outcome is JobOutcome.FAILED
    assert "at the end (step 40) (extra)" in w.ring.failure
    assert "after_step" in w.ring.failure


def test_identical_members_finish_done() -> None:
    w = World()
    a, b = _two_members(w)
    for m in (a, b):
        w.kv[mb.k_done(m)] = mb.Done(SAME, 40, {}).to_json().encode()
        w.add(mb.DONES)
        w.tick()
    assert w.ring.outcome is JobOutcome.DONE
