"""One stage of a virtual worker running its schedule for one wave, point to point.

Design. ``torch.distributed.pipelining`` needs the default process group (spotring never
uses it: each generation has its own) and fixes tensor shapes at the first step; this runner
works on any group object (the generation's gloo group here, NCCL on GPUs) with plain
``send``/``recv``:

* a forward receives its input from the previous stage (stage 0 takes its micro-batch's
  inputs), runs the stage's layers under the job's autocast and posts its output to the next
  stage; the last stage computes the loss, scaled by the micro-batch's share of the whole
  wave (``samples / wave total``, so the reduced gradient is the global batch's);
* a backward receives the gradient of its output from the next stage (the last stage starts
  from its loss), back-propagates and posts the gradient of its input to the previous stage.
  Gradients accumulate in the layers' ``.grad`` over the wave's micro-batches;
* sends are posted and never waited for inside the schedule (waited at the wave's end), so a
  schedule cannot deadlock on them; receives wait abortably
  (:func:`trainer.collective.groups.recv`), so a stage whose neighbour died stops within a
  slice;
* shapes are not fixed at a first step: a small header (dtype and shape) goes before a
  tensor. With ``fixed_shapes`` (the default: a stage's output shape depends only on the
  number of samples) only the first tensor of each micro-batch size in a generation has one;
  both sides know the micro-batch sizes, so they agree on when a header comes. Without it
  (shapes that depend on the data, e.g. padded sequences) every tensor has one. Tags are
  ``wave % 64``, micro-batch and kind, so a wave's messages never match another's;
* ``slowdown`` F emulates a slower device: after each pass the stage sleeps so that the pass
  takes ``F`` times its measured compute plus what emulated layers tallied
  (:func:`trainer.pipeline.emulate.deferred`), in one sleep.

* out of memory in a pass (``torch.OutOfMemoryError``) is not the job's error: the stage
  goes on with its schedule so its neighbours are not left waiting, sending NaN of the
  right shape where its output or input gradient would have gone (the shape from the pass
  run again without a graph, else on the meta device), so every pack of the virtual worker
  is spoiled (not finite) and no kept copy of it can be used; :attr:`StageStats.oom` says
  so and the caller discards the wave on every member.

Rule for callers: one :class:`StageRunner` per stage per generation; call :meth:`run` with the
same micro-batches and schedule kind on every stage of the VW; after
:class:`trainer.errors.GenerationBroken` the wave is discarded (the caller restores the buffers and
zeroes the gradients).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainer.collective import groups
from trainer.collective.step import PRECISIONS
from trainer.errors import GenerationBroken, JobCodeError
from trainer.pipeline import emulate
from trainer.pipeline.schedule import FORWARD, Op
from trainer.state.codec import DTYPES

_CODES = {dt: i for i, dt in enumerate(DTYPES.values())}
_BY_CODE = list(DTYPES.values())
HEADER = 10  # int64 words: dtype code, ndim, up to 8 dimensions
ACT_HEAD, ACT, GRAD_HEAD, GRAD = range(4)


@contextlib.contextmanager
def transport(what: str) -> Iterator[None]:
    """Posting a send or a receive on a group whose peer is gone raises gloo's
    ``RuntimeError`` at once (not at the wait): it is a broken generation like any other."""
    try:
        yield
    except RuntimeError as e:
        raise GenerationBroken(f"{what}: {e}") from e


def tag(wave: int, micro: int, kind: int) -> int:
    """The point-to-point tag of a wave's message (unique within 64 waves)."""
    return ((wave % 64) << 20) | (micro << 2) | kind


@dataclass(frozen=True)
class Micro:
    """One micro-batch of this VW's wave: its index in the VW's schedule, its samples, and
    its share of the wave (``samples / wave total``)."""

    index: int
    samples: int
    weight: float


@dataclass(frozen=True)
class StageStats:
    """A wave on one stage: ``busy_s`` in passes (emulated slowdown included), ``wall_s``
    from the first pass's start to the last send's completion, ``loss_sum`` (the last
    stage's sum of ``loss x samples``), when it started and ended (``perf_counter``), and
    ``oom``: the samples of the largest pass that ran out of memory (0: none)."""

    busy_s: float
    wall_s: float
    loss_sum: float
    started: float
    ended: float
    oom: int = 0


