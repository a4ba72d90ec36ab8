"""Virtual workers as threads of one process, over real gloo groups: the bench and the tests.

Design. A member of a real job does much more than train (generations, moves, reports); to
measure the pipeline itself (gradients against one process, the bubble, the partition, the
WSP gate) :func:`run` plays one fixed layout for a few waves with the same parts a member
uses: each rank is a thread with its own copy of the model (only its stage's layers kept,
:mod:`trainer.pipeline.placement`), its stage's
:class:`~trainer.pipeline.runner.StageRunner` on a ``ProcessGroupGloo`` of all ranks, a
stage group per stage, :class:`~trainer.pipeline.stagestate.StagePack` and
:class:`~trainer.pipeline.agree.Agreement`, and the gate of :mod:`trainer.pipeline.wsp`.
Sleeps (emulated layers, the runner's ``slowdown``) release the GIL, so the threads overlap
as processes would; real compute would not (keep it small).

Rule for callers: give a layout whose ranks are ``0 .. world - 1``; the same ``make_model``
must build the same weights each call (seed it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainer.pipeline import agree, partition, placement, wsp
from trainer.pipeline.agree import Agreement
from trainer.pipeline.runner import Micro, StageRunner, StageStats
from trainer.pipeline.schedule import schedule
from trainer.pipeline.stagestate import ModelIndex, StagePack


@dataclass
class LocalResult:
    """What :func:`run` saw: per rank, its stage's stats per wave and (``record``) the
    reduced gradients of wave 0 by parameter name; the VWs' wave events; each rank's final
    parameters and buffers of its stage; the loss of every wave; the wall time."""

    stats: dict[int, list[StageStats]] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    events: list[wsp.WaveEvent] = field(default_factory=list)
    params: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    buffers: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    wall_s: float = 0.0
    losses: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _Job:
    """What every rank of :func:`run` needs (see there)."""

    layout: partition.Layout
    waves: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]
    kind: str
    staleness: int
    slowdowns: Sequence[float]
    counts: Sequence[int] | None
    record: bool
    stop_loss: float | None
    timeout: datetime.timedelta
    world: int


def run(make_model: Callable[[], torch.nn.Sequential], layout: partition.Layout,
        waves: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]], *,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
        kind: str = "1f1b", staleness: int = 0, slowdowns: Sequence[float] | None = None,
        counts: Sequence[int] | None = None, record: bool = False,
        stop_loss: float | None = None, processes: bool = False,
        timeout_s: float = 60.0) -> LocalResult:
    """Train ``len(waves)`` waves; ``waves[t]`` is wave ``t``'s micro-batches ``(x, y)`` in
    order, split over the VWs by ``layout.rates`` (or ``counts``, fixed micro-batches per
    VW). ``slowdowns[rank]``: the runner's emulated slowdown. ``stop_loss``: stop after the
    first wave whose loss is at most this (synchronous only: every rank reads the same reduced
    loss before starting the next wave). ``processes``: each rank a forked process (no GIL
    shared between stages: what timing figures need) instead of a thread. Raises
    ``RuntimeError`` when a rank failed (with its exception)."""
    if stop_loss is not None and staleness:
        raise ValueError("stop_loss needs staleness 0")
    world = sum(len(row) for row in layout.vws) + len(layout.spares)
    job = _Job(layout, waves, loss_fn, make_optimizer, kind, staleness,
               list(slowdowns or [1.0] * world), counts, record, stop_loss,
               datetime.timedelta(seconds=timeout_s), world)
    models = [make_model() for _ in range(world)]  # here: seeding is process-wide
    t0 = time.perf_counter()
    parts = _in_processes(job, models) if processes else _in_threads(job, models)
    out = LocalResult(wall_s=time.perf_counter() - t0)
    for part in parts:
        for k, v in part.stats.items():
            out.stats[k] = v
        out.grads.update(part.grads)
        out.events += part.events
        out.params.update(part.params)
        out.buffers.update(part.buffers)
        out.losses += part.losses
    return out


def _in_threads(job: _Job, models: list[torch.nn.Sequential]) -> list[LocalResult]:
    store = dist.HashStore()
    parts = [LocalResult() for _ in range(job.world)]
    errors: list[BaseException] = []

    def guarded(rank: int) -> None:
        try:
            parts[rank] = _rank(job, rank, models[rank], store)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(r,), daemon=True)
               for r in range(job.world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(job.timeout.total_seconds() * 4)
    if errors:
        raise RuntimeError(f"a rank failed: {errors[0]!r}") from errors[0]
    if any(th.is_alive() for th in threads):
        raise RuntimeError("a rank did not finish in time")
    return parts


def warm_up() -> None:
    """Pay here, once, what every forked rank would pay again: an optimiser's first step
    imports ``torch._dynamo`` (about 2 s of CPU)."""
    p = torch.nn.Parameter(torch.zeros(1))
    p.sum().backward()
    torch.optim.SGD([p], lr=0.0).step()


def _in_processes(job: _Job, models: list[torch.nn.Sequential]) -> list[LocalResult]:
    import multiprocessing

    warm_up()
    ctx = multiprocessing.get_context("fork")  # the models and the job, without pickling
    fd, path = tempfile.mkstemp(prefix="spotring-local-store-")  # a file: no server thread
    os.close(fd)  # in this process while it forks
    os.unlink(path)
    q = ctx.Queue()

    def child(rank: int) -> None:
        try:
            st = dist.FileStore(path, job.world)
            part = _rank(job, rank, models[rank], st)
            q.put((rank, _tensors(part, lambda t: t.numpy()), None))  # by value, not by fd
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            q.put((rank, None, repr(e)))

    procs = [ctx.Process(target=child, args=(r,), daemon=True) for r in range(job.world)]
    for p in procs:
        p.start()
    parts: list[LocalResult] = []
    try:
        for _ in procs:
            rank, part, err = q.get(timeout=job.timeout.total_seconds() * 4)
            if err is not None:
                raise RuntimeError(f"rank {rank} failed: {err}")
            parts.append(_tensors(part, torch.from_numpy))
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return parts


def _tensors(part: LocalResult, fn: Callable[[Any], Any]) -> LocalResult:
    part.grads = {k: fn(v) for k, v in part.grads.items()}
    part.params = {r: {k: fn(v) for k, v in d.items()} for r, d in part.params.items()}
    part.buffers = {r: {k: fn(v) for k, v in d.items()} for r, d in part.buffers.items()}
    return part


def _rank(job: _Job, rank: int, model: torch.nn.Sequential, store: Any) -> LocalResult:
    """One rank's waves (a thread or a forked process); returns what it saw."""
    out = LocalResult()
    layout, world, waves = job.layout, job.world, job.waves
    opt = job.make_optimizer(model)
    index = ModelIndex(model, opt)
    lo, hi = job.layout.layers_of(rank)
    index.place(placement.decide(len(index), lo, hi), torch.device("cpu"), opt)  # as a member
    pg = _gloo(dist.PrefixStore("g/", store), rank, world, job.timeout)
    slot = layout.slot_of(rank)
    k, n_vw = layout.stages, len(layout.vws)
    stage_pg = runner = pack = None
    if slot is not None:
        v, j = slot
        if n_vw > 1:
            stage_pg = _gloo(dist.PrefixStore(f"g/s{j}/", store), v, n_vw, job.timeout)
        row = layout.vws[v]
        runner = StageRunner(torch.nn.Sequential(*index.modules[lo:hi]), pg=pg,
                             prev=row[j - 1] if j > 0 else None,
                             next_=row[j + 1] if j < k - 1 else None, loss_fn=job.loss_fn,
                             device=torch.device("cpu"), slowdown=job.slowdowns[rank])
        pack = StagePack(index.params(lo, hi), index.buffers(lo, hi))
    sync = Agreement(stage_pg, pg, world, lambda: False)
    pending: list[list[torch.Tensor]] = []
    applied = 0
    reached = False
    names = {id(p): n for n, p in model.named_parameters()}

    def apply_one() -> None:
        nonlocal applied, reached
        got = sync.wait(applied)
        if job.record and applied == 0 and pack is not None and got.pack is not None:
            o = 0
            for p in pack.params:
                out.grads[names[id(p)]] = got.pack[o:o + p.numel()].view_as(p).clone()
                o += p.numel()
        pending.pop(0)
        if pack is not None and got.pack is not None:
            pack.apply(got.pack, opt, pending)
        loss = float(got.rows[:, agree.LOSS].sum()) / sum(
            int(y.shape[0]) for _, y in waves[applied])
        if rank == 0:
            out.losses.append(loss)
        reached = job.stop_loss is not None and loss <= job.stop_loss
        applied += 1

    ring_barrier = torch.zeros(1)
    pg.allreduce([ring_barrier]).wait()  # every rank starts together
    for t, micros in enumerate(waves):
        while applied < wsp.needed_before(t, job.staleness):
            apply_one()
        if reached:
            break
        total = sum(int(y.shape[0]) for _, y in micros)
        split = job.counts or partition.split_micro(len(micros), layout.rates, k)
        rows = torch.zeros(world, agree.ROW, dtype=torch.float64)
        flat = None
        if slot is not None:
            v, j = slot
            first = sum(split[:v])
            mine = [micros[first + i] for i in range(split[v])]
            if j == 0:
                out.events.append(wsp.WaveEvent(time.perf_counter(), v, wsp.START, t))
            before = pack.live_buffers()
            stats = runner.run(
                schedule(job.kind, len(mine), k, j),
                [Micro(i, int(y.shape[0]), int(y.shape[0]) / total)
                 for i, (_, y) in enumerate(mine)], t,
                (lambda i: mine[i][0]) if j == 0 else None,
                (lambda i: mine[i][1]) if j == k - 1 else None, lambda: False)
            flat, deltas = pack.pack(before, torch.device("cpu"))
            pending.append(deltas)
            rows[rank, agree.LOSS] = stats.loss_sum
            out.stats.setdefault(rank, []).append(stats)
            if j == 0:
                out.events.append(wsp.WaveEvent(stats.ended, v, wsp.DONE, t))
        else:
            pending.append([])
        sync.submit(t, flat, rows)
    while pending:
        apply_one()
    sync.stop()
    held = index.state(lo, hi)
    out.params[rank] = {n: p.detach().clone() for n, p in model.named_parameters() if n in held}
    out.buffers[rank] = {n: b.detach().clone() for n, b in model.named_buffers() if n in held}
    return out


def _gloo(store: Any, rank: int, world: int, timeout: datetime.timedelta) -> Any:
    """A gloo group on loopback (no host name lookup)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, world, opts)
