"""Per-layer cost and activation size of a sequential model, measured before joining.

Design. The layout needs each layer's cost and the size of its output. A worker profiles its
job before it asks to join (the hot join: the ring never waits for a joiner's slow start);
:func:`attach` puts forward hooks on the model's children that time every forward pass (on
a GPU after synchronising, so the time is the kernels') and note the output's bytes per
sample. The worker's own profiling steps run through them; the pipeline member reads the
result (:func:`costs`) and detaches the hooks. A layer's cost is its fastest measured
forward per sample times 3 (a backward pass costs about twice the forward: the gradients of
the inputs and of the weights), the usual rule; the emulated layers of
:mod:`trainer.pipeline.emulate` follow it exactly. A job that did not attach them is timed
by :func:`measure` after joining (a few forward passes of one micro-batch) and says so.

Rule for callers: share the measurement (the layout is computed from one member's, the same
on every member); never compare costs measured on different devices.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

BACKWARD_FACTOR = 3.0  # forward + backward = 3 forwards

_TIMERS: weakref.WeakKeyDictionary[torch.nn.Module, LayerTimer] = weakref.WeakKeyDictionary()


class LayerTimer:
    """Forward hooks timing each child of a sequential model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.children = list(model._modules.values())  # every entry, in order
        n = len(self.children)
        self.best = [float("inf")] * n  # fastest forward seconds per sample
        self.act = [0.0] * n  # output bytes per sample
        self._t0 = [0.0] * n
        self._handles: list[Any] = []
        for i, child in enumerate(self.children):
            self._handles.append(child.register_forward_pre_hook(self._pre(i)))
            self._handles.append(child.register_forward_hook(self._post(i)))

    def _pre(self, i: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            _sync(args)
            self._t0[i] = time.perf_counter()
        return hook

    def _post(self, i: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            _sync(out)
            dt = time.perf_counter() - self._t0[i]
            if isinstance(out, torch.Tensor) and out.dim() > 0 and out.shape[0] > 0:
                b = int(out.shape[0])
                self.best[i] = min(self.best[i], dt / b)
                self.act[i] = out.numel() * out.element_size() / b
        return hook

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def costs(self) -> tuple[list[float], list[float]] | None:
        """``(seconds per sample forward and backward, output bytes per sample)`` per layer,
        or None when some layer was never timed."""
        if any(b == float("inf") for b in self.best):
            return None
        return [b * BACKWARD_FACTOR for b in self.best], list(self.act)


def _sync(x: Any) -> None:
    t = x[0] if isinstance(x, (tuple, list)) and x else x
    if isinstance(t, torch.Tensor) and t.is_cuda:
        torch.cuda.synchronize(t.device)


def attach(model: torch.nn.Module) -> LayerTimer:
    """Time ``model``'s children from now on (idempotent)."""
    timer = _TIMERS.get(model)
    if timer is None:
        timer = _TIMERS[model] = LayerTimer(model)
    return timer


def costs(model: torch.nn.Module) -> tuple[list[float], list[float]] | None:
    """What :func:`attach`'s hooks measured (then removed), or None."""
    timer = _TIMERS.pop(model, None)
    if timer is None:
        return None
    timer.detach()
    return timer.costs()


def measure(model: torch.nn.Module, x: Any, repeats: int = 3
            ) -> tuple[list[float], list[float]]:
    """Time ``model``'s children on the inputs ``x`` (``repeats`` forward passes with
    gradients on, as in training). Returns what :meth:`LayerTimer.costs` does."""
    timer = LayerTimer(model)
    try:
        for _ in range(max(1, repeats)):
            model(x)
    finally:
        timer.detach()
    got = timer.costs()
    if got is None:
        raise ValueError("a layer of the model never ran in its forward pass")
    return got