class StageRunner:
    """A stage's passes for one generation (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, *, pg: Any, prev: int | None,
                 next_: int | None, loss_fn: Callable[[Any, Any], torch.Tensor],
                 device: torch.device, precision: str = "fp32", slowdown: float = 1.0,
                 fixed_shapes: bool = True, step: Callable[[], int] = lambda: 0) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r}")
        self.module, self.pg, self.prev, self.next = module, pg, prev, next_
        self.loss_fn, self.device, self.precision = loss_fn, device, precision
        self.slowdown = slowdown
        self._step = step  # the training step, for error messages
        self.fixed_shapes = fixed_shapes
        self._sent: set[tuple[int, int, int]] = set()
        self._recv_shapes: dict[tuple[int, int, int], tuple[tuple[int, ...], torch.dtype]] = {}
        self._pending: list[tuple[Any, int]] = []
        self._keep: list[torch.Tensor] = []  # posted tensors, alive until their send is done

    # -- transport ---------------------------------------------------------------------------

    def _post(self, t: torch.Tensor, dst: int, wave: int, micro: Micro, kind: int) -> None:
        with transport(f"send to rank {dst}"):
            self._post_now(t.detach().contiguous(), dst, wave, micro, kind)

    def _post_now(self, t: torch.Tensor, dst: int, wave: int, micro: Micro, kind: int) -> None:
        key = (dst, kind, micro.samples)
        if not self.fixed_shapes or key not in self._sent:
            head = torch.zeros(HEADER, dtype=torch.int64)
            head[0], head[1] = _CODES[t.dtype], t.dim()
            head[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
            self._pending.append((self.pg.send([head], dst, tag(wave, micro.index, kind - 1)),
                                  dst))
            self._keep.append(head)
            self._sent.add(key)
        self._pending.append((self.pg.send([t], dst, tag(wave, micro.index, kind)), dst))
        self._keep.append(t)

    def _take(self, src: int, wave: int, micro: Micro, kind: int,
              should_abort: Callable[[], bool]) -> torch.Tensor:
        key = (src, kind, micro.samples)
        if not self.fixed_shapes or key not in self._recv_shapes:
            head = torch.zeros(HEADER, dtype=torch.int64)
            self._recv(head, src, tag(wave, micro.index, kind - 1), should_abort)
            code, ndim = int(head[0]), int(head[1])
            if not 0 <= code < len(_BY_CODE) or not 0 <= ndim <= HEADER - 2:
                raise GenerationBroken(f"stage message from rank {src}: bad header")
            shape = tuple(int(d) for d in head[2:2 + ndim])
            if any(d < 0 for d in shape) or torch.Size(shape).numel() > 1 << 34:
                raise GenerationBroken(f"stage message from rank {src}: bad shape {shape}")
            self._recv_shapes[key] = (shape, _BY_CODE[code])
        shape, dtype = self._recv_shapes[key]
        buf = torch.empty(shape, dtype=dtype, device=self.device if self.device.type == "cuda"
                          else "cpu")
        self._recv(buf, src, tag(wave, micro.index, kind), should_abort)
        return buf.to(self.device)

    def _recv(self, t: torch.Tensor, src: int, tag_: int, should_abort: Callable[[], bool]
              ) -> None:
        with transport(f"recv from rank {src}"):
            groups.wait_posted([(self.pg.recv([t], src, tag_), src)], should_abort)

    def finish_sends(self, should_abort: Callable[[], bool]) -> None:
        """Wait for every posted send (their buffers are kept alive until then)."""
        pending, self._pending = self._pending, []
        groups.wait_posted(pending, should_abort)
        self._keep.clear()

    # -- a wave ------------------------------------------------------------------------------

    def run(self, ops: Sequence[Op], micros: Sequence[Micro], wave: int,
            inputs: Callable[[int], Any] | None, targets: Callable[[int], Any] | None,
            should_abort: Callable[[], bool]) -> StageStats:
        """Run ``ops`` over ``micros`` (indexed by ``Op.micro``). ``inputs(i)``: micro-batch
        ``i``'s inputs (stage 0 only); ``targets(i)``: its targets (last stage only).

        Returns :class:`StageStats`. Raises :class:`trainer.errors.GenerationBroken` (a peer failed
        or the generation was declared broken) and :class:`trainer.errors.JobCodeError` (the
        job's own code raised).
        """
        dtype = PRECISIONS[self.precision]
        cast = (torch.autocast(self.device.type, dtype=dtype) if dtype is not None
                else contextlib.nullcontext())
        if not self.module.training:
            self.module.train()
        held: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        busy = loss_sum = 0.0
        oom = 0
        started = time.perf_counter()
        for op in ops:
            mb = micros[op.micro]
            if op.kind == FORWARD:
                if self.prev is None:
                    assert inputs is not None
                    x, x_in = inputs(mb.index), None
                else:
                    x = self._take(self.prev, wave, mb, ACT, should_abort)
                    x.requires_grad_(x.is_floating_point())
                    x_in = x
                t0 = time.perf_counter()
                stage = "forward"
                try:
                    with cast, emulate.deferred() as owed:
                        out = self.module(x)
                        if self.next is None:
                            stage = "loss"
                            assert targets is not None
                            loss = self.loss_fn(out, targets(mb.index))
                            loss_sum += float(loss.detach()) * mb.samples
                            out = loss * mb.weight
                        emulated = owed()
                except (KeyboardInterrupt, SystemExit):
                    raise
                except torch.OutOfMemoryError as e:
                    oom = max(oom, mb.samples)
                    held[mb.index] = (x_in, None)
                    if self.next is not None:
                        self._post(self._spoiled_output(x, cast, mb, e), self.next, wave, mb,
                                   ACT)
                    continue
                except Exception as e:  # noqa: BLE001 - the user's code
                    raise JobCodeError(stage, self._step(), mb.samples, e) from e
                busy += self._pace(t0, emulated)
                held[mb.index] = (x_in, out)
                if self.next is not None:
                    self._post(out, self.next, wave, mb, ACT)
            else:
                x_in, out = held.pop(mb.index)
                grad = (None if self.next is None
                        else self._take(self.next, wave, mb, GRAD, should_abort))
                t0 = time.perf_counter()
                spoiled = out is None  # its forward ran out of memory
                if not spoiled:
                    try:
                        with emulate.deferred() as owed:
                            out.backward(grad)
                            emulated = owed()
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    except torch.OutOfMemoryError:
                        oom, spoiled = max(oom, mb.samples), True
                    except Exception as e:  # noqa: BLE001 - the user's code
                        raise JobCodeError("backward", self._step(), mb.samples, e) from e
                    else:
                        busy += self._pace(t0, emulated)
                if self.prev is not None:
                    assert x_in is not None
                    g = (torch.full_like(x_in, float("nan")) if spoiled
                         else x_in.grad if x_in.grad is not None else torch.zeros_like(x_in))
                    self._post(g, self.prev, wave, mb, GRAD)
        self.finish_sends(should_abort)
        ended = time.perf_counter()
        if oom:  # this stage's gradients too: no copy of the wave's pack is usable
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        return StageStats(busy, ended - started, loss_sum, started, ended, oom)

    def _spoiled_output(self, x: Any, cast: Any, mb: Micro, e: BaseException) -> torch.Tensor:
        """NaN in the shape and dtype this stage's output of ``x`` has: the pass run again
        without a graph (no activations kept), else on the meta device. Raises
        :class:`trainer.errors.JobCodeError` when neither tells the shape."""
        try:
            with torch.no_grad(), cast:
                out = self.module(x)
        except torch.OutOfMemoryError:
            try:
                meta = {k: v.to("meta") for k, v in (*self.module.named_parameters(),
                                                     *self.module.named_buffers())}
                with torch.no_grad():
                    out = torch.func.functional_call(self.module, meta, (x.to("meta"),))
                out = torch.empty(out.shape, dtype=out.dtype, device=self.device)
            except Exception:  # noqa: BLE001 - no shape: the out of memory is the error
                raise JobCodeError("forward", self._step(), mb.samples, e) from e
        return torch.full_like(out, float("nan"))

    def _pace(self, t0: float, emulated: float = 0.0) -> float:
        """The pass's time: its compute plus the emulated layers' tally, times ``slowdown``
        (one sleep for both); on a GPU the compute stream is waited for first."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        dt = time.perf_counter() - t0
        owe = self.slowdown * (dt + emulated) - dt
        if owe > 0:
            time.sleep(owe)
        return time.perf_counter() - t0
