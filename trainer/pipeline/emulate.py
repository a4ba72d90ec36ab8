"""Emulated layers: real (small) math plus a sleep standing for a bigger device's compute.

Design. On two shared CPU cores the pipeline's timing claims (the bubble, the partition,
WSP) cannot be measured with real compute: the stages would fight for the cores. A
:class:`SleepyLayer` is a small ``Linear`` + ``tanh`` whose forward also sleeps
``seconds_per_sample x batch`` and whose backward sleeps twice that (the usual 1:2 ratio of a
forward to a backward), so a stage's time is known exactly and costs no CPU, while the
numbers it computes are real (gradients can be compared with one process). Sleeps release
the GIL, so threads or processes emulating stages run truly in parallel.

Inside :func:`deferred` (the runner wraps each pass in it) the layers add their sleep to a
tally instead of sleeping, and the caller sleeps once per pass: hundreds of short sleeps on a
loaded host each overshoot by up to a millisecond, one per pass does not.

Rule for callers: say which figures come from emulated layers.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

_TALLY = threading.local()


@contextlib.contextmanager
def deferred() -> Iterator[Callable[[], float]]:
    """Within: emulated layers of this thread only tally their sleep; the yielded function
    returns the seconds tallied so far (the caller sleeps them)."""
    prev = getattr(_TALLY, "owed", None)
    _TALLY.owed = 0.0
    try:
        yield lambda: float(_TALLY.owed)
    finally:
        _TALLY.owed = prev


def pause(seconds: float) -> None:
    """Sleep ``seconds``, or tally them inside :func:`deferred`."""
    if seconds <= 0:
        return
    if getattr(_TALLY, "owed", None) is not None:
        _TALLY.owed += seconds
    else:
        time.sleep(seconds)


class _Pause(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float
                ) -> torch.Tensor:
        pause(forward_s)
        ctx.backward_s = backward_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        pause(ctx.backward_s)
        return g, None, None


class SleepyLayer(torch.nn.Module):
    """``tanh(Linear(width, width))`` that also sleeps ``seconds_per_sample x batch`` in its
    forward pass and twice that in its backward pass."""

    def __init__(self, width: int, seconds_per_sample: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.seconds_per_sample = float(seconds_per_sample)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.seconds_per_sample * int(x.shape[0])
        return _Pause.apply(torch.tanh(self.linear(x)), s, 2 * s)


def sleepy_mlp(width: int, seconds_per_sample: Sequence[float], classes: int = 0
               ) -> torch.nn.Sequential:
    """A sequential model of :class:`SleepyLayer` (one per entry of ``seconds_per_sample``),
    with a final ``Linear(width, classes)`` when ``classes`` > 0 (costless)."""
    layers: list[torch.nn.Module] = [SleepyLayer(width, s) for s in seconds_per_sample]
    if classes > 0:
        layers.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*layers)
