"""Emulated private devices for the trainer benchmarks: a forward/backward padded to a
device's time.

Design. On this host every worker is a process on a shared CPU (2 cores), so a worker's real
compute time depends on who else computes at the same moment: two workers on one core set
each other's speed, a joiner booting next to the ring slows it through shared caches and
memory, and a ``--slowdown F`` sleep multiplies that noise by ``F``. Measured here
(2026-11-24, idle machine): a ring of two ``--slowdown 2`` workers on CPU 0 drifted from 6.7k
to 10k samples/s over 20 s with nothing else running, its real compute from 59 to 37 ms a
step. On a fleet each worker computes on a device of its own (a GPU), whose time does not
depend on its neighbours. So a benchmark can run each worker as an emulated *private
device*: this file is also the job the workers load (:func:`make_job`), which wraps the real
job and pads every training forward/backward to the device's time::

    t_i(b) = F_i x (A + C x b)

``A + C x b`` is the device line (``$DEVICE_LINE`` = ``"A_s,C_s"``, already multiplied by
the benchmark's base slowdown ``K``; see :func:`default_base_slowdown`) and ``F_i`` the
worker's relative slowness (``$DEVICE_FACTOR``, or ``$DEVICE_FACTORS`` indexed by
``$RANK`` for torchrun ranks). The real forward/backward still runs (same gradients, same
model); the device time starts when a training forward pass starts (a forward pre-hook: the
worker's ``compute_s`` clock starts there too) and the pad sleeps in the backward of an
identity placed on the model's input, the last node of the backward pass, until the device
time is over. Evaluation (no gradients) is never padded. The collective, the state transfer
and everything else stay real.

Until 2026-11-24 the device time started in ``Job.batch``; since the workers read batches
through ``trainer.data.Feed`` (which indexes the dataset itself) that was never called in a
worker, so its steps were not padded at all, while the baselines' (which call ``job.batch``)
were: trainer_join and trainer_hetero figures taken between the Feed commit and this fix
compared unpadded spotring workers with padded baselines (``device_fidelity`` below 1 shows
it).

Rule: the emulation holds only while a worker's real compute ends before its device time
does; a benchmark reports the measured compute / device ratio (``device_fidelity``) so a run
where it did not hold shows it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # _common, also when loaded as a job

import torch  # noqa: E402

from _common import DEFAULT_JOB  # noqa: E402
from trainer.job import Job, load_job  # noqa: E402

ENV_JOB = "DEVICE_JOB"  # the wrapped job file
ENV_LINE = "DEVICE_LINE"  # "fixed_s,per_sample_s" of the 1x device (K included)
ENV_FACTOR = "DEVICE_FACTOR"  # this worker's F_i (spotring workers)
ENV_FACTORS = "DEVICE_FACTORS"  # "F_0,F_1,..." by torchrun RANK (baselines)
DEVICE_JOB = Path(__file__).resolve()  # the job file that wraps $DEVICE_JOB


class Pacer:
    """Pads one forward/backward to a device time ``factor x (fixed_s + per_sample_s x b)``.

    :meth:`start` is called when a training forward pass starts and :meth:`finish` at the
    end of the backward pass; it sleeps until the deadline (no sleep when the real compute
    already took longer).
    """

    def __init__(self, fixed_s: float, per_sample_s: float, factor: float) -> None:
        if fixed_s < 0 or per_sample_s <= 0 or factor < 1:
            raise ValueError(f"device line fixed_s={fixed_s}, per_sample_s={per_sample_s}, "
                             f"factor={factor}: need fixed_s >= 0, per_sample_s > 0, factor >= 1")
        self.fixed_s, self.per_sample_s, self.factor = fixed_s, per_sample_s, factor
        self.deadline: float | None = None

    def device_s(self, batch: int) -> float:
        """The emulated device's forward/backward seconds for ``batch`` samples."""
        return self.factor * (self.fixed_s + self.per_sample_s * batch)

    def start(self, batch: int) -> None:
        self.deadline = time.perf_counter() + self.device_s(batch)

    def finish(self) -> None:
        if self.deadline is not None:
            left = self.deadline - time.perf_counter()
            self.deadline = None
            if left > 0:
                time.sleep(left)


class _PaceAtInput(torch.autograd.Function):
    """Identity on the model's input; its backward (the last node of the pass) pads."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pacer: Pacer) -> torch.Tensor:
        ctx.pacer = pacer
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.pacer.finish()
        return grad, None


@dataclass
class PacedJob(Job):
    """A :class:`trainer.job.Job` whose forward/backward takes its device's time."""

    pacer: Pacer | None = None


