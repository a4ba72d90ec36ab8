"""One step of a member: compute under the job's precision, reduce in buckets, commit.

Design. A :class:`Stepper` serves one generation. Per step::

    begin (weight b_i / B) -> forward + loss under autocast -> backward (buckets launch as
    they fill) -> tail -> finish (last bucket + tail, wait all) -> commit

The *tail* rides in the last bucket's collective (no collective of its own): one row per
member (``b_i``, compute seconds, the newest generation it saw, ``loss * b_i``, its last
evaluation's seconds, whether it has duties after this commit: rank 0's evaluation, snapshot
or export, which the others on NCCL wait out on the gloo group, never inside an NCCL
collective; whether it ran out of memory), one flag per parameter (did this member's
backward produce its
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
* **Buffers are agreed before** ``optimizer.step()``: whatever the optimiser step (or the
  job's ``after_step``, after the commit) writes into a buffer survives (an EMA kept as
  buffers).
* **Clipping** (``grad_clip``): the global norm of the reduced, unscaled gradients (the
  scaler unscales first), the same on every member.
* **Micro-batches** (``micro_batch``): a share larger than the cap is computed in slices;
  the reducer's hooks are held for all but the last slice (DDP's ``no_sync``), so the buckets
  launch once, with the accumulated gradients.
* **Out of memory** in one member: it still takes part in the reduction (its row says so),
  every member discards the step (nothing applied, buffers restored) and that member halves
  its micro-batch cap; the step is computed again.
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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.collective import groups
from trainer.collective.reducer import DEFAULT_BUCKET_MB, Reducer
from trainer.errors import GenerationBroken, JobCodeError, OutOfMemory

ROW = 7  # per-member row in the tail
B_COL, COMPUTE_COL, LATEST_COL, LOSS_COL, EVAL_COL, BUSY_COL, OOM_COL = range(ROW)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_SPLIT = float(2**24)  # integer buffers travel as hi * 2^24 + lo, each exact in float32
log = logging.getLogger(__name__)


def batch_len(batch: Any) -> int:
    """The samples in ``batch``: the first dimension of its first tensor (a tensor, a tuple or
    list, or a dict of them, nested); 0 when it holds no tensor with a dimension."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 0
    items = batch.values() if isinstance(batch, dict) else (
        batch if isinstance(batch, (tuple, list)) else ())
    for v in items:
        n = batch_len(v)
        if n:
            return n
    return 0


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Samples ``start:stop`` of ``batch``: every tensor with a first dimension is sliced,
    through tuples, lists and dicts; anything else is kept whole."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() else batch
    if isinstance(batch, dict):
        return {k: slice_batch(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(slice_batch(v, start, stop) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(slice_batch(v, start, stop) for v in batch)
    return batch


def forward_backward(model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor] | None,
                     batch: Any, *, precision: str, device: torch.device,
                     scaler: torch.amp.GradScaler | None, step: int, batch_size: int,
                     forward_loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
                     weight: float = 1.0, oom: bool = False) -> float:
    """Forward and loss under the job's autocast, backward of ``weight`` x the loss (of the
    scaled loss with fp16).

    The loss is ``forward_loss(model, batch)`` when given (any batch shape), else ``batch`` is
    ``(inputs, targets)`` and the loss ``loss_fn(model(inputs), targets)``. Returns the loss
    (a float; on a GPU, after the compute stream finished, so the caller's clock measures the
    compute). Raises :class:`JobCodeError` when the job's code raises, and with ``oom``
    :class:`OutOfMemory` when the device ran out of memory (else that too is a JobCodeError).
    """
    if not model.training:  # evaluate() may leave it in eval mode
        model.train()
    dtype = PRECISIONS[precision]
    cast = (torch.autocast(device.type, dtype=dtype) if dtype is not None
            else contextlib.nullcontext())
    stage = "forward_loss" if forward_loss is not None else "forward"
    try:
        with cast:
            if forward_loss is not None:
                loss = forward_loss(model, batch)
            else:
                assert loss_fn is not None
                x, y = batch
                out = model(x)
                stage = "loss"
                loss = loss_fn(out, y)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"the loss must be a tensor of one value, got "
                            f"{type(loss).__name__}"
                            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                               else ""))
        stage = "backward"
        scaled = loss * weight if weight != 1.0 else loss
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
    except (KeyboardInterrupt, SystemExit):
        raise
    except torch.OutOfMemoryError as e:
        if oom:
            raise OutOfMemory(batch_size) from e
        raise JobCodeError(stage, step, batch_size, e) from e
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
    discarded: bool = False  # a member ran out of memory: nothing applied, compute it again
    grad_norm: float | None = None  # with grad_clip: the norm before clipping


