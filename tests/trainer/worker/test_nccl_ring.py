"""A three-member ring on NCCL's semantics (the double of tests/fakes/nccl.py) loses one
member before its first bucket and another at an arbitrary moment, and trains on.

Every worker runs the real member code; the double gives each generation NCCL's failure
paths: collectives whose futures complete at enqueue, that never complete with a dead peer,
and a watchdog that ends a process whose collective stays pending past the group's timeout
unless the group was aborted. The heartbeat timeout and the collective timeout are 30 s, so
a survivor that trains again well before that found the failure by the canary on the
generation's gloo group and aborted its communicator, not by waiting a timeout out. The
seconds to the next step are a figure of benchmarks/trainer_revoke.py (``--nccl-double``),
not an assertion here.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.trainer.ringutil import Ring

pytestmark = pytest.mark.timeout(240)

TIMEOUT_S = 30.0


def test_kills_before_the_first_bucket_and_mid_step_cost_one_step_each(tmp_path: Path) -> None:
    ring = Ring(tmp_path, job="examples/digits.py",
                env={"DIGITS_EPOCHS": "2", "SPOTRING_TEST_NCCL_DOUBLE": "1"},
                initial_world=3, heartbeat_timeout_s=TIMEOUT_S, rollcall_s=0.3)
    timeout = ("--collective-timeout", str(TIMEOUT_S))
    try:
        ring.worker("a", *timeout)
        ring.worker("b", *timeout, "--fault", "kill@4")  # before its first bucket of step 4
        ring.worker("c", *timeout)
        ring.wait_for("b lost", lambda: any(e["name"] == "b" for e in ring.events("lost")), 120)
        ring.wait_for("two steps after b", lambda: ring.coord.stats()["step"] >= 8, 120)
        os.kill(ring.procs["c"].pid, signal.SIGKILL)  # wherever it is in its step
        ring.wait_for("the survivor to finish", lambda: ring.coord.stats().get("finished"), 180)
        assert ring.procs["a"].wait(20) == 0
        log = (tmp_path / "a.log").read_text(errors="replace")
        assert re.search(r"formed generation \d+ as rank \d/3 \(nccl\)", log), log[-3000:]
        assert "watchdog" not in log and "monitor" not in log
        formed = ring.formed()
        assert all(f["identical"] for f in formed), formed
        assert all(f["steps_lost"] <= 1 for f in formed), formed
        assert ring.coord.stats()["steps_lost"] <= 2
        assert {e["name"] for e in ring.events("lost")} == {"b", "c"}
        # the survivor trained again long before any timeout could have ended the wait: b's
        # kill (before its first bucket) is always found by the canary
        ts = sorted((m["t"], m["generation"]) for m in ring.metrics() if m["member"])
        gaps = [t2 - t1 for (t1, g1), (t2, g2) in zip(ts, ts[1:]) if g2 != g1]
        why = {e["name"]: e["detail"] for e in ring.events("lost")}
        story = f"gaps {gaps}, lost {why}\n{ring.story()}"
        assert len(gaps) == 2 and "collective failed" in why["b"], story
        assert gaps[0] < TIMEOUT_S / 3, story
        # c's, wherever it lands, too; except in the window after the step's canary round and
        # before its collective completed, where no wait of the survivor fails any more: then
        # the heartbeat finds it, or the survivor's wait ends at --collective-timeout (both
        # 30 s here, whichever comes first; docs/trainer.md, "GPUs and NCCL": about 1 run in
        # 10 here)
        late = ("heartbeat stopped" in why["c"]
                or f"not completed within {TIMEOUT_S:g}s (--collective-timeout)" in log)
        assert gaps[1] < (TIMEOUT_S + 10 if late else TIMEOUT_S / 3), story
    finally:
        ring.close()


def test_no_member_waits_inside_a_collective_while_rank_0_evaluates(tmp_path: Path) -> None:
    """Rank 0's evaluation (2.5 s) outlasts the collective timeout (1 s): the others wait for
    it on the store, so no generation breaks and no step is lost."""
    ring = Ring(tmp_path, job="tests/trainer/jobs/slow_eval.py",
                env={"DIGITS_EPOCHS": "2", "SPOTRING_TEST_NCCL_DOUBLE": "1"},
                initial_world=2, heartbeat_timeout_s=TIMEOUT_S, rollcall_s=0.3)
    try:
        for name in ("a", "b"):
            ring.worker(name, "--collective-timeout", "1")
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 180)
        assert [ring.procs[n].wait(20) for n in "ab"] == [0, 0]
        logs = "".join((tmp_path / f"{n}.log").read_text(errors="replace") for n in "ab")
        assert "(nccl)" in logs and "broken" not in logs, logs[-3000:]
        assert [f["generation"] for f in ring.formed()] == [1]
        assert ring.coord.stats()["steps_lost"] == 0
    finally:
        ring.close()


def test_a_revoked_instance_loses_all_its_workers_in_one_generation(tmp_path: Path) -> None:
    """One worker per GPU: instance i-1 runs two (``i-1/0``, ``i-1/1``, as the boot scripts name them);
    both die together without notice, and the next generation drops both at once."""
    ring = Ring(tmp_path, job="examples/digits.py",
                env={"DIGITS_EPOCHS": "2", "SPOTRING_TEST_NCCL_DOUBLE": "1"},
                initial_world=3, heartbeat_timeout_s=TIMEOUT_S, rollcall_s=0.3)
    timeout = ("--collective-timeout", str(TIMEOUT_S))
    try:
        for host in ("i-1", "i-2"):
            (tmp_path / host).mkdir()  # the harness's files are named after the workers
        for name in ("i-1/0", "i-1/1", "i-2/0"):
            ring.worker(name, *timeout)
        ring.wait_for("a few steps", lambda: ring.coord.stats()["step"] >= 4, 120)
        for name in ("i-1/0", "i-1/1"):
            os.kill(ring.procs[name].pid, signal.SIGKILL)
        ring.wait_for("the survivor to finish", lambda: ring.coord.stats().get("finished"), 180)
        assert ring.procs["i-2/0"].wait(20) == 0
        lost = ring.events("lost")
        assert {e["name"] for e in lost} == {"i-1/0", "i-1/1"}
        plans = [e for e in ring.events("generation") if e["generation"] > 1]
        assert len(plans) == 1, plans  # one generation without both, not one per worker
        assert ring.coord.stats()["steps_lost"] <= 1
    finally:
        ring.close()
