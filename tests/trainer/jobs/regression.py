"""Test job: a regression a new user would write (issue 14's report), not the digits example.

A custom map-style Dataset whose targets have shape ``(1,)`` (``TARGET_DIM`` > 1: vectors), a
model with BatchNorm1d, LayerNorm and Dropout, AdamW, an MSE loss, and ``evaluate`` returning
``{"mse", "r2"}`` (no accuracy). The step time is almost all fixed cost (a small model), which
is what made the batch planner give a member one sample before the minimum local batch.

Knobs: ``REG_EPOCHS`` (default 6), ``REG_BATCH`` (global batch, default 32), ``TARGET_DIM``
(default 1), ``REG_FAIL_AT`` (raise in forward at that step: a job error), ``REG_OUT``
(``on_finish`` writes the final R² there), ``REG_SLEEP_MS`` (each training forward sleeps
this long), ``REG_PACE_FILE`` (while that file exists, each training forward sleeps 0.1 s
more: a test holds the job back until its story is told, whatever the machine's speed).
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from trainer.job import Job

N_TRAIN, N_TEST, D = 1024, 256, 8


def _make(n: int, seed: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    w = torch.linspace(-1.0, 1.0, D * out).view(D, out)
    y = torch.tanh(x @ w) + 0.5 * (x[:, :1] ** 2) + 0.05 * torch.randn(n, out, generator=g)
    return x, y


class Samples(Dataset):
    """A plain map-style Dataset (not a TensorDataset): ``(x, y)`` with ``y`` of shape
    ``(TARGET_DIM,)``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, out: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D, 64), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Dropout(0.05), nn.Linear(64, 64), nn.LayerNorm(64),
                                  nn.ReLU(), nn.Linear(64, out))
        self.fail_at = int(os.environ.get("REG_FAIL_AT", "-1"))
        self.sleep_s = float(os.environ.get("REG_SLEEP_MS", "0")) / 1000
        self.pace = os.environ.get("REG_PACE_FILE", "")
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (the user's bug)")
            if self.sleep_s:
                time.sleep(self.sleep_s)
            if self.pace and os.path.exists(self.pace):
                time.sleep(0.1)
        return self.body(x)


def make_job(seed: int) -> Job:
    torch.manual_seed(seed)
    out = int(os.environ.get("TARGET_DIM", "1"))
    train, test = _make(N_TRAIN, 1, out), _make(N_TEST, 2, out)
    model = Net(out)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)

    def evaluate(m: nn.Module) -> dict[str, float]:
        dev = next(m.parameters()).device
        m.eval()
        with torch.no_grad():
            pred = m(test[0].to(dev)).cpu()
        mse = float(((pred - test[1]) ** 2).mean())
        r2 = 1.0 - mse / float(test[1].var(unbiased=False))
        return {"mse": mse, "r2": r2}

    def on_finish(m: nn.Module) -> None:
        path = os.environ.get("REG_OUT")
        if path:
            with open(path, "w") as f:
                f.write(str(evaluate(m)["r2"]))

    return Job(model=model, optimizer=opt, loss_fn=nn.functional.mse_loss,
               train_set=Samples(*train), global_batch=int(os.environ.get("REG_BATCH", "32")),
               epochs=int(os.environ.get("REG_EPOCHS", "6")), evaluate=evaluate,
               on_finish=on_finish, loader_workers=0)
