"""HetPipe virtual workers: pipeline stages over cheap GPUs, data parallel across them under
Wave Synchronous Parallel (``Job(mode="pipeline", pipeline=PipelineSettings(...))``).

Design. The package is a room of its own: pure decisions (:mod:`.partition` the layout and
the moves, :mod:`.schedule` GPipe and 1F1B, :mod:`.wsp` the staleness gate, :mod:`.table`
what members tell each other when a generation forms), the runner of one stage
(:mod:`.runner`), the wave reductions (:mod:`.agree`), a stage's state (:mod:`.stagestate`),
the per-layer profile (:mod:`.profile`), emulated layers for measurements on CPUs
(:mod:`.emulate`), and the member that puts them together (:mod:`.member`, chosen by
:mod:`trainer.worker.modes`).

Rule for callers: a job builds its settings with :func:`virtual_workers` (it also times the
model's layers during the worker's profiling, before joining) or :class:`PipelineSettings`.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.pipeline.settings import PipelineSettings

__all__ = ["PipelineSettings", "virtual_workers"]


def virtual_workers(model: torch.nn.Module, **settings: Any) -> PipelineSettings:
    """:class:`PipelineSettings` for ``model`` (an ``nn.Sequential``), timing its layers from
    now on (the worker's profiling steps measure them before it joins)."""
    from trainer.pipeline import profile

    profile.attach(model)
    return PipelineSettings(**settings)
