"""Issue 30.1 with a real ring: a notice to the only member holding the state does not lose
the job. It stays and trains on, the coordinator asks it for a snapshot at once (the final
one, should its notice window end first), and when a replacement joins it receives the state
and the noticed member leaves: 0 steps lost, no resume from the snapshot."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.trainer.ringutil import Ring
from trainer.state import snapshot as snap

JOB = "tests/trainer/jobs/regression.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_notice_to_the_last_holder_waits_for_its_replacement(tmp_path: Path) -> None:
    settings = snap.SnapshotSettings(str(tmp_path / "snapshots"), every_s=3600.0)
    ring = Ring(tmp_path, job=JOB, env={"REG_EPOCHS": "400", "REG_SLEEP_MS": "4"},
                snapshot=settings, initial_world=1, heartbeat_timeout_s=5.0, rollcall_s=0.5)
    try:
        a = ring.worker("a")
        ring.wait_for("training", lambda: ring.coord.stats()["step"] >= 10, 120)
        assert ring.coord.stats()["snapshot"] is None  # none due for an hour
        os.kill(a.pid, signal.SIGTERM)  # the notice
        ring.wait_for("the final snapshot", lambda: ring.coord.stats()["snapshot"], 120)
        step = ring.coord.stats()["step"]
        ring.wait_for("a to train on", lambda: ring.coord.stats()["step"] >= step + 10, 120)
        assert a.poll() is None and [m.name for m in ring.coord.members()] == ["a"]
        assert ring.coord.members()[0].kept
        ring.worker("b")  # the replacement
        ring.wait_for("a to leave once b holds the state", lambda: a.poll() is not None, 180)
        assert a.poll() == 0
        ring.wait_for("b to train on", lambda: ring.active("b"), 60)
        stats = ring.coord.stats()
        assert stats["steps_lost"] == 0 and stats["resumed_from"] is None, stats
        assert stats["outcome"] == "running" and not ring.events("resumed")
    finally:
        ring.close()
