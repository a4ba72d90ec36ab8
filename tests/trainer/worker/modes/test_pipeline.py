"""A pipelined job that cannot run says why before it trains (one clear message, the job
fails once, as any job error)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainer.pipeline import PipelineSettings
from trainer.worker.modes.pipeline import PipelineMode


class _Job(SimpleNamespace):
    def __len__(self) -> int:
        return 16


def _member(model: torch.nn.Module, *, precision: str = "fp32", micro: int = 4,
            min_batch: int = 1, settings: Any = None) -> PipelineMode:
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    job = _Job(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
               precision=precision,
               pipeline=settings or PipelineSettings(stages=2, micro_batch=micro))
    runtime = SimpleNamespace(min_batch=min_batch, device=torch.device("cpu"),
                              batch=lambda ids, step: (x[ids], y[ids]))
    w = SimpleNamespace(job=job, runtime=runtime, cfg=SimpleNamespace(job="j.py"))
    return PipelineMode(SimpleNamespace(w=w))  # type: ignore[arg-type]


def seq() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


class NotSequential(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


@pytest.mark.parametrize(("make", "kw", "why"), [
    (NotSequential, {}, "must be a non-empty torch.nn.Sequential"),
    (seq, {"precision": "fp16"}, "fp16 is not supported"),
    (seq, {"micro": 1, "min_batch": 2}, "below the minimum local batch"),
    (seq, {"settings": object()}, "must be a trainer.pipeline.PipelineSettings"),
])
def test_a_job_that_cannot_be_pipelined_fails_with_the_reason(make: Any, kw: dict,
                                                              why: str) -> None:
    m = _member(make(), **kw)
    assert m.problem() is not None and why in m.problem()


def test_layers_that_share_weights_cannot_be_cut() -> None:
    a = torch.nn.Linear(4, 4)
    m = _member(torch.nn.Sequential(a, torch.nn.ReLU(), a))
    assert m.problem() is not None and "share weights" in m.problem()


def test_without_the_profile_hooks_the_layers_are_timed_after_joining(
        caplog: pytest.LogCaptureFixture) -> None:
    m = _member(seq())
    assert m.problem() is None
    seconds, act = m.measured
    assert len(seconds) == 3 and act == [32.0, 32.0, 4.0]
    assert "not timed before joining" in caplog.text


def test_declared_layer_costs_replace_the_measured_ones(tmp_path: Path) -> None:
    m = _member(seq(), settings=PipelineSettings(layer_seconds=(1.0, 0.0, 2.0)))
    assert m.measured[0] == [1.0, 0.0, 2.0]
    bad = _member(seq(), settings=PipelineSettings(layer_seconds=(1.0,)))
    assert bad.problem() is not None and "3 layers" in bad.problem()


def test_settings_are_checked() -> None:
    for kw in ({"stages": 0}, {"micro_batch": 0}, {"schedule": "zigzag"}, {"staleness": -1},
               {"memory_bytes": 0}):
        with pytest.raises(ValueError):
            PipelineSettings(**kw)  # type: ignore[arg-type]
