"""A small CNN on scikit-learn's digits (8x8 handwritten digits shipped inside scikit-learn).

Design: the smallest real job for the elastic ring; a static run reaches >= 95% test
accuracy in a few seconds on one CPU core. It shows the job interface of
:mod:`trainer.job`: ``make_job(seed) -> Job`` builds the model, optimiser, loss, training
set, global batch and epochs, and ``evaluate`` gives the held-out accuracy.

Knobs (environment, for tests and benchmarks): ``DIGITS_EPOCHS`` (default 8),
``DIGITS_BATCH`` (global batch, default 64), ``DIGITS_LR`` (Adam, default 0.003),
``DIGITS_MODEL`` (``cnn``, default; or ``mlp``: three hidden layers of ``DIGITS_WIDTH``, default
2560, about 13M parameters, where the gradient reduction is a real share of the step),
``DIGITS_PRECISION`` (``fp32``, ``bf16`` or ``fp16``).

Run it in a ring::

    python -m trainer coordinator --port 29400 --token-file token &
    python -m trainer worker --coordinator 127.0.0.1:29400 --token-file token \
        --job examples/digits.py
"""

from __future__ import annotations

import os

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from trainer.job import Job


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, a max-pool and two linear layers (about 40k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
                                  nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsMLP(nn.Module):
    """A wide MLP on the 64 pixels (3 hidden layers of ``width``; 13.3M parameters at 2560)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def data() -> tuple[TensorDataset, TensorDataset]:
    """Train/test split (80/20, stratified, fixed) of the digits, pixels scaled to [0, 1]."""
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    tr, te = train_test_split(range(len(y)), test_size=0.2, random_state=0, stratify=d.target)
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[te], y[te])


def make_job(seed: int) -> Job:
    """The digits job; every worker calls this with the same ``seed``."""
    torch.manual_seed(seed)
    train, test = data()
    kind = os.environ.get("DIGITS_MODEL", "cnn")
    if kind == "mlp":
        model: nn.Module = DigitsMLP(int(os.environ.get("DIGITS_WIDTH", "2560")))
    elif kind == "cnn":
        model = DigitsCNN()
    else:
        raise ValueError(f"DIGITS_MODEL={kind!r}: expected cnn or mlp")
    lr = float(os.environ.get("DIGITS_LR", "0.003"))
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def evaluate(m: nn.Module) -> dict[str, float]:
        dev = next(m.parameters()).device
        m.eval()
        with torch.no_grad():
            pred = m(test.tensors[0].to(dev)).argmax(1).cpu()
        m.train()
        return {"accuracy": float((pred == test.tensors[1]).float().mean())}

    return Job(model=model, optimizer=opt, loss_fn=nn.functional.cross_entropy,
               train_set=train, global_batch=int(os.environ.get("DIGITS_BATCH", "64")),
               epochs=int(os.environ.get("DIGITS_EPOCHS", "8")), evaluate=evaluate,
               precision=os.environ.get("DIGITS_PRECISION", "fp32"))