class Stepper:
    """A generation's steps (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[[Any, Any], torch.Tensor], *, world: int, rank: int,
                 device: torch.device, precision: str = "fp32",
                 scaler: torch.amp.GradScaler | None = None,
                 bucket_mb: float = DEFAULT_BUCKET_MB,
                 forward_loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
                 grad_clip: float | None = None, micro_batch: int | None = None,
                 min_batch: int = 1) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r}: expected one of {sorted(PRECISIONS)}")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.forward_loss, self.grad_clip = forward_loss, grad_clip
        self.micro_cap = micro_batch  # this member's samples per forward pass (None: all)
        self.min_batch = max(1, min_batch)
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
        oom = 0
        try:
            t0 = time.perf_counter()
            loss_v = 0.0
            if b > 0:
                try:
                    loss_v = self._compute(batch, b, step)
                except OutOfMemory as e:
                    oom = 1
                    self.micro_cap = lowered_cap(e.samples, step, b,
                                                 min_batch=self.min_batch, device=self.device)
            if after_compute is not None:
                after_compute(time.perf_counter() - t0, b)
            compute_s = time.perf_counter() - t0
            tail = self._tail(b, total, compute_s, latest, loss_v, eval_s, busy, oom)
            t1 = time.perf_counter()
            reduced = self.reducer.finish(tail)
            wait_s = time.perf_counter() - t1
            if broken():
                raise GenerationBroken("the reduction completed after the generation was "
                                      "broken")
            # the rows and flags in one device-to-host copy (the buffers stay on the device)
            host = reduced[:self._o_avg].to("cpu", torch.float32)
            rows = host[: self._o_used].view(self.world, ROW).clone()
            if rows[:, OOM_COL].max() > 0:  # a member ran out of memory: every member discards
                raise OutOfMemory(0)
        except OutOfMemory:
            self._restore(saved)
            return StepResult(rows, 0.0, compute_s, wait_s, False, discarded=True)
        except BaseException:
            self._restore(saved)
            raise
        skipped, norm = self._commit(reduced, host)
        return StepResult(rows, float(rows[:, LOSS_COL].sum()) / total, compute_s, wait_s, skipped,
                          grad_norm=norm)

    def _restore(self, saved: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for buf, old in zip(self._buffers(), saved, strict=True):
                buf.copy_(old)

    def _buffers(self) -> list[torch.Tensor]:
        return [*self._avg, *self._copy, *self._ints]

    def _compute(self, batch: Any, b: int, step: int) -> float:
        """Forward and backward of this member's share (:func:`compute_in_slices` at this
        member's cap). Returns the mean loss. Raises :class:`OutOfMemory` and
        :class:`JobCodeError`."""
        return compute_in_slices(self.model, self.loss_fn, batch, b, self.micro_cap,
                                 self.reducer, min_batch=self.min_batch,
                                 precision=self.precision, device=self.device,
                                 scaler=self.scaler, step=step,
                                 forward_loss=self.forward_loss)

    @staticmethod
    def profile_step(job: Any, batch: Any, device: torch.device,
                     scaler: torch.amp.GradScaler | None, cap: int | None = None) -> float:
        """One forward/backward of ``job`` exactly as the steps run it, nothing applied (the
        hot join's profiling), of at most ``cap`` samples (the member's micro-batch cap).
        Returns the loss; raises :class:`JobCodeError`, and :class:`OutOfMemory` when the
        device ran out of memory."""
        job.model.zero_grad(set_to_none=True)
        n = batch_len(batch)
        if cap and n > cap:
            batch, n = slice_batch(batch, 0, cap), cap
        return forward_backward(job.model, job.loss_fn, batch, precision=job.precision,
                                device=device, scaler=scaler, step=0, batch_size=n,
                                forward_loss=job.forward_loss, oom=True)

    def _tail(self, b: int, total: int, compute_s: float, latest: int, loss_v: float,
              eval_s: float, busy: bool = False, oom: int = 0) -> torch.Tensor:
        """The step's tail, built on the device: the rows and flags go over in one small
        host-to-device copy, the buffers never leave the device (no copy per buffer)."""
        head = torch.zeros(self._o_avg, dtype=torch.float32)
        r = self.rank * ROW
        head[r:r + ROW] = torch.tensor([b, compute_s, latest, loss_v * b, eval_s, float(busy),
                                       float(oom)])
        if b > 0:
            head[self._o_used:self._o_avg] = self.reducer.used()
        dev = self._tail_device()
        parts = [head.to(dev)]
        zeros = 0  # a run of zeros not yet appended
        # a few whole-list operations, not a few per buffer: ResNet-50's 161 buffers took
        # ~1,000 small launches a step, each one host time on a GPU that waits for it
        with torch.no_grad():
            if b > 0 and self._avg:
                parts.append(_flat(self._avg).mul_(b / total))
            else:
                zeros += self._o_copy - self._o_avg
            if self.rank == 0:
                if zeros:
                    parts.append(torch.zeros(zeros, device=dev))
                    zeros = 0
                if self._copy:
                    parts.append(_flat(self._copy))
                if self._ints:  # every integer as hi, then every integer as lo
                    v = torch.cat([buf.detach().reshape(-1).to(torch.int64)
                                   for buf in self._ints])
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

    def _commit(self, reduced: torch.Tensor, host: torch.Tensor) -> tuple[bool, float | None]:
        """Apply the step from the reduced tail (on its device; ``host``: its rows and flags
        copied to the host once): the buffers first (agreed before the optimiser step, so what
        it writes survives, copied device to device), then clipping and the optimiser step.
        Returns (the scaler skipped it, the gradients' norm before clipping)."""
        used = host[self._o_used:self._o_avg]
        for p, count in zip(self.params, used.tolist(), strict=True):
            if count == 0:
                p.grad = None  # nobody computed it: not stepped (set_to_none semantics)
        self._set_buffers(reduced)
        skipped, norm = False, None
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            if self.grad_clip is not None:
                self.scaler.unscale_(self.optimizer)
                norm = self._clip()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale
        else:
            if self.grad_clip is not None:
                norm = self._clip()
            self.optimizer.step()
        return skipped, norm

    def _clip(self) -> float:
        grads = [p for p in self.params if p.grad is not None]
        assert self.grad_clip is not None
        return float(torch.nn.utils.clip_grad_norm_(grads, self.grad_clip))

    def _set_buffers(self, reduced: torch.Tensor) -> None:
        with torch.no_grad():
            reduced = reduced.to(self._tail_device())
            floats = [*self._avg, *self._copy]
            o = self._o_avg
            n = self._o_int - o
            if floats:
                _unflat_into(floats, reduced[o:o + n])
            if self._ints:
                k = (self.tail_numel - self._o_int) // 2
                hi = reduced[self._o_int:self._o_int + k].double()
                lo = reduced[self._o_int + k:self._o_int + 2 * k].double()
                _unflat_into(self._ints, torch.round(hi * _SPLIT + lo).to(torch.int64))


def _flat(bufs: list[torch.Tensor]) -> torch.Tensor:
    """The buffers, flattened into one new float32 tensor (one concatenation)."""
    return torch.cat([buf.detach().reshape(-1).float() for buf in bufs])


def _unflat_into(bufs: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` back into ``bufs`` (the inverse of :func:`_flat`; each buffer keeps its
    dtype), in one ``_foreach_copy_``."""
    torch._foreach_copy_(bufs, [v.view_as(buf) for v, buf in zip(
        flat.split([buf.numel() for buf in bufs]), bufs, strict=True)])


def micro_bounds(b: int, cap: int, min_batch: int = 1) -> list[tuple[int, int]]:
    """``b`` samples cut into the fewest slices of at most ``cap`` (pure), as even as
    possible, none below ``min_batch`` (a slice may then exceed ``cap`` by less than
    ``min_batch``)."""
    cap = max(cap, min_batch, 1)
    k = max(1, -(-b // cap))
    while k > 1 and b // k < min_batch:
        k -= 1
    base, extra = divmod(b, k)
    out, lo = [], 0
    for i in range(k):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def compute_in_slices(model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor] | None,
                      batch: Any, b: int, cap: int | None, reducer: Reducer, *,
                      min_batch: int, precision: str, device: torch.device,
                      scaler: torch.amp.GradScaler | None, step: int,
                      forward_loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None
                      ) -> float:
    """Forward and backward of ``b`` samples in slices of at most ``cap`` (None: at once;
    :func:`micro_bounds`), the ``reducer``'s launches held for all but the last slice (DDP's
    ``no_sync``: the buckets launch once, with the accumulated gradients). The one
    accumulation of the ring's steps and the hybrid zones' updates. Returns the mean loss.
    Raises :class:`OutOfMemory` (with the samples of the slice that ran out) and
    :class:`JobCodeError`."""
    cap = cap or b
    if cap >= b:
        return forward_backward(model, loss_fn, batch, precision=precision, device=device,
                                scaler=scaler, step=step, batch_size=b,
                                forward_loss=forward_loss, oom=True)
    bounds = micro_bounds(b, cap, min_batch)
    total = 0.0
    try:
        for i, (lo, hi) in enumerate(bounds):
            reducer.hold(i < len(bounds) - 1)
            total += (hi - lo) * forward_backward(
                model, loss_fn, slice_batch(batch, lo, hi), precision=precision,
                device=device, scaler=scaler, step=step, batch_size=hi - lo,
                forward_loss=forward_loss, weight=(hi - lo) / b, oom=True)
    finally:
        reducer.hold(False)
    return total / b


def lowered_cap(samples: int, step: int, b: int, *, min_batch: int,
                device: torch.device, what: str = "the step is discarded on every member and "
                "computed again") -> int:
    """The samples per forward pass for a member that ran out of memory computing
    ``samples`` at once: half of them, never below ``min_batch`` (the device's cache is
    emptied first; ``what`` happens next, for the log line). Raises :class:`JobCodeError`
    when it already computed the fewest samples it may (the one out of memory that ends
    the job: the model does not fit)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if samples <= max(1, min_batch):
        raise JobCodeError("forward", step, b, torch.OutOfMemoryError(
            f"out of device memory with {samples} samples in one forward pass, the fewest "
            "allowed: use a smaller model or a larger device"))
    cap = max(min_batch, samples // 2)
    log.warning("out of memory with %d samples per forward pass at step %d: %s with at most "
                "%d", samples, step, what, cap)
    return cap
