"""Test job: one of the shipped examples (``PACED_EXAMPLE``: ``gpt`` or ``images``), held back
while a file exists (``PACED_FILE``: each training loss sleeps 0.05 s more), so a test tells
its story (a join, a kill, a notice) before the job ends, whatever the machine's speed."""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

from trainer.job import Job


def _paced(fn: Any) -> Any:
    pace = os.environ.get("PACED_FILE", "")

    def wrapped(*args: Any) -> Any:
        if pace and os.path.exists(pace):
            time.sleep(0.05)
        return fn(*args)
    return wrapped


def make_job(seed: int) -> Job:
    job = importlib.import_module(f"examples.{os.environ['PACED_EXAMPLE']}").make_job(seed)
    if job.forward_loss is not None:
        job.forward_loss = _paced(job.forward_loss)
    else:
        job.loss_fn = _paced(job.loss_fn)
    return job
