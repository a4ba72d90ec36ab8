"""A hybrid update: computed by one zone, carried across zones as one flat vector, applied
by every replica in version order.

Design. An update is what one ring step would commit, kept apart from the weights until its
turn: :class:`ZoneStepper` computes a zone's share of a global batch on each member (the
ring's forward/backward under the job's precision,
:func:`trainer.collective.step.forward_backward`), reduces it over the zone in buckets while
the backward pass runs (the ring's :class:`trainer.collective.reducer.Reducer`, each gradient
weighted by ``b_i / B``), and packs the sum into one float32 vector (:class:`UpdateLayout`):
every trainable parameter's gradient (registration order), one *used* flag per parameter
(did any member's backward produce it), the change the forward passes made to every buffer
(BatchNorm statistics, weighted by ``b_i / B``; the buffers themselves are put back, since a
replica's buffers move only when an update is applied), and four figures (samples, loss x
samples, staleness, zone).
:meth:`UpdateLayout.apply` is the commit: parameters nobody used get ``grad = None`` (not
stepped, as the ring), the gradients are clipped (``Job.grad_clip``: the norm over the
update's gradients, the whole global batch's, as the ring clips a step's), the job's own
optimiser steps with the gradient views, the buffer changes are added. Every replica applies the same vectors in the same order, so replicas at
the same version hold the same bits, and a replica can apply an update it did not compute.

Memory: a member's share above its cap (``micro_batch``, the job's ``Job.micro_batch`` at
first) is computed in slices, the buckets launched once (the ring's
:func:`trainer.collective.step.compute_in_slices`). A member that runs out of memory still
takes part in the zone's reduction with its row's out-of-memory flag set, halves its cap
(:func:`trainer.collective.step.lowered_cap`), and every member of the zone gets a
:class:`Computed` marked ``discarded``: nothing of it is sent or applied, and the zone
computes the same samples again.

Rule for callers: one :class:`ZoneStepper` per generation (``close()`` it); apply updates
only through :meth:`UpdateLayout.apply`, in version order, each once; ``fp16`` (a loss scale
that would have to follow every zone's updates) is not supported in the hybrid mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.collective.reducer import DEFAULT_BUCKET_MB, Reducer
from trainer.collective.step import (LOSS_COL, OOM_COL, ROW, compute_in_slices,
                                     lowered_cap)
from trainer.errors import OutOfMemory

META = 4  # samples, loss x samples, staleness, zone
SAMPLES, LOSS_SUM, STALENESS, ZONE = range(META)


class UpdateLayout:
    """Where each part of a model's update lives in the flat vector (module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = [b for b in model.buffers() if b is not None]
        self.offsets: list[int] = []
        o = 0
        for p in self.params:
            self.offsets.append(o)
            o += p.numel()
        self.o_used = o
        self.o_buf = self.o_used + len(self.params)
        self.o_meta = self.o_buf + sum(b.numel() for b in self.buffers)
        self.numel = self.o_meta + META
        self.extras = self.numel - self.o_used  # used flags, buffers, figures: one item

    def items(self) -> list[int]:
        """Sizes of the items shards carry: each parameter, then the extras."""
        return [p.numel() for p in self.params] + [self.extras]

    def item_offsets(self) -> list[int]:
        return [*self.offsets, self.o_used]

    def meta(self, update: torch.Tensor) -> list[float]:
        return update[self.o_meta:].tolist()

    def apply(self, update: torch.Tensor, optimizer: torch.optim.Optimizer, *,
              clip: float | None = None) -> float | None:
        """Commit ``update`` (a vector of :attr:`numel` float32) to the model and optimiser,
        its gradients first clipped to the total norm ``clip`` (``Job.grad_clip``) as
        ``torch.nn.utils.clip_grad_norm_`` clips them: the norm over the update's gradients,
        one global batch's, as a ring step's. Returns that norm before clipping (None: not
        clipped)."""
        if update.numel() != self.numel:
            raise ValueError(f"update of {update.numel()} values; this model's has {self.numel}")
        used = update[self.o_used:self.o_buf].tolist()
        for p, o, u in zip(self.params, self.offsets, used, strict=True):
            if u == 0:
                p.grad = None  # nobody computed it: not stepped (set_to_none semantics)
            else:
                p.grad = update[o:o + p.numel()].view_as(p).to(p.device, p.dtype)
        norm = None
        if clip is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(
                [p for p in self.params if p.grad is not None], clip))
        optimizer.step()
        with torch.no_grad():
            o = self.o_buf
            for b in self.buffers:
                d = update[o:o + b.numel()].view_as(b)
                o += b.numel()
                if b.is_floating_point() or b.is_complex():
                    b.add_(d.to(b.device, b.dtype))
                else:
                    b.add_(torch.round(d).to(b.device, b.dtype))
        return norm


