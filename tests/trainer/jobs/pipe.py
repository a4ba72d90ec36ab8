"""Test job for the pipeline mode: a sequential regression net trained as virtual workers.

Layers: ``Linear`` + ``BatchNorm1d`` + ReLU, then emulated layers
(:class:`trainer.pipeline.emulate.SleepyLayer`: real math plus ``PIPE_LAYER_MS`` of sleep per
sample, so a stage's time is known and costs no CPU), then a linear head; MSE; Adam;
``evaluate`` returns ``{"mse", "r2"}`` on a held-out set (run on the head after the stages
are gathered).

Knobs: ``PIPE_STAGES`` (2), ``PIPE_MICRO`` (8), ``PIPE_SCHEDULE`` (1f1b), ``PIPE_D`` (0, the
staleness bound), ``PIPE_EPOCHS`` (4), ``PIPE_BATCH`` (64), ``PIPE_LAYER_MS`` (0.05 ms per
sample per emulated layer), ``PIPE_LAYERS`` (6 emulated layers), ``PIPE_TIGHT`` (N: the first
layer's training forward of more than N samples raises ``torch.OutOfMemoryError``, as CUDA
does: :class:`tests.trainer.jobs.tight.Tight`; unset: no limit), ``PIPE_WARMUP`` (N: a
``LambdaLR`` warmup over N committed waves as ``Job.scheduler``; unset: none),
``PIPE_CLIP`` (X: ``Job.grad_clip = X``, the norm over every stage; unset: none),
``PIPE_OOM_FILE`` (a path: the first training forward of more than 4 samples through the
first layer after the file appears, in whichever member, removes it and raises
``torch.OutOfMemoryError``: :class:`OutOfMemoryOnce`; unset: never), ``PIPE_EVAL_EVERY``
(N: ``Job.eval_every_steps``), ``PIPE_EVAL_LOG`` (a path: each evaluation appends the
optimiser steps the first layer has taken, i.e. the committed waves it sees).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from trainer.job import Job
from trainer.pipeline import virtual_workers
from trainer.pipeline.emulate import SleepyLayer

N_TRAIN, N_TEST, D, WIDTH = 512, 256, 8, 32
LR = 3e-3


def _make(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    w = torch.linspace(-1.0, 1.0, D).view(D, 1)
    y = torch.tanh(x @ w) + 0.3 * x[:, :1] * x[:, 1:2] + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


class OutOfMemoryOnce(nn.Module):
    """``inner``, except that once the file ``trigger`` exists, the first training forward
    of more than 4 samples (in any process: the one whose ``os.remove`` wins) raises
    ``torch.OutOfMemoryError``, as CUDA's allocator does: a device that ran short once."""

    def __init__(self, inner: nn.Module, trigger: str) -> None:
        super().__init__()
        self.inner, self.trigger = inner, trigger

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled() and x.shape[0] > 4:
            try:
                os.remove(self.trigger)
            except FileNotFoundError:
                pass
            else:
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {x.shape[0]} samples' activations")
        return self.inner(x)


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def make_job(seed: int) -> Job:
    torch.manual_seed(seed)
    per_sample = float(_env("PIPE_LAYER_MS", "0.05")) / 1000
    body = [SleepyLayer(WIDTH, per_sample) for _ in range(int(_env("PIPE_LAYERS", "6")))]
    first: nn.Module = nn.Linear(D, WIDTH)
    if _env("PIPE_TIGHT", ""):
        from tests.trainer.jobs.tight import Tight

        first = Tight(first, int(_env("PIPE_TIGHT", "")))
    if _env("PIPE_OOM_FILE", ""):
        first = OutOfMemoryOnce(first, _env("PIPE_OOM_FILE", ""))
    model = nn.Sequential(first, nn.BatchNorm1d(WIDTH), nn.ReLU(), *body, nn.Linear(WIDTH, 1))
    train, test = _make(N_TRAIN, 1), _make(N_TEST, 2)

    def evaluate(m: nn.Module) -> dict[str, float]:
        if _env("PIPE_EVAL_LOG", ""):
            seen = opt.state.get(next(m.parameters()), {}).get("step", 0)
            with open(_env("PIPE_EVAL_LOG", ""), "a") as f:
                f.write(f"{int(seen)}\n")
        m.eval()
        with torch.no_grad():
            pred = m(test[0])
        mse = float(((pred - test[1]) ** 2).mean())
        return {"mse": mse, "r2": 1.0 - mse / float(test[1].var())}

    opt = torch.optim.Adam(model.parameters(), lr=LR)
    warm = int(_env("PIPE_WARMUP", "0"))
    sched = (torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
             if warm else None)
    return Job(
        model=model, optimizer=opt, scheduler=sched,
        loss_fn=nn.functional.mse_loss, train_set=torch.utils.data.TensorDataset(*train),
        global_batch=int(_env("PIPE_BATCH", "64")), epochs=int(_env("PIPE_EPOCHS", "4")),
        evaluate=evaluate, mode="pipeline",
        eval_every_steps=int(_env("PIPE_EVAL_EVERY", "0")) or None,
        grad_clip=float(_env("PIPE_CLIP", "")) if _env("PIPE_CLIP", "") else None,
        pipeline=virtual_workers(model, stages=int(_env("PIPE_STAGES", "2")),
                                 micro_batch=int(_env("PIPE_MICRO", "8")),
                                 schedule=_env("PIPE_SCHEDULE", "1f1b"),
                                 staleness=int(_env("PIPE_D", "0")),
                                 # a loaded test machine's speeds swing more than 10 %: a
                                 # kill must not also move the stages (kept packs lost)
                                 keep_within=0.5))
