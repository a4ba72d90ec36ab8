"""A drain with notice and a kill landing in the same step must not stall the ring.

Reported by the daemon's author: in a three-member ring, one member SIGTERMed (notice: it
asks for a drain) and another SIGKILLed within a fraction of a second left the survivor
retrying "collective failed; every member answered" forever. Real multi-process gloo rings
on CPU; the faults come from the worker's own injector at a committed step, so the story
does not depend on the machine's load. The survivor must keep training and finish.

Status: these rings finish on the current code (so do external SIGTERM/SIGKILL and
Coordinator.drain + SIGKILL 0-300 ms apart, rank 0 drained, with and without a joiner);
the reported stall has not been reproduced outside the daemon's end-to-end test yet, so
this is a regression guard for the scenario, not a reproduction.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.ringutil import Ring

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("faults", [("term@6", "kill@6"), ("kill@6", "term@6")],
                         ids=["term-and-kill", "kill-and-term"])
def test_drain_and_kill_in_one_step_the_survivor_goes_on(tmp_path: Path,
                                                         faults: tuple[str, str]) -> None:
    ring = Ring(tmp_path, job="examples/digits.py", env={"DIGITS_EPOCHS": "1"},
                initial_world=3, heartbeat_timeout_s=2.0, rollcall_s=0.3)
    try:
        ring.worker("x", "--fault", faults[0], "--collective-timeout", "3")
        ring.worker("y", "--fault", faults[1], "--collective-timeout", "3")
        ring.worker("s", "--collective-timeout", "3")
        ring.wait_for("the survivor to finish", lambda: ring.coord.stats().get("finished"), 30)
        recovers = [e for e in ring.events("generation")
                    if "every member answered" in e["detail"]]
        assert len(recovers) <= 2, recovers
        assert ring.procs["s"].wait(10) == 0
    finally:
        ring.close()