def paced(job: Job, pacer: Pacer) -> PacedJob:
    """``job`` on the emulated device ``pacer`` (same model, optimiser, data). The device
    time starts in a forward pre-hook, so it holds whatever reads the batches (the worker's
    ``trainer.data.Feed`` or ``job.batch``)."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not torch.is_grad_enabled():
            return None  # evaluation: not a training step
        pacer.start(int(args[0].shape[0]))
        x = args[0].detach().requires_grad_(True)
        return (_PaceAtInput.apply(x, pacer), *args[1:])

    job.model.register_forward_pre_hook(hook)
    return PacedJob(**{f.name: getattr(job, f.name) for f in fields(Job)}, pacer=pacer)


def make_job(seed: int) -> Job:
    """The job the workers load: ``$DEVICE_JOB`` on this process's emulated device.

    The device comes from ``$DEVICE_LINE`` and the factor from ``$DEVICE_FACTOR`` (a
    spotring worker) or ``$DEVICE_FACTORS`` indexed by ``$RANK`` (a torchrun rank). Without
    ``$DEVICE_LINE`` the job is returned unchanged.
    """
    job = load_job(os.environ.get(ENV_JOB, str(DEFAULT_JOB)), seed)
    device = os.environ.get(ENV_LINE)
    if not device:
        return job
    fixed_s, per_sample_s = (float(v) for v in device.split(","))
    if ENV_FACTOR in os.environ:
        factor = float(os.environ[ENV_FACTOR])
    else:
        factor = [float(f) for f in os.environ[ENV_FACTORS].split(",")][int(os.environ["RANK"])]
    return paced(job, Pacer(fixed_s, per_sample_s, factor))


def parse_device_ms(text: str) -> tuple[float, float]:
    """``"A,C"`` in ms (fixed, per sample) -> ``(A, C)`` in seconds.

    Raises ``ValueError`` naming ``--device-ms`` and the fix when it is not two numbers with
    ``A >= 0`` and ``C > 0``.
    """
    try:
        a_ms, c_ms = (float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--device-ms {text!r}: expected A,C in ms (e.g. 2,0.1)") from None
    if not (a_ms >= 0 and c_ms > 0):
        raise ValueError(f"--device-ms {text!r}: need A >= 0 and C > 0 (e.g. 2,0.1)")
    return a_ms / 1e3, c_ms / 1e3


def device_env(job: Path, fixed_s: float, per_sample_s: float) -> dict[str, str]:
    """Environment that makes :data:`DEVICE_JOB` run ``job`` on the device line given (K
    included); add :data:`ENV_FACTOR` per worker or :data:`ENV_FACTORS` for torchrun ranks."""
    return {ENV_JOB: str(Path(job).resolve()), ENV_LINE: f"{fixed_s!r},{per_sample_s!r}"}


def default_base_slowdown(factors: list[float], cores: int, load: float = 0.0) -> float:
    """The default ``K``: the larger of two bounds, never below 1.

    * The ring's real CPU demand, ``sum_i 1 / (K F_i)`` cores, is at most half the ``cores``.
    * A worker's real compute still ends within its device time when all ``n`` workers
      compute at once (they start together after each all-reduce) on the ``cores`` next to
      ``load`` runnable processes of others (the 1-minute load average before the ring
      starts): real compute then takes up to ``(n + load) / cores`` times its single-core
      time; with a margin of 1.5, ``K >= 1.5 (n + load) / cores``.

    Relative speeds (and so optimal batch sizes) do not depend on ``K``: it scales every
    device alike; only the step time does.
    """
    cores = max(1, cores)
    demand = sum(1.0 / f for f in factors) / (0.5 * cores)
    sharing = 1.5 * (len(factors) + max(0.0, load)) / cores
    return round(max(1.0, demand, sharing), 2)


OVERRUN = 1.05  # a step measured more than 5 % over its device time: the emulation did not hold


def device_ratios(records: list[dict[str, Any]], device_s) -> list[float]:
    """Measured compute / device time of each of one worker's metrics records that had
    samples; ``device_s(batch)`` is that worker's device time."""
    return [r["compute_s"] / device_s(r["batch"]) for r in records if r.get("batch")]


def fidelity(records: list[dict[str, Any]], device_s) -> tuple[float, float]:
    """``(median of device_ratios, share of steps over OVERRUN)`` for one worker's records."""
    ratios = sorted(device_ratios(records, device_s))
    if not ratios:
        return float("nan"), 0.0
    return ratios[len(ratios) // 2], sum(r > OVERRUN for r in ratios) / len(ratios)
