"""Gradients reduced in buckets while the backward pass still runs (DDP's overlap), abortably.

Design (after DDP's ``Reducer``): the trainable parameters are packed, in reverse order of
registration (roughly the order backward produces their gradients), into flat buckets of at
most ``bucket_bytes`` (DDP's 25 MB; the first bucket ``first_bucket_bytes``, 1 MB, so
communication starts early), one dtype and device per bucket. Each parameter's ``.grad`` is
a view into its bucket with the parameter's own strides (a channels-last weight gets a
channels-last gradient: PyTorch's gradient layout contract, as DDP's
``gradient_as_bucket_view``), so autograd accumulates straight into it (no copy, and the
peak memory is the gradients' own). A post-accumulate-grad hook marks a parameter ready; when a
bucket is complete, it is scaled by this member's weight ``b_i / B`` and its all-reduce is
launched asynchronously, strictly in bucket order (every member launches the same
collectives in the same order, whatever order its backward ran in). The last bucket is never
launched from a hook: :meth:`Reducer.finish` launches it after the backward pass, with the
step's *tail* appended (the members' rows, the parameters each member used, the buffers:
see :mod:`trainer.collective.step`), so the tail costs no collective of its own; buckets a member's
backward never completed (unused parameters, or ``b_i = 0``: no backward at all) are
launched there too, in order.

:meth:`Reducer.finish` then waits for every bucket in order, each wait abortable
(:func:`trainer.collective.groups.wait`). A failure raises
:class:`trainer.errors.GenerationBroken` and nothing is applied (the commit rule is the
caller's). A reducer serves one generation: its buckets
are fresh memory, so a collective of a broken generation that completes late cannot write
into the next generation's gradients; :meth:`Reducer.detach` frees them (and the ``.grad``
views) so that the next generation's buckets never coexist with the old ones (one copy of
the gradients at a switch, not two). On NCCL the waits poll
(:func:`trainer.collective.nccl.poll`) with the generation's :class:`~trainer.collective.
groups.Watch`: a deadline, and a canary on the gloo control group posted beside the last
bucket.

Rule for callers: ``attach()`` once per generation, then per step ``begin()``, the backward
pass (micro-batches: every one but the last under ``hold(True)``), ``finish(tail)``;
``detach()`` before the next reducer is built (it frees this one). Do not touch ``.grad``
tensors in between except through the optimiser.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.collective import groups
from trainer.errors import GenerationBroken

log = logging.getLogger(__name__)

DEFAULT_BUCKET_MB = 25.0
FIRST_BUCKET_MB = 1.0


@dataclass
class _Bucket:
    index: int
    params: list[torch.nn.Parameter]
    buffer: torch.Tensor  # gradients, then the tail when this is the last bucket
    grad_numel: int
    views: list[torch.Tensor] = field(default_factory=list)
    pending: int = 0
    work: Any = None


def plan_buckets(sizes: Sequence[tuple[int, torch.dtype, str]], bucket_bytes: int,
                 first_bucket_bytes: int) -> list[list[int]]:
    """Parameter indices per bucket (pure): parameters in reverse order, a new bucket when
    the dtype or device changes or the cap would be passed (the first cap is smaller).

    ``sizes``: ``(bytes, dtype, device)`` per parameter in registration order.
    """
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    key: tuple[Any, Any] | None = None
    for i in reversed(range(len(sizes))):
        nbytes, dtype, dev = sizes[i]
        cap = first_bucket_bytes if not out else bucket_bytes
        if cur and ((dtype, dev) != key or used + nbytes > cap):
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += nbytes
        key = (dtype, dev)
    if cur:
        out.append(cur)
    return out


def bucket_view(buf: torch.Tensor, offset: int, p: torch.Tensor) -> torch.Tensor:
    """The view of ``buf`` from ``offset`` that holds ``p``'s gradient, with ``p``'s strides
    when ``p`` is dense and non-overlapping (contiguous, channels-last, any permutation; as
    DDP), else contiguous."""
    if p.is_contiguous() or not _dense(p):
        return buf[offset:offset + p.numel()].view_as(p)
    return buf.as_strided(p.size(), p.stride(), offset)


def _dense(p: torch.Tensor) -> bool:
    """``p`` covers exactly ``numel`` elements of its storage span, none twice."""
    dims = sorted((st, sz) for st, sz in zip(p.stride(), p.size(), strict=True) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


class Reducer:
    """One generation's bucketed gradient reduction (see the module docstring)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], *, tail_numel: int,
                 bucket_mb: float = DEFAULT_BUCKET_MB,
                 first_bucket_mb: float = FIRST_BUCKET_MB) -> None:
        if bucket_mb <= 0 or first_bucket_mb <= 0:
            raise ValueError(f"bucket_mb={bucket_mb}, first_bucket_mb={first_bucket_mb}: "
                             "must be positive")
        self.params = list(params)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        layout = plan_buckets([(p.numel() * p.element_size(), p.dtype, str(p.device))
                               for p in self.params],
                              int(bucket_mb * 2**20),
                              int(min(first_bucket_mb, bucket_mb) * 2**20))
        self.buckets: list[_Bucket] = []
        self._of: dict[int, tuple[int, int]] = {}  # parameter index -> (bucket, position)
        self.tail_numel = tail_numel
        self._separate_tail: torch.Tensor | None = None
        for b, group in enumerate(layout):
            ps = [self.params[i] for i in group]
            numel = sum(p.numel() for p in ps)
            last = b == len(layout) - 1
            extra = tail_numel if last and ps[0].dtype == torch.float32 else 0
            buf = torch.zeros(numel + extra, dtype=ps[0].dtype, device=ps[0].device)
            bucket = _Bucket(b, ps, buf, numel)
            o = 0
            for k, p in enumerate(ps):
                bucket.views.append(bucket_view(buf, o, p))
                o += p.numel()
                self._of[self._index[id(p)]] = (b, k)
            self.buckets.append(bucket)
        if not self.buckets or self.buckets[-1].buffer.numel() == self.buckets[-1].grad_numel:
            dev = self.params[0].device if self.params else torch.device("cpu")
            self._separate_tail = torch.zeros(tail_numel, dtype=torch.float32, device=dev)
        # plain Python flags, not tensors: the hook runs once per parameter per step, and a
        # tensor's item get/set costs tens of microseconds (ResNet-50: 161 hooks a step)
        self._used = bytearray(len(self.params))
        self._marked = bytearray(len(self.params))  # counted in pending
        self._held = False  # hold(): gradients accumulate, no launch (a micro-batch)
        self._hooks: list[Any] = []
        self._next = 0  # the next bucket to launch
        self._pg: Any = None
        self._weight = 1.0
        self._abort: Callable[[], bool] = lambda: False
        self._sliced = True
        self._watch = groups.GLOO_WATCH
        self._freed = False
        self._active = False
        self._failed: BaseException | None = None  # a launch that failed inside a hook

    # -- lifecycle ------------------------------------------------------------------------------

    def attach(self) -> None:
        """Point every parameter's ``.grad`` at its bucket view and register the hooks."""
        for b in self.buckets:
            for p, v in zip(b.params, b.views, strict=True):
                p.grad = v
                self._hooks.append(p.register_post_accumulate_grad_hook(self._ready))

    def detach(self) -> None:
        """Remove the hooks and free the buckets: the parameters' ``.grad`` views are set to
        None (a late collective of this generation then writes into memory nobody reads)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._active = False
        self._freed = True
        for b in self.buckets:
            for p, v in zip(b.params, b.views, strict=True):
                if p.grad is v:
                    p.grad = None
            b.views.clear()
            b.work = None
            b.buffer = b.buffer.new_empty(0)
        self._separate_tail = None if self._separate_tail is None else \
            self._separate_tail.new_empty(0)

    # -- one step -------------------------------------------------------------------------------

    def begin(self, pg: Any, weight: float, should_abort: Callable[[], bool],
              watch: groups.Watch = groups.GLOO_WATCH) -> None:
        """Start a step: zero the buckets, restore ``.grad`` views, remember the group, this
        member's weight ``b_i / B`` and (NCCL) the generation's :class:`groups.Watch`."""
        if self._freed:
            raise RuntimeError("Reducer.begin after detach(): build a new reducer")
        self._pg, self._weight, self._abort = pg, float(weight), should_abort
        self._sliced = isinstance(pg, torch.distributed.ProcessGroupGloo)
        self._watch = watch
        self._next = 0
        self._failed = None
        self._used = bytearray(len(self.params))
        self._marked = bytearray(len(self.params))
        self._held = False
        for b in self.buckets:
            b.buffer.zero_()
            b.pending = len(b.params)
            b.work = None
            for p, v in zip(b.params, b.views, strict=True):
                if p.grad is not v:
                    p.grad = v
        self._active = True

    def hold(self, on: bool) -> None:
        """Hold the launches (DDP's ``no_sync``) while ``on``: gradients accumulate in the
        buckets, parameters are marked used, no bucket launches. The step's last micro-batch
        runs with ``hold(False)``: its hooks launch the buckets with the accumulated sums."""
        self._held = on

    def _ready(self, p: torch.nn.Parameter) -> None:
        if not self._active:
            return
        i = self._index[id(p)]
        bi, k = self._of[i]
        b = self.buckets[bi]
        v = b.views[k]
        g = p.grad
        if g is not v:  # autograd replaced the view (e.g. a layout mismatch): copy it back
            if g is not None:
                v.copy_(g)
            p.grad = v
        if self._held:
            self._used[i] = 1
            return
        if not self._marked[i]:
            self._marked[i] = 1
            self._used[i] = 1
            b.pending -= 1
        try:
            self._launch_ready()
        except Exception as e:  # noqa: BLE001 - raised from finish(): the ring's, not the job's
            self._failed = e
            self._active = False

    def _launch_ready(self) -> None:
        last = len(self.buckets) - 1
        while self._next < last and self.buckets[self._next].pending == 0:
            self._launch(self.buckets[self._next])

    def _launch(self, b: _Bucket) -> None:
        if self._weight != 1.0:
            b.buffer[: b.grad_numel].mul_(self._weight)
        b.work = self._pg.allreduce([b.buffer])
        self._next = b.index + 1

    def finish(self, tail: torch.Tensor) -> torch.Tensor:
        """After the backward pass (or instead of it, with ``b_i = 0``): launch what is left,
        in order, the last bucket carrying ``tail``; wait for all. Returns the reduced tail
        (on the buckets' device, float32: the caller copies to the host what it reads). Raises :class:`trainer.errors.GenerationBroken`; nothing is applied.
        """
        if tail.numel() != self.tail_numel:
            raise ValueError(f"tail of {tail.numel()} values, the reducer was built for "
                             f"{self.tail_numel}")
        self._active = False
        self._held = False
        if self._failed is not None:
            raise GenerationBroken(f"allreduce launch: {self._failed}") from self._failed
        try:
            return self._finish(tail)
        except GenerationBroken:
            raise
        except Exception as e:  # noqa: BLE001 - a launch on a broken group
            raise GenerationBroken(f"allreduce: {e}") from e

    def _finish(self, tail: torch.Tensor) -> torch.Tensor:
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if b.index == len(self.buckets) - 1 and self._separate_tail is None:
                b.buffer[b.grad_numel:].copy_(tail)
                if self._weight != 1.0:
                    b.buffer[: b.grad_numel].mul_(self._weight)
                b.work = self._pg.allreduce([b.buffer])
                self._next = b.index + 1
            else:
                self._launch(b)
        tail_work = None
        if self._separate_tail is not None:
            self._separate_tail.copy_(tail)
            tail_work = self._pg.allreduce([self._separate_tail])
        canary = None if self._sliced else self._watch.canary()
        for b in self.buckets:
            groups.wait(b.work, self._abort, f"allreduce bucket {b.index}", sliced=self._sliced,
                        watch=self._watch, canary_work=canary)
        if tail_work is not None:
            groups.wait(tail_work, self._abort, "allreduce tail", sliced=self._sliced,
                        watch=self._watch, canary_work=canary)
            return self._separate_tail.detach()
        last = self.buckets[-1]
        return last.buffer[last.grad_numel:].detach().to(torch.float32)

    def used(self) -> torch.Tensor:
        """1.0 for each parameter (registration order) whose gradient this member's backward
        produced this step, else 0.0 (a CPU tensor; read it before :meth:`finish`)."""
        return torch.tensor(self._used, dtype=torch.float32)

    @property
    def nbytes(self) -> int:
        """Bytes held by the buckets (the gradients and the tail)."""
        n = sum(b.buffer.numel() * b.buffer.element_size() for b in self.buckets)
        return n + (self._separate_tail.numel() * 4 if self._separate_tail is not None else 0)
