"""Test job: one SGD step (lr 1, no momentum) on fixed data, dumping the weights after it.

With the data set exactly one global batch and one epoch, the ring runs exactly one step;
``evaluate`` (rank 0, at the end of the epoch) saves the parameters to ``$PROBE_OUT`` so the
test can recover the applied gradient as ``p0 - p1``.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer.job import Job

N = 48


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(N, 10, generator=g)
    y = torch.randint(0, 3, (N,), generator=g)
    return TensorDataset(x, y)


def make_job(seed: int) -> Job:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))

    def evaluate(m: nn.Module) -> dict[str, float]:
        torch.save({k: v.clone() for k, v in m.state_dict().items()}, os.environ["PROBE_OUT"])
        return {"accuracy": 0.0}

    return Job(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
               loss_fn=nn.functional.cross_entropy, train_set=data(), global_batch=N,
               epochs=1, evaluate=evaluate)