@dataclass(frozen=True)
class Computed:
    """A zone's update and what its members measured: ``rows`` (zone members x
    :data:`trainer.collective.step.ROW`, the ring's step rows), this member's compute and wait."""

    update: torch.Tensor
    rows: torch.Tensor
    compute_s: float
    wait_s: float
    discarded: bool = False  # a member ran out of memory: send nothing, compute it again


class ZoneStepper:
    """One generation's zone computations (module docstring)."""

    def __init__(self, model: torch.nn.Module, layout: UpdateLayout,
                 loss_fn: Callable[[Any, Any], torch.Tensor], *, world: int, rank: int,
                 device: torch.device, precision: str,
                 bucket_mb: float = DEFAULT_BUCKET_MB,
                 forward_loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
                 micro_batch: int | None = None, min_batch: int = 1) -> None:
        if precision == "fp16":
            raise ValueError("precision fp16 is not supported in the hybrid mode (use bf16)")
        self.model, self.layout, self.loss_fn = model, layout, loss_fn
        self.forward_loss = forward_loss  # the job's forward_loss(model, batch), if any
        self.world, self.rank, self.device, self.precision = world, rank, device, precision
        self.micro_cap = micro_batch  # this member's samples per forward pass (None: all)
        self.min_batch = max(1, min_batch)
        self._o_used = world * ROW
        self._o_buf = self._o_used + len(layout.params)
        self.tail_numel = self._o_buf + (layout.o_meta - layout.o_buf)
        self.reducer = Reducer(layout.params, tail_numel=self.tail_numel, bucket_mb=bucket_mb)
        self.reducer.attach()

    def close(self) -> None:
        self.reducer.detach()

    def compute(self, pg: Any, batch: Any, b: int, total: int, *, step: int, latest: int,
                eval_s: float, staleness: int, zone: int, should_abort: Callable[[], bool],
                after_compute: Callable[[float, int], None] | None = None) -> Computed:
        """This member's ``b`` samples of an update of ``total``, reduced over the zone.

        Returns the :class:`Computed` update (the same vector on every zone member; marked
        ``discarded`` on every zone member when one ran out of memory, which then halved its
        :attr:`micro_cap`); the model's parameters, buffers and optimiser are as before. Raises
        :class:`trainer.errors.JobCodeError` and :class:`trainer.errors.GenerationBroken`.
        """
        layout = self.layout
        self.reducer.begin(pg, b / total, should_abort)
        before = [buf.detach().clone() for buf in layout.buffers]
        try:
            t0 = time.perf_counter()
            loss_v, oom = 0.0, 0.0
            if b > 0:
                try:
                    loss_v = compute_in_slices(
                        self.model, self.loss_fn, batch, b, self.micro_cap, self.reducer,
                        min_batch=self.min_batch, precision=self.precision, device=self.device,
                        scaler=None, step=step, forward_loss=self.forward_loss)
                except OutOfMemory as e:
                    oom = 1.0
                    self.micro_cap = lowered_cap(e.samples, step, b, min_batch=self.min_batch,
                                                 device=self.device)
            if after_compute is not None:
                after_compute(time.perf_counter() - t0, b)
            compute_s = time.perf_counter() - t0
            tail = torch.zeros(self.tail_numel, dtype=torch.float32)
            r = self.rank * ROW
            tail[r:r + ROW] = torch.tensor([b, compute_s, latest, loss_v * b, eval_s, 0.0, oom])
            if b > 0 and not oom:
                tail[self._o_used:self._o_buf] = self.reducer.used()
                o = self._o_buf
                for buf, old in zip(layout.buffers, before, strict=True):
                    n = buf.numel()
                    delta = buf.detach().reshape(-1).double() - old.reshape(-1).double()
                    tail[o:o + n] = (delta * (b / total)).to("cpu", torch.float32)
                    o += n
            t1 = time.perf_counter()
            reduced = self.reducer.finish(tail).to("cpu")
            wait_s = time.perf_counter() - t1
        finally:  # a replica's buffers move only when an update is applied
            with torch.no_grad():
                for buf, old in zip(layout.buffers, before, strict=True):
                    buf.copy_(old)
        rows = reduced[:self._o_used].view(self.world, ROW).clone()
        if rows[:, OOM_COL].max() > 0:  # a member ran out of memory: the zone discards it
            return Computed(torch.empty(0), rows, compute_s, wait_s, discarded=True)
        update = torch.empty(layout.numel, dtype=torch.float32)
        for p, o in zip(layout.params, layout.offsets, strict=True):
            update[o:o + p.numel()] = p.grad.detach().reshape(-1).to("cpu", torch.float32)
        update[layout.o_used:layout.o_meta] = reduced[self._o_used:]
        update[layout.o_meta:] = torch.tensor(
            [total, float(rows[:, LOSS_COL].sum()), staleness, zone], dtype=torch.float32)
        return Computed(update, rows, compute_s, wait_s)
