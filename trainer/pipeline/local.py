"""Virtual workers as threads of one process, over real gloo groups: the bench and the tests.

Design. A member of a real job does much more than train (generations, moves, reports); to
measure the pipeline itself (gradients against one process, the bubble, the partition, the
WSP gate) :func:`run` plays one fixed layout for a few waves with the same parts a member
uses: each rank is a thread with its own copy of the model, its stage's
:class:`~trainer.pipeline.runner.StageRunner` on a ``ProcessGroupGloo`` of all ranks, a
stage group per stage, :class:`~trainer.pipeline.stagestate.StagePack` and
:class:`~trainer.pipeline.agree.Agreement`, and the gate of :mod:`trainer.pipeline.wsp`.
Sleeps (emulated layers, the runner's ``slowdown``) release the GIL, so the threads overlap
as processes would; real compute would not (keep it small).

Rule for callers: give a layout whose ranks are ``0 .. world - 1``; the same ``make_model``
must build the same weights each call (seed it).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainer.pipeline import agree, partition, wsp
from trainer.pipeline.agree import Agreement
from trainer.pipeline.runner import Micro, StageRunner, StageStats
from trainer.pipeline.schedule import schedule
from trainer.pipeline.stagestate import ModelIndex, StagePack


@dataclass
class Result:
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


def run(make_model: Callable[[], torch.nn.Sequential], layout: partition.Layout,
        waves: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]], *,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
        kind: str = "1f1b", staleness: int = 0, slowdowns: Sequence[float] | None = None,
        counts: Sequence[int] | None = None, record: bool = False,
        timeout_s: float = 60.0) -> Result:
    """Train ``len(waves)`` waves; ``waves[t]`` is wave ``t``'s micro-batches ``(x, y)`` in
    order, split over the VWs by ``layout.rates`` (or ``counts``, fixed micro-batches per
    VW). ``slowdowns[rank]``: the runner's emulated slowdown. Raises ``RuntimeError`` when a
    rank failed (with its exception)."""
    world = sum(len(row) for row in layout.vws) + len(layout.spares)
    store = dist.HashStore()
    timeout = datetime.timedelta(seconds=timeout_s)
    out = Result()
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(world)

    models = [make_model() for _ in range(world)]  # here: seeding is process-wide

    def rank_main(rank: int) -> None:
        model = models[rank]
        opt = make_optimizer(model)
        index = ModelIndex(model, opt)
        pg = _gloo(dist.PrefixStore("g/", store), rank, world, timeout)
        slot = layout.slot_of(rank)
        lo, hi = layout.layers_of(rank)
        k, n_vw = layout.stages, len(layout.vws)
        stage_pg = runner = pack = None
        if slot is not None:
            v, j = slot
            if n_vw > 1:
                stage_pg = _gloo(dist.PrefixStore(f"g/s{j}/", store), v, n_vw, timeout)
            row = layout.vws[v]
            runner = StageRunner(torch.nn.Sequential(*index.modules[lo:hi]), pg=pg,
                                 prev=row[j - 1] if j > 0 else None,
                                 next_=row[j + 1] if j < k - 1 else None, loss_fn=loss_fn,
                                 device=torch.device("cpu"),
                                 slowdown=(slowdowns or [1.0] * world)[rank])
            pack = StagePack(index.params(lo, hi), index.buffers(lo, hi))
        sync = Agreement(stage_pg, pg, world, lambda: False)
        pending: list[list[torch.Tensor]] = []
        applied = 0
        names = {id(p): n for n, p in model.named_parameters()}

        def apply_one() -> None:
            nonlocal applied
            got = sync.wait(applied)
            if record and applied == 0 and pack is not None and got.pack is not None:
                o = 0
                for p in pack.params:
                    with lock:
                        out.grads[names[id(p)]] = got.pack[o:o + p.numel()].view_as(p).clone()
                    o += p.numel()
            pending.pop(0)
            if pack is not None and got.pack is not None:
                pack.apply(got.pack, opt, pending)
            if rank == 0:
                total = sum(int(y.shape[0]) for _, y in waves[applied])
                out.losses.append(float(got.rows[:, agree.LOSS].sum()) / total)
            applied += 1

        start.wait()
        for t, micros in enumerate(waves):
            while applied < wsp.needed_before(t, staleness):
                apply_one()
            sizes = [int(y.shape[0]) for _, y in micros]
            total = sum(sizes)
            split = counts or partition.split_micro(len(micros), layout.rates, k)
            rows = torch.zeros(world, agree.ROW, dtype=torch.float64)
            flat = None
            if slot is not None:
                v, j = slot
                first = sum(split[:v])
                mine = [micros[first + i] for i in range(split[v])]
                if j == 0:
                    with lock:
                        out.events.append(wsp.WaveEvent(time.perf_counter(), v, wsp.START, t))
                before = pack.live_buffers()
                stats = runner.run(
                    schedule(kind, len(mine), k, j),
                    [Micro(i, int(y.shape[0]), int(y.shape[0]) / total)
                     for i, (_, y) in enumerate(mine)], t,
                    (lambda i: mine[i][0]) if j == 0 else None,
                    (lambda i: mine[i][1]) if j == k - 1 else None, lambda: False)
                flat, deltas = pack.pack(before, torch.device("cpu"))
                pending.append(deltas)
                rows[rank, agree.LOSS] = stats.loss_sum
                with lock:
                    out.stats.setdefault(rank, []).append(stats)
                    if j == 0:
                        out.events.append(wsp.WaveEvent(stats.ended, v, wsp.DONE, t))
            else:
                pending.append([])
            sync.submit(t, flat, rows)
            del sizes
        while applied < len(waves):
            apply_one()
        sync.stop()
        held = index.state(lo, hi)
        with lock:
            out.params[rank] = {n: p.detach().clone() for n, p in model.named_parameters()
                                if n in held}
            out.buffers[rank] = {n: b.detach().clone() for n, b in model.named_buffers()
                                 if n in held}

    def guarded(rank: int) -> None:
        try:
            rank_main(rank)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            with lock:
                errors.append(e)
            start.abort()

    threads = [threading.Thread(target=guarded, args=(r,), daemon=True) for r in range(world)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout_s * 4)
    out.wall_s = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"a rank failed: {errors[0]!r}") from errors[0]
    if any(th.is_alive() for th in threads):
        raise RuntimeError("a rank did not finish in time")
    return out


def _gloo(store: Any, rank: int, world: int, timeout: datetime.timedelta) -> Any:
    """A gloo group on loopback (no host name lookup)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, world, opts)
