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

The whole model never goes on the device (:mod:`trainer.pipeline.placement`): both run the
layers one at a time (:func:`stepwise`), each moved from the host to the device for its
forward and back; the hooks time the forward alone, not the moves. The worker's profiling
steps in the pipeline mode (:func:`profile_step`) are such forwards and the job's loss, no
backward (a layer's cost is 3x its forward, as above).

Rule for callers: share the measurement (the layout is computed from one member's, the same
on every member); never compare costs measured on different devices.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from trainer.collective.step import PRECISIONS
from trainer.errors import JobCodeError, LayoutError, OutOfMemory
from trainer.pipeline.stagestate import place_module

log = logging.getLogger(__name__)

BACKWARD_FACTOR = 3.0  # forward + backward = 3 forwards

_TIMERS: weakref.WeakKeyDictionary[torch.nn.Module, LayerTimer] = weakref.WeakKeyDictionary()
_KNOWN: weakref.WeakKeyDictionary[torch.nn.Module, tuple[list[float], list[float]]] = (
    weakref.WeakKeyDictionary())  # what was measured, for a later membership of the worker


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
    """What :func:`attach`'s hooks (then removed) or :func:`measure` measured, or None."""
    timer = _TIMERS.pop(model, None)
    if timer is None:
        return _KNOWN.get(model)
    timer.detach()
    got = timer.costs()
    if got is not None:
        _KNOWN[model] = got
    return got


def stepwise(model: torch.nn.Module, x: Any, device: torch.device, precision: str = "fp32"
             ) -> tuple[Any, float]:
    """Run ``model``'s children on ``x`` one at a time, each moved from the host to
    ``device`` for its forward (under the job's autocast) and back to the host after it.
    Returns the output and the seconds spent moving layers."""
    host = torch.device("cpu")
    dtype = PRECISIONS[precision]
    moving = 0.0
    for child in model._modules.values():
        t0 = time.perf_counter()
        place_module(child, device)
        moving += time.perf_counter() - t0
        with (torch.autocast(device.type, dtype=dtype) if dtype is not None
              else contextlib.nullcontext()):
            x = child(x)
        if isinstance(x, torch.Tensor):
            x = x.detach()  # the layer goes back to the host: no graph into it
        t0 = time.perf_counter()
        place_module(child, host)
        moving += time.perf_counter() - t0
    return x, moving


def profile_step(job: Any, batch: Any, device: torch.device) -> float:
    """One profiling step of a pipelined job before it joins: the layers' forwards one at
    a time (:func:`stepwise`) and the job's loss, nothing applied. Returns the seconds spent
    moving layers (not compute). Raises :class:`trainer.errors.JobCodeError`, and
    :class:`trainer.errors.OutOfMemory` when the device ran out of memory."""
    if not job.model.training:
        job.model.train()
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    size = int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 0
    stage = "forward"
    try:
        x, y = batch
        out, moving = stepwise(job.model, x, device, job.precision)
        stage = "loss"
        job.loss_fn(out, y)
    except (KeyboardInterrupt, SystemExit):
        raise
    except torch.OutOfMemoryError as e:
        raise OutOfMemory(size) from e
    except Exception as e:  # noqa: BLE001 - the user's code: one clear error
        raise JobCodeError(stage, 0, size, e) from e
    return moving


def measure(model: torch.nn.Module, x: Any, repeats: int = 3,
            device: torch.device | None = None, precision: str = "fp32"
            ) -> tuple[list[float], list[float]]:
    """Time ``model``'s children on the inputs ``x`` (``repeats`` forward passes with
    gradients on, as in training, one layer on ``device`` at a time: :func:`stepwise`).
    Returns what :meth:`LayerTimer.costs` does."""
    timer = LayerTimer(model)
    dev = device if device is not None else torch.device("cpu")
    try:
        for _ in range(max(1, repeats)):
            stepwise(model, x, dev, precision)
    finally:
        timer.detach()
    got = timer.costs()
    if got is None:
        raise ValueError("a layer of the model never ran in its forward pass")
    _KNOWN[model] = got
    return got


def layer_costs(model: torch.nn.Module, layer_seconds: Any, micro_batch: Any,
                device: torch.device, precision: str) -> tuple[list[float], list[float]]:
    """Each layer's seconds and activation size for the layout: as the worker's profiling
    timed them (:func:`attach`), else measured now on ``micro_batch()``'s inputs (logged:
    the job should build its settings with :func:`trainer.pipeline.virtual_workers`); the
    job's declared ``layer_seconds`` replace the seconds. Raises
    :class:`trainer.errors.LayoutError` when those do not match the model's layers."""
    got = costs(model)
    if got is None:
        log.warning("the model's layers were not timed before joining (build the job's "
                    "settings with trainer.pipeline.virtual_workers); timing them now")
        got = measure(model, micro_batch(), device=device, precision=precision)
        model.zero_grad(set_to_none=True)
    seconds, act = got
    if layer_seconds is not None:
        if len(layer_seconds) != len(seconds):
            raise LayoutError(f"layer_seconds has {len(layer_seconds)} entries; the model has "
                              f"{len(seconds)} layers")
        seconds = list(layer_seconds)
    return seconds, act
