"""Test job: one of the shipped examples (``PACED_EXAMPLE``: ``gpt`` or ``images``), held back
while a file exists (``PACED_FILE``: each training loss sleeps 0.05 s more), so a test tells
its story (a join, a kill, a notice) before the job ends, whatever the machine's speed; and
held back harder while a second file exists (``PACED_HOLD``: 0.5 s per loss), for a test that
waits on an event (a joiner that starts slowly on a loaded machine) while the ring still
trains and re-forms at every step boundary."""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

from trainer.job import Job


def _paced(fn: Any) -> Any:
    pace = os.environ.get("PACED_FILE", "")
    hold = os.environ.get("PACED_HOLD", "")

    def wrapped(*args: Any) -> Any:
        if hold and os.path.exists(hold):
            time.sleep(0.5)
        elif pace and os.path.exists(pace):
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
