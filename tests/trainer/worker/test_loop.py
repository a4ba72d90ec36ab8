"""The worker's life before it joins (trainer/worker/loop.py): loading, preparing, profiling."""

from __future__ import annotations

import torch

from trainer.worker.config import WorkerConfig
from trainer.worker.loop import Worker
from trainer.job import load_job

JOB = "tests/trainer/jobs/regression.py"  # BatchNorm1d, LayerNorm, Dropout


def test_profiling_leaves_the_users_model_as_it_was_built() -> None:
    """The profile's passes run in train mode, so they move BatchNorm's running statistics:
    step 0's committed state (rank 0's, which every member receives) had three profiling
    batches in them (issue 26.3: the state is the user's model and the committed steps)."""
    w = Worker(WorkerConfig("127.0.0.1", 1, b"t", JOB, "w", profile_steps=3))
    w.job = load_job(JOB, 0)
    built = {k: v.clone() for k, v in w.job.model.named_buffers()}
    assert any("running_mean" in k for k in built)
    w._prepare(torch.device("cpu"))
    assert w._profile() > 0
    after = dict(w.job.model.named_buffers())
    assert built.keys() == after.keys()
    for k, v in built.items():
        assert torch.equal(after[k], v), f"{k} moved by the profile"
