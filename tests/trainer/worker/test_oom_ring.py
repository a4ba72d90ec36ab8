"""A kill hands the survivor more samples than its device holds (issue 26 item 5), over a
real two-process gloo ring: the survivor's share doubles, its forward pass runs out of memory
(``tests/trainer/jobs/tight.py``: ``torch.OutOfMemoryError`` above 40 samples, as CUDA raises
it), the step is discarded and computed again in micro-batches under the lowered cap, and the
job finishes: never a job failure, one step lost (the kill's), each sample exactly once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.trainer.ringutil import Ring, per_epoch_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DIGITS_TRAIN = 1437


def test_a_survivor_handed_more_than_fits_lowers_its_cap_and_the_job_finishes(
        tmp_path: Path) -> None:
    ring = Ring(tmp_path, job="tests/trainer/jobs/tight.py",
                env={"DIGITS_EPOCHS": "1", "TIGHT_LIMIT": "40"}, initial_world=2,
                heartbeat_timeout_s=2.0, rollcall_s=0.3)
    try:
        ring.worker("k", "--fault", "kill@6", "--collective-timeout", "3")
        ring.worker("s", "--collective-timeout", "3")
        ring.wait_for("the survivor to finish", lambda: ring.coord.stats().get("finished"), 150)
        stats = ring.coord.stats()
        assert stats["outcome"] == "done" and stats["steps_lost"] <= 1, stats
        assert ring.procs["s"].wait(10) == 0
        log = (tmp_path / "s.log").read_text()
        # before the kill (a share above 40 when the sizing favours it) or after it (64)
        ooms = [(int(a), int(b)) for a, b in re.findall(
            r"out of memory with (\d+) samples per forward pass at step \d+: the step is "
            r"discarded on every member and computed again with at most (\d+)", log)]
        assert ooms and all(n > 40 and cap == n // 2 for n, cap in ooms), ring.logs()
        counts = per_epoch_counts(ring.samples())[0]
        assert sorted(counts) == list(range(DIGITS_TRAIN))  # every sample ...
        assert set(counts.values()) == {1}  # ... once: the discarded step recorded nothing
        alone = [m for m in ring.metrics() if m["world"] == 1]
        assert alone and all(m["batch"] == 64 for m in alone[:-1])  # the whole share, in parts
    finally:
        ring.close()
