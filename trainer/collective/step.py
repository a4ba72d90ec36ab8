"""One step of a member: compute under the job's precision, reduce in buckets, commit.

Design. A :class:`Stepper` serves one generation. Per step::

    begin (weight b_i / B) -> forward + loss under autocast -> backward (buckets launch as
    they fill) -> tail -> finish (last bucket + tail, wait all) -> commit

The *tail* rides in the last bucket's collective (no collective of its own): one row per
member (``b_i``, compute seconds, the newest generation it saw, ``loss * b_i``, its last
evaluation's seconds, whether it has duties after this commit: rank 0's evaluation, snapshot
or export, which the others on NCCL wait out on the gloo group, never inside an NCCL
collective), one
flag per parameter (did this member's backward produce its
gradient), and the buffers. Every member reads the same reduced tail, so all of them make
the same decisions from it:

* **Parameters nobody used** this step get ``grad = None`` before the optimiser runs, so they
  are not stepped (PyTorch's ``zero_grad(set_to_none=True)`` semantics); a parameter some
  members used gets the ``b_i / B``-weighted sum of theirs (the others count as zero), as
  DDP with ``find_unused_parameters`` does.
* **Buffers** are identical on every member after every step. BatchNorm/InstanceNorm running
  statistics are *averaged*, weighted by ``b_i / B``: the running mean then moves exactly as a
  single process's would on the global batch (each member updates it from its own share),
  which DDP's broadcast of rank 0's buffers loses. Every other buffer is rank 0's (DDP's
  rule: constant buffers never drift by rounding), integer ones carried exactly as two
  float32 halves.
* **Mixed precision**: ``bf16`` or ``fp16`` autocast around forward and loss; ``fp16`` scales
  the loss with a ``GradScaler``. The scaler unscales the *reduced* gradients, identical on
  every member, so its skip-step decision and its next scale are the same everywhere.
* **Commit rule**: the optimiser steps only after every bucket's reduction returned;
  :class:`trainer.errors.GenerationBroken` leaves parameters, buffers and optimiser untouched (the
  buffers the forward pass updated in place are restored).

An exception in the user's forward, loss or backward raises :class:`JobCodeError` (the job
must be fixed; it is not a revocation).

Rule for callers: one :class:`Stepper` per generation (:meth:`Stepper.close` it when the
generation ends); call :meth:`Stepper.step` with the same ``total`` on every member.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.collective import groups
from trainer.collective.reducer import DEFAULT_BUCKET_MB, Reducer
from trainer.errors import GenerationBroken, JobCodeError

ROW = 6  # per-member row in the tail
B_COL, COMPUTE_COL, LATEST_COL, LOSS_COL, EVAL_COL, BUSY_COL = range(ROW)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_SPLIT = float(2**24)  # integer buffers travel as hi * 2^24 + lo, each exact in float32


def _batch_len(batch: Any) -> int:
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() else 0


def forward_backward(model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor],
                     batch: Any, *, precision: str, device: torch.device,
                     scaler: torch.amp.GradScaler | None, step: int, batch_size: int) -> float:
    """Forward and loss under the job's autocast, backward (of the scaled loss with fp16).

    ``batch`` is ``(inputs, targets)``. Returns the loss (a float; on a GPU, after the compute
    stream finished, so the caller's clock measures the compute). Raises :class:`JobCodeError`
    when the job's code raises.
    """
    if not model.training:  # evaluate() may leave it in eval mode
        model.train()
    dtype = PRECISIONS[precision]
    cast = (torch.autocast(device.type, dtype=dtype) if dtype is not None
            else contextlib.nullcontext())
    stage = "forward"
    try:
        x, y = batch
        with cast:
            out = model(x)
            stage = "loss"
            loss = loss_fn(out, y)
        stage = "backward"
        (scaler.scale(loss) if scaler is not None else loss).backward()
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: one clear error, not a loss
        raise JobCodeError(stage, step, batch_size, e) from e
    if device.type == "cuda":  # compute time: the compute stream, not NCCL's
        torch.cuda.current_stream(device).synchronize()
    return float(loss.detach())


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """The loss scaler ``fp16`` needs (None for ``fp32`` and ``bf16``)."""
    if precision != "fp16":
        return None
    scaler = torch.amp.GradScaler(device.type)
    scaler.scale(torch.ones((), device=device))  # initialise its scale (a member with b_i = 0
    return scaler  # never scales a loss, yet must unscale and step with the others)


@dataclass(frozen=True)
class StepResult:
    """What a committed step tells the member: the reduced rows and this member's times."""

    rows: torch.Tensor  # (world, ROW), float32
    loss: float  # the global batch's mean loss
    compute_s: float
    wait_s: float
    skipped: bool  # fp16: the scaler found inf/NaN gradients and skipped the update


class Stepper:
    """A generation's steps (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[[Any, Any], torch.Tensor], *, world: int, rank: int,
                 device: torch.device, precision: str = "fp32",
                 scaler: torch.amp.GradScaler | None = None,
                 bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r}: expected one of {sorted(PRECISIONS)}")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.world, self.rank, self.device = world, rank, device
        self.precision, self.scaler = precision, scaler
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._avg: list[torch.Tensor] = []  # running statistics: averaged
        self._copy: list[torch.Tensor] = []  # other floating buffers: rank 0's
        self._ints: list[torch.Tensor] = []  # integer buffers: rank 0's, exactly
        for mod in model.modules():
            norm = isinstance(mod, torch.nn.modules.batchnorm._NormBase)
            for name, buf in mod.named_buffers(recurse=False):
                if buf is None:
                    continue
                if not (buf.is_floating_point() or buf.is_complex()):
                    self._ints.append(buf)
                elif norm and name in ("running_mean", "running_var"):
                    self._avg.append(buf)
                else:
                    self._copy.append(buf)
        n_avg = sum(b.numel() for b in self._avg)
        n_copy = sum(b.numel() for b in self._copy)
        n_int = sum(b.numel() for b in self._ints)
        self._o_used = world * ROW
        self._o_avg = self._o_used + len(self.params)
        self._o_copy = self._o_avg + n_avg
        self._o_int = self._o_copy + n_copy
        self.tail_numel = self._o_int + 2 * n_int
        self.reducer = Reducer(self.params, tail_numel=self.tail_numel, bucket_mb=bucket_mb)
        self.reducer.attach()

    def close(self) -> None:
        self.reducer.detach()

    # -- the step ------------------------------------------------------------------------------

    def step(self, pg: Any, batch: Any, b: int, total: int, *, step: int, latest: int,
             eval_s: float, should_abort: Callable[[], bool],
             after_compute: Callable[[float, int], None] | None = None,
             broken: Callable[[], bool] = lambda: False,
             watch: groups.Watch = groups.GLOO_WATCH, busy: bool = False) -> StepResult:
        """Compute this member's share ``batch`` (``b`` samples; ``b = 0``: nothing to
        compute), reduce and commit. ``after_compute(seconds, b)`` runs between the backward
        pass and the reduction (the ``--slowdown`` emulation). ``broken()`` is asked once more
        after the reduction: a late completion on an abandoned generation is not committed.
        ``watch``: the generation's (``Group.watch()``; an NCCL group's waits need it).
        ``busy``: this member has duties after the commit (its row's ``BUSY_COL``).

        Raises :class:`JobCodeError` (the job's code raised) and
        :class:`trainer.errors.GenerationBroken` (nothing applied).
        """
        self.reducer.begin(pg, b / total, should_abort, watch)
        # the forward pass updates running statistics in place: a discarded step must not
        # keep them (the members would hold different buffers at the same step)
        saved = [buf.detach().clone() for buf in self._buffers()]
        try:
            t0 = time.perf_counter()
            loss_v = 0.0
            if b > 0:
                loss_v = self._compute(batch, b, step)
            if after_compute is not None:
                after_compute(time.perf_counter() - t0, b)
            compute_s = time.perf_counter() - t0
            tail = self._tail(b, total, compute_s, latest, loss_v, eval_s, busy)
            t1 = time.perf_counter()
            reduced = self.reducer.finish(tail)
            wait_s = time.perf_counter() - t1
            if broken():
                raise GenerationBroken("the reduction completed after the generation was "
                                      "broken")
        except BaseException:
            with torch.no_grad():
                for buf, old in zip(self._buffers(), saved, strict=True):
                    buf.copy_(old)
            raise
        skipped, host = self._commit(reduced)
        rows = host[: self._o_used].view(self.world, ROW).clone()
        return StepResult(rows, float(rows[:, LOSS_COL].sum()) / total, compute_s, wait_s, skipped)

    def _buffers(self) -> list[torch.Tensor]:
        return [*self._avg, *self._copy, *self._ints]

    def _compute(self, batch: Any, b: int, step: int) -> float:
        return forward_backward(self.model, self.loss_fn, batch, precision=self.precision,
                                device=self.device, scaler=self.scaler, step=step, batch_size=b)

    @staticmethod
    def profile_step(job: Any, batch: Any, device: torch.device,
                     scaler: torch.amp.GradScaler | None) -> float:
        """One forward/backward of ``job`` exactly as the steps run it, nothing applied (the
        hot join's profiling). Returns the loss; raises :class:`JobCodeError`."""
        job.model.zero_grad(set_to_none=True)
        return forward_backward(job.model, job.loss_fn, batch, precision=job.precision,
                                device=device, scaler=scaler, step=0,
                                batch_size=_batch_len(batch))

    def _tail(self, b: int, total: int, compute_s: float, latest: int, loss_v: float,
              eval_s: float, busy: bool = False) -> torch.Tensor:
        """The step's tail, built on the device: the rows and flags go over in one small
        host-to-device copy, the buffers never leave the device (no copy per buffer)."""
        head = torch.zeros(self._o_avg, dtype=torch.float32)
        r = self.rank * ROW
        head[r:r + ROW] = torch.tensor([b, compute_s, latest, loss_v * b, eval_s, float(busy)])
        if b > 0:
            head[self._o_used:self._o_avg] = self.reducer.used()
        dev = self._tail_device()
        parts = [head.to(dev)]
        zeros = 0  # a run of zeros not yet appended
        with torch.no_grad():
            if b > 0 and self._avg:
                parts += [buf.detach().reshape(-1).float() * (b / total) for buf in self._avg]
            else:
                zeros += self._o_copy - self._o_avg
            if self.rank == 0:
                if zeros:
                    parts.append(torch.zeros(zeros, device=dev))
                    zeros = 0
                parts += [buf.detach().reshape(-1).float() for buf in self._copy]
                for buf in self._ints:
                    v = buf.detach().reshape(-1).to(torch.int64)
                    parts += [torch.div(v, int(_SPLIT), rounding_mode="floor").float(),
                              torch.remainder(v, int(_SPLIT)).float()]
            else:
                zeros += self.tail_numel - self._o_copy
            if zeros:
                parts.append(torch.zeros(zeros, device=dev))
            return torch.cat([t.to(dev) for t in parts]) if len(parts) > 1 else parts[0]

    def _tail_device(self) -> torch.device:
        bufs = self._buffers()
        return bufs[0].device if bufs else self.device

    def _commit(self, reduced: torch.Tensor) -> tuple[bool, torch.Tensor]:
        """Apply the step from the reduced tail (on its device); returns whether the scaler
        skipped it, and the rows and flags (one device-to-host copy; the buffers are copied
        device to device)."""
        host = reduced[:self._o_avg].to("cpu", torch.float32)
        used = host[self._o_used:self._o_avg]
        for p, count in zip(self.params, used.tolist(), strict=True):
            if count == 0:
                p.grad = None  # nobody computed it: not stepped (set_to_none semantics)
        skipped = False
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale
        else:
            self.optimizer.step()
        with torch.no_grad():
            reduced = reduced.to(self._tail_device())
            o = self._o_avg
            for buf in self._avg:
                n = buf.numel()
                buf.copy_(reduced[o:o + n].view_as(buf))
                o += n
            for buf in self._copy:
                n = buf.numel()
                buf.copy_(reduced[o:o + n].view_as(buf))
                o += n
            for buf in self._ints:
                n = buf.numel()
                hi, lo = reduced[o:o + n].double(), reduced[o + n:o + 2 * n].double()
                buf.copy_(torch.round(hi * _SPLIT + lo).to(buf.dtype).view_as(buf))
                o += 2 * n
        return skipped, host
