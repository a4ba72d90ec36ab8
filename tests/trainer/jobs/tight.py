"""Test job: the digits job on a "device" that holds at most ``TIGHT_LIMIT`` samples in one
training forward pass; more raises ``torch.OutOfMemoryError``, the error CUDA's caching
allocator raises (a faithful double of a GPU out of memory, on CPU). A pass that keeps no
graph (evaluation, ``torch.no_grad``) is not limited. :class:`Tight` wraps any module (the
hybrid and pipeline test jobs use it too)."""

from __future__ import annotations

import os

import torch
from torch import nn

from trainer.job import Job


class Tight(nn.Module):
    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.limit = inner, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled() and x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0]} samples' activations "
                f"(this device holds {self.limit})")
        return self.inner(x)


def make_job(seed: int) -> Job:
    from examples import digits  # here: importing Tight alone stays cheap

    job = digits.make_job(seed)
    job.model = Tight(job.model, int(os.environ["TIGHT_LIMIT"]))
    return job
