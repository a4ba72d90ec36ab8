"""What a worker writes: a metrics line that cannot be written is skipped, never fatal."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainer.worker.outputs import Outputs

FULL = Path("/dev/full")  # every write fails with ENOSPC, as a full disk does


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_skips_the_lines_with_one_warning(caplog: pytest.LogCaptureFixture,
                                                      tmp_path: Path) -> None:
    out = Outputs("job.py", metrics_file=FULL, record_samples=tmp_path / "s.jsonl")
    with caplog.at_level(logging.WARNING):
        for step in range(1, 4):
            out.step_record(False, {"step": step, "epoch": 0, "loss": 0.1, "world": 1},
                            epochs=1, metrics={})
            out.samples(step, 0, 1, [step])
    assert out.skipped == 3
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1 and "No space left" in warnings[0].getMessage()
    out.close()
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]  # the other file is written on
