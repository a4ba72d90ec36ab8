"""The weighted reduction equals the one-process full-batch gradient (unequal local batches)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.trainer.jobs import probe
from tests.trainer.ringutil import Ring

pytestmark = pytest.mark.slow


def test_reduced_gradient_equals_full_batch_gradient(tmp_path: Path) -> None:
    out = tmp_path / "p1.pt"
    ring = Ring(tmp_path, job="tests/trainer/jobs/probe.py", env={"PROBE_OUT": str(out)},
                initial_world=3)
    try:
        # Different speeds -> different profiled priors -> unequal local batches.
        for name, slow in (("fast", "1"), ("mid", "3"), ("slow", "8")):
            ring.worker(name, "--slowdown", slow)
        ring.wait_for("the one-step job", lambda: ring.coord.stats().get("finished"), 150)
    finally:
        ring.close()
    recs = ring.samples()
    sizes = sorted(len(r["ids"]) for r in recs)
    assert sum(sizes) == probe.N and len(recs) == 3
    assert len(set(sizes)) > 1, sizes  # the b_i really differ
    ids = sorted(i for r in recs for i in r["ids"])
    assert ids == list(range(probe.N))

    job = probe.make_job(0)  # the same seed: the same initial weights
    p0 = {k: v.clone() for k, v in job.model.state_dict().items()}
    x, y = job.train_set.tensors  # type: ignore[attr-defined]
    job.model.zero_grad()
    job.loss_fn(job.model(x), y).backward()
    full = torch.cat([p.grad.flatten() for p in job.model.parameters()])
    p1 = torch.load(out)
    applied = torch.cat([(p0[k] - p1[k]).flatten() for k in p0])  # SGD, lr 1: p0 - p1 = g
    rel = float((applied - full).norm() / full.norm())
    assert rel < 1e-5, (rel, sizes)

    # The check can tell: the members' plain average (no b_i / B weights) is far from what
    # was applied, so a ring that dropped the weights would fail the assertion above.
    def grad(ids: list[int]) -> torch.Tensor:
        job.model.load_state_dict(p0)
        job.model.zero_grad()
        job.loss_fn(job.model(x[ids]), y[ids]).backward()
        return torch.cat([p.grad.flatten() for p in job.model.parameters()])

    plain = sum(grad(r["ids"]) for r in recs) / len(recs)
    weighted = sum(grad(r["ids"]) * len(r["ids"]) / probe.N for r in recs)
    assert float((weighted - full).norm() / full.norm()) < 1e-5
    assert float((plain - applied).norm() / full.norm()) > 100 * max(rel, 1e-6), sizes
