"""A job wrapper that records the process's resident memory once the job is built.

Design. ``trainer_overhead.py --memory`` compares the peak memory of a spotring worker with a
plain DDP rank's over their first steps: each side's peak resident set (``VmHWM`` in
``/proc/<pid>/status``, read by the benchmark while the process runs) minus the same
process's resident set right after the model, the optimiser and the data were built. Both
sides load the job through this file (``$RSS_JOB``, the wrapped job file), so both record
that second figure at the same point: the end of ``make_job``. It is written as one JSON line
to ``$RSS_DIR/<pid>.json`` with the process's ``RANK`` (torchrun's; empty for a spotring
worker or the plain loop). The job itself is returned unchanged (same fingerprint).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # benchmarks/: _common

from _common import DEFAULT_JOB, proc_status_kb  # noqa: E402
from trainer.job import Job, load_job  # noqa: E402

ENV_JOB = "RSS_JOB"
ENV_DIR = "RSS_DIR"


def make_job(seed: int) -> Job:
    """``$RSS_JOB`` (default examples/digits.py), after writing this process's RSS."""
    job = load_job(os.environ.get(ENV_JOB, str(DEFAULT_JOB)), seed)
    out = os.environ.get(ENV_DIR)
    if out:
        pid = os.getpid()
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"{pid}.json").write_text(json.dumps({
            "pid": pid, "rank": os.environ.get("RANK", ""),
            "rss_kb": proc_status_kb(pid, "VmRSS"), "hwm_kb": proc_status_kb(pid, "VmHWM"),
        }) + "\n")
    return job
