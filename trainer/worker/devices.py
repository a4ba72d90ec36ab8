"""Where a worker computes, and which backend a generation's collectives use.

Design: ``--device auto|cpu|cuda|cuda:N`` names the device; ``auto`` is a GPU when this host
has one. ``cuda`` (and ``auto`` on a GPU host) picks GPU ``local_rank % device_count``, where
the local rank is ``LOCAL_RANK`` (torchrun's convention) or ``SPOTRING_LOCAL_RANK`` (set by
the local driver), so several workers on one host with several GPUs get one GPU each. A
worker tells the coordinator what it computes on (:func:`describe`: ``cpu`` or
``cuda:<GPU UUID>``) and the coordinator picks each generation's backend with the pure
:func:`trainer.control.plans.choose_backend`: NCCL when every member is on its own GPU, gloo
otherwise (NCCL refuses two ranks on one GPU, and cannot reach a CPU member; gloo reduces
CUDA tensors too,
through host memory).

The pipeline and hybrid modes are refused on a GPU (:func:`refusal`, one line, before the
worker joins): their point-to-point messages use tags, CPU header tensors and short polled
waits, which NCCL does not give (no tags, device-resident buffers only, sends and receives
matched in the same order on both sides), and gloo would hand device memory to TCP.

Rule for callers: resolve the device once, before the model is built or moved; never assume
the ring's backend from your own device: read it from the plan.
"""

from __future__ import annotations

import os

import torch

from trainer.errors import DeviceError

GLOO, NCCL = "gloo", "nccl"


def local_rank() -> int:
    """This worker's index among the workers of its host (0 when nobody said)."""
    for var in ("LOCAL_RANK", "SPOTRING_LOCAL_RANK"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0


def resolve(spec: str) -> torch.device:
    """The device ``--device spec`` names on this host. Raises :class:`DeviceError`."""
    spec = (spec or "auto").strip().lower()
    if spec == "cpu":
        return torch.device("cpu")
    if spec not in ("auto", "cuda") and not spec.startswith("cuda:"):
        raise DeviceError(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N")
    available = torch.cuda.is_available()
    if spec == "auto" and not available:
        return torch.device("cpu")
    if not available:
        raise DeviceError(f"--device {spec}: no CUDA GPU is visible on this host (torch "
                          f"{torch.__version__}, CUDA build: {torch.version.cuda}); use "
                          "--device cpu or auto")
    count = torch.cuda.device_count()
    if spec in ("auto", "cuda"):
        index = local_rank() % count
    else:
        tail = spec.split(":", 1)[1]
        if not tail.isdigit() or int(tail) >= count:
            raise DeviceError(f"--device {spec}: this host has {count} GPU(s), cuda:0 to "
                              f"cuda:{count - 1}")
        index = int(tail)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


GPU_MODES = ("ring",)  # the modes that run on a GPU (over NCCL, or gloo with CUDA tensors)


def refusal(mode: str, device: torch.device) -> str | None:
    """Why ``mode`` cannot run on ``device`` (one line naming the fix), or None (pure)."""
    if device.type == "cpu" or mode in GPU_MODES:
        return None
    return (f"--device {device}: the {mode} mode does not run on GPUs yet (its point-to-point "
            "messages need tags and host header tensors, which NCCL does not give); run it "
            "with --device cpu, or train this job in the ring mode")


def describe(device: torch.device) -> str:
    """What the coordinator learns of a device: ``cpu`` or ``cuda:<GPU UUID>``."""
    if device.type != "cuda":
        return "cpu"
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return f"cuda:{uuid if uuid is not None else device.index}"


def pin(batch: object, device: torch.device) -> object:
    """``batch`` (tensors in tuples, lists, dicts) copied to ``device``: through pinned host
    memory and non-blocking copies when it is a GPU; unchanged on the CPU."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        t = batch if batch.is_pinned() or batch.device.type != "cpu" else batch.pin_memory()
        return t.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: pin(v, device) for k, v in batch.items()}
    return batch
