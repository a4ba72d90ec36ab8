"""Where a pipeline member keeps each layer of the model: on its device, on the host, or
released.

Design (pure decisions; :meth:`trainer.pipeline.stagestate.ModelIndex.place` carries them
out). The job's code builds the whole model on the host (its own init and RNG, PyTorch's
semantics unchanged) and the worker leaves it there: a model too big for one GPU must never
be put on one whole. Before joining, the layers are profiled one at a time
(:func:`trainer.pipeline.profile.stepwise`: each layer visits the device for its forward
and goes back). Once a generation has formed, a member keeps on its device only the layers
of its stage, with their gradients and optimiser state (:func:`decide`); every other layer
is *released* (its tensors become ``meta`` tensors: shapes and dtypes without storage), so
neither the device nor the host holds a copy that is not current. Layers a member receives
(a replacement joining, a handover, a layout change) are materialised on the device as they
arrive (:func:`only`) and loaded from the bytes received; layers it gives up are released
and their optimiser state dropped. The head's gathering (evaluation, snapshots, the trained
model) puts the whole model in one place: its device when every layer's weights fit beside
its stage's training state (:func:`gather_target`), else the host; afterwards it goes back
to its stage.

Rule for callers: a layer materialised from released holds garbage until loaded: only
materialise what a load, a received stage or a restored state fills at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DEVICE, HOST, RELEASED = "device", "host", "released"


def decide(n_layers: int, lo: int, hi: int, whole: str | None = None) -> tuple[str, ...]:
    """Where each of ``n_layers`` layers lives: training, layers ``[lo, hi)`` (the stage) on
    the device and every other layer released; gathered (``whole`` is :data:`DEVICE` or
    :data:`HOST`), every layer there."""
    if whole is not None:
        if whole not in (DEVICE, HOST):
            raise ValueError(f"whole={whole!r}: expected {DEVICE!r} or {HOST!r}")
        return (whole,) * n_layers
    return tuple(DEVICE if lo <= i < hi else RELEASED for i in range(n_layers))


def only(n_layers: int, lo: int, hi: int, where: str) -> tuple[str | None, ...]:
    """Layers ``[lo, hi)`` to ``where``, every other layer left as it is (None)."""
    return tuple(where if lo <= i < hi else None for i in range(n_layers))


def gather_target(layer_bytes: Sequence[float], lo: int, hi: int, slots: int,
                  memory: float) -> str:
    """Where the head gathers the whole model: its device when every layer's weights plus
    its own stage's gradients and ``slots`` optimiser slots fit ``memory`` bytes, else the
    host."""
    stage = sum(layer_bytes[lo:hi])
    return DEVICE if sum(layer_bytes) + stage * (1 + slots) <= memory else HOST


def memory_of(declared: float | None, device: Any) -> float:
    """The bytes a member offers the layout: the job's declared ``memory_bytes``, else its
    GPU's memory, else unbounded (a CPU)."""
    if declared:
        return float(declared)
    if device.type == "cuda":
        import torch

        return float(torch.cuda.get_device_properties(device).total_memory)
    return math.inf
