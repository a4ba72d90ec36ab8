"""Test job: examples/digits.py in the hybrid mode.

Knobs (environment): ``HYBRID_STALENESS`` (default 1), ``HYBRID_SHARDS`` (0: one per zone),
``HYBRID_MODE`` (``hybrid``, default, or ``ring``), ``HYBRID_BN`` (1: a BatchNorm model, so
buffers travel in the updates), ``HYBRID_PACE_FILE`` (while that file exists, each training
loss sleeps 0.1 s: a story's faults all land before the job ends), plus the digits job's
own (``DIGITS_EPOCHS``, ``DIGITS_BATCH``, ...). ``HYBRID_TIGHT`` N: a training forward of
more than N samples raises ``torch.OutOfMemoryError`` (:class:`tests.trainer.jobs.tight.Tight`).
``HYBRID_CLIP`` X: ``Job.grad_clip = X``.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import torch
from torch import nn

from trainer.hybrid import HybridSettings
from trainer.job import Job

_spec = importlib.util.spec_from_file_location(
    "spotring_digits_for_hybrid", Path(__file__).resolve().parents[3] / "examples" / "digits.py")
assert _spec is not None and _spec.loader is not None
digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(digits)


class BNNet(nn.Module):
    """A small MLP with BatchNorm (buffers that the forward pass moves)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32),
                                 nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_job(seed: int) -> Job:
    job = digits.make_job(seed)
    if os.environ.get("HYBRID_BN") == "1":
        torch.manual_seed(seed)
        job.model = BNNet()
        job.optimizer = torch.optim.Adam(job.model.parameters(), lr=3e-3)
    if os.environ.get("HYBRID_TIGHT"):
        from tests.trainer.jobs.tight import Tight

        job.model = Tight(job.model, int(os.environ["HYBRID_TIGHT"]))  # the same parameters
    pace = os.environ.get("HYBRID_PACE_FILE", "")
    if pace:
        loss_fn = job.loss_fn

        def paced(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            if os.path.exists(pace):
                time.sleep(0.1)
            return loss_fn(out, target)

        job.loss_fn = paced
    if os.environ.get("HYBRID_CLIP"):
        job.grad_clip = float(os.environ["HYBRID_CLIP"])
    job.mode = os.environ.get("HYBRID_MODE", "hybrid")
    job.hybrid = HybridSettings(staleness=int(os.environ.get("HYBRID_STALENESS", "1")),
                                shards=int(os.environ.get("HYBRID_SHARDS", "0")))
    return job
