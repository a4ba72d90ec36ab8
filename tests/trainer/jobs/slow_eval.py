"""Test job: the digits job whose evaluation takes ``SLOW_EVAL_S`` seconds (default 2.5),
longer than the tests' collective timeout: on NCCL no member may wait for it inside a
collective."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from pathlib import Path

from trainer.job import Job

_spec = importlib.util.spec_from_file_location(
    "digits_for_slow_eval", Path(__file__).resolve().parents[3] / "examples" / "digits.py")
digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(digits)


def make_job(seed: int) -> Job:
    job = digits.make_job(seed)
    inner = job.evaluate
    pause = float(os.environ.get("SLOW_EVAL_S", "2.5"))

    def evaluate(model):  # noqa: ANN001, ANN202 - the Job's callback
        time.sleep(pause)
        return inner(model)

    return dataclasses.replace(job, evaluate=evaluate)
