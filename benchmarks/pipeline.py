"""Benchmark: HetPipe virtual workers (issue 19): gradients, bubble, partition, WSP,
revocations, and time to a target loss against the ring.

Design. Each figure comes from the pipeline's own parts (:mod:`trainer.pipeline.local`: every
rank a forked process over real gloo groups, the ring's ranks too; the revocation: real
worker processes around an in-process coordinator), and stage compute is **emulated** with sleeps
(:mod:`trainer.pipeline.emulate`: real small math plus a known sleep; 2 shared cores cannot
compute 4-8 stages at once). What is emulated is listed in ``emulated``. Figures (one JSON
line on stdout):

* ``grad_rel_err``: ||g - g1|| / ||g1|| between the gradient two virtual workers of four
  stages reduce at D = 0 and one process's on the same micro-batches, fp32, the worse of
  GPipe and 1F1B (goal <= 1e-6). Real compute.
* ``bubble_excess`` (1F1B) and ``bubble_excess_gpipe``: measured idle share of one virtual
  worker of ``--stages`` stages, each 50 ms per micro-batch (forward + backward, emulated),
  ``--micro-batches`` m, minus ``(k - 1) / (m + k - 1)`` (goal <= 0.03).
* ``partition_step_ratio``: a wave of one virtual worker whose members are ``--slowdowns``
  times slower, on a GPT-2-small-like per-layer profile (FLOPs, or ``--profile FILE`` measured
  by ``benchmarks/pipeline_profile.py`` on a GPU), laid out by
  :func:`trainer.pipeline.partition.decide`, against the ideal ``(sum W / sum s) (m + k - 1)``
  (goal <= 1.10).
* ``wsp_max_ahead`` and ``wsp_bound``: two virtual workers, one twice as slow, equal shares,
  bound ``--staleness``: the most waves the fast one started beyond what the slow one had
  finished (never above the bound).
* ``stage_revoke_waves_lost``, ``stage_revoke_recover_s``, ``stage_replace_s``,
  ``stage_notice_waves_lost``: real processes, two virtual workers of two stages
  (tests/trainer/jobs/pipe.py): a stage member SIGKILLed mid-training (waves lost, goal <= 1;
  kill -> the survivors' first wave), a replacement (its admission -> its first wave in the
  dead member's slot, its stage moved from the other virtual worker), then a SIGTERM (waves
  lost, goal 0). ``wave_s``: the median wave before the kill.
  ``stage_revoke_waves_lost_wsp``: the same kill at staleness ``--staleness`` (the worst of
  ``--trials`` runs, each in ``stage_revoke_wsp_runs``): the waves of computed work the
  completion of the waves started and not agreed computes again (goal <= 1).
* ``ttt_*``: time to a target loss (``--target`` x the first wave's) of the same small real
  model (emulated per-sample compute) on 4 members ``--ttt-slowdowns`` times slower: the
  ring with heterogeneity-aware batches (sizes in proportion to speed) against two virtual
  workers of two stages, both at D = 0 on the same global batch (so the same loss per step);
  ``ttt_ratio`` = pipeline / ring (< 1: virtual workers win). ``--ballast-mb`` adds that many
  MB of parameters per layer (gradients on the wire, no compute): the communication-bound
  case.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from _common import REPO, Ring, emit, setup_logging, wait_for
from pipeline_profile import flops_profile

from trainer.pipeline import local, partition, wsp
from trainer.pipeline import schedule as sc
from trainer.pipeline.emulate import SleepyLayer, deferred, sleepy_mlp
from trainer.data.sampler import scale_sizes
from trainer.collective.step import Stepper

log = logging.getLogger("benchmarks.pipeline")
F = torch.nn.functional
JOB = REPO / "tests" / "trainer" / "jobs" / "pipe.py"


def _seeded(build: Callable[[], torch.nn.Sequential]) -> Callable[[], torch.nn.Sequential]:
    def make() -> torch.nn.Sequential:
        torch.manual_seed(0)
        return build()
    return make


def _data(waves: int, micro: int, count: int, width: int, seed: int = 1
          ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(micro, width, generator=g), torch.randint(0, 4, (micro,), generator=g))
             for _ in range(count)] for _ in range(waves)]


def _square(out: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def _sgd(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.05)


# -- gradients ------------------------------------------------------------------------------


def grad_rel_err(micro: int) -> float:
    make = _seeded(lambda: sleepy_mlp(32, [0.0] * 7, classes=4))
    layout = partition.Layout(((0, 1, 2, 3), (4, 5, 6, 7)), (0, 2, 4, 6, 8), (1.0, 1.0))
    wave = _data(1, micro, 8, 32)
    ref = make()
    total = sum(int(y.shape[0]) for _, y in wave[0])
    for x, y in wave[0]:
        (F.cross_entropy(ref(x), y) * y.shape[0] / total).backward()
    worst = 0.0
    for kind in ("gpipe", "1f1b"):
        res = local.run(make, layout, wave, loss_fn=F.cross_entropy, make_optimizer=_sgd,
                        kind=kind, record=True, processes=True)
        num = sum(float(((res.grads[n] - p.grad) ** 2).sum()) for n, p in ref.named_parameters())
        den = sum(float((p.grad ** 2).sum()) for p in ref.parameters())
        worst = max(worst, (num / den) ** 0.5)
    return worst


# -- the bubble and the partition -------------------------------------------------------------


def _wave_spans(res: local.Result, ranks: Sequence[int], skip: int = 1
                ) -> list[tuple[float, float]]:
    """Per wave (after ``skip``): (makespan, sum of busy seconds) over ``ranks``."""
    n = min(len(res.stats[r]) for r in ranks)
    out = []
    for w in range(skip, n):
        st = [res.stats[r][w] for r in ranks]
        out.append((max(s.ended for s in st) - min(s.started for s in st),
                    sum(s.busy_s for s in st)))
    return out


def bubble(k: int, m: int, micro: int, stage_ms: float, waves: int, kind: str) -> float:
    per_sample = stage_ms / 1000 / (6 * micro)  # two layers per stage, backward = 2 forwards
    make = _seeded(lambda: sleepy_mlp(16, [per_sample] * (2 * k)))
    layout = partition.Layout((tuple(range(k)),), tuple(2 * j for j in range(k + 1)), (1.0,))
    res = local.run(make, layout, _data(waves, micro, m, 16), loss_fn=_square,
                    make_optimizer=_sgd, kind=kind, processes=True)
    spans = _wave_spans(res, range(k))
    idle = statistics.mean(1 - busy / (k * span) for span, busy in spans)
    return idle - sc.bubble(m, k)


def _profile(path: Path | None) -> tuple[list[float], str]:
    if path is None:
        return [float(x["seconds"]) for x in flops_profile()], "flops (GPT-2 small)"
    d = json.loads(path.read_text())
    return [float(x["seconds"]) for x in d["layers"]], f"measured: {d.get('device', path)}"


def partition_ratio(slowdowns: Sequence[float], m: int, micro: int, work_ms: float,
                    waves: int, profile: Path | None) -> dict[str, Any]:
    raw, source = _profile(profile)
    scale = work_ms / 1000 / micro / sum(raw)  # the whole model, one micro-batch: work_ms
    costs = [c * scale for c in raw]
    k = len(slowdowns)
    speeds = [1.0 / f for f in slowdowns]
    settings = partition.Settings(k, micro, "1f1b", 2, m)
    lay = partition.decide([partition.Candidate(r, s) for r, s in enumerate(speeds)],
                           partition.Costs(tuple(costs), (0.0,) * len(costs), (0.0,) * len(costs)),
                           settings)
    assert lay is not None
    make = _seeded(lambda: torch.nn.Sequential(*[SleepyLayer(16, c / 3) for c in costs]))
    res = local.run(make, lay, _data(waves, micro, m, 16), loss_fn=_square,
                    make_optimizer=_sgd, kind="1f1b", slowdowns=slowdowns, processes=True)
    measured = statistics.median(span for span, _ in _wave_spans(res, range(k)))
    ideal = micro * sum(costs) / sum(speeds) * (m + k - 1)
    return {"partition_step_ratio": measured / ideal, "partition_bounds": list(lay.bounds),
            "partition_stage_of": {str(r): lay.slot_of(r)[1] for r in range(k)},
            "profile": source}


# -- WSP ----------------------------------------------------------------------------------------


def wsp_ahead(staleness: int, waves: int, micro: int) -> int:
    per_sample = 0.010 / (3 * micro)  # 10 ms per stage per micro-batch
    make = _seeded(lambda: sleepy_mlp(16, [per_sample] * 2))
    layout = partition.Layout(((0, 1), (2, 3)), (0, 1, 2), (1.0, 1.0))
    res = local.run(make, layout, _data(waves, micro, 4, 16), loss_fn=_square,
                    make_optimizer=_sgd, staleness=staleness, slowdowns=[1.0, 1.0, 2.0, 2.0],
                    counts=[2, 2], processes=True)
    return wsp.max_ahead(res.events)


# -- time to a target loss: the ring against virtual workers -----------------------------------


class _Ballast(torch.nn.Module):
    """A layer plus ``n`` parameters that only travel (gradient zeros, no compute)."""

    def __init__(self, layer: torch.nn.Module, n: int) -> None:
        super().__init__()
        self.layer, self.ballast = layer, torch.nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) + 0.0 * self.ballast[0]


def _ttt_setup(sample_ms: float, ballast_mb: float, n: int = 1024, width: int = 16
               ) -> tuple[Callable[[], torch.nn.Sequential], torch.Tensor, torch.Tensor]:
    per_layer = sample_ms / 1000 / 8 / 3
    extra = int(ballast_mb * (1 << 20) / 4)

    def build() -> torch.nn.Sequential:
        body = [SleepyLayer(width, per_layer) for _ in range(8)]
        if extra:
            body = [_Ballast(b, extra) for b in body]
        return torch.nn.Sequential(*body, torch.nn.Linear(width, 1))

    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, width, generator=g)
    a = torch.randn(width, 4, generator=g) / width ** 0.5
    y = torch.tanh(x @ a).sum(1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=g)
    return _seeded(build), x, y


def _adam(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.parameters(), lr=5e-3)


def ring_ttt(make: Callable[[], torch.nn.Sequential], x: torch.Tensor, y: torch.Tensor,
             slowdowns: Sequence[float], batch: int, target: float, max_steps: int
             ) -> tuple[float, int]:
    """The ring's steps (trainer.collective.step.Stepper), each rank a forked process as the pipeline's
    are; sizes in proportion to speed. Returns (seconds from the first step to the one
    reaching ``target``, steps)."""
    import multiprocessing

    world = len(slowdowns)
    sizes = scale_sizes([round(1000 / f) for f in slowdowns], batch)
    models = [make() for _ in range(world)]
    timeout = datetime.timedelta(seconds=120)
    fd, path = tempfile.mkstemp(prefix="bench-ring-store-")  # a file: no server thread
    os.close(fd)
    os.unlink(path)
    ctx = multiprocessing.get_context("fork")
    local.warm_up()
    q = ctx.Queue()

    def main(rank: int) -> None:
        model = models[rank]
        st = torch.distributed.FileStore(path, world)
        pg = local._gloo(torch.distributed.PrefixStore("r/", st), rank, world, timeout)
        stepper = Stepper(model, _adam(model), F.mse_loss, world=world, rank=rank,
                          device=torch.device("cpu"))
        pg.allreduce([torch.zeros(1)]).wait()
        t0 = time.perf_counter()
        for step in range(max_steps):
            lo = (step * batch) % len(x) + sum(sizes[:rank])
            ids = torch.arange(lo, lo + sizes[rank]) % len(x)
            with deferred() as owed:  # the emulated compute, slowed down, in one sleep
                def pace(dt: float, _b: int) -> None:
                    time.sleep(max(0.0, slowdowns[rank] * (dt + owed()) - dt))

                res = stepper.step(pg, (x[ids], y[ids]), sizes[rank], batch, step=step,
                                   latest=0, eval_s=0.0, should_abort=lambda: False,
                                   after_compute=pace)
            if res.loss <= target:
                break
        q.put((rank, time.perf_counter() - t0, step + 1))

    procs = [ctx.Process(target=main, args=(r,), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, secs, steps = q.get(timeout=600)
        got[rank] = (secs, steps)
    for p in procs:
        p.join(5)
    if os.path.exists(path):
        os.unlink(path)
    return got[0]


def time_to_target(slowdowns: Sequence[float], batch: int, micro: int, sample_ms: float,
                   target_frac: float, ballast_mb: float, max_steps: int) -> dict[str, Any]:
    make, x, y = _ttt_setup(sample_ms, ballast_mb)
    with torch.no_grad():
        first = float(F.mse_loss(make()(x[:batch]), y[:batch]))
    target = target_frac * first
    ring_s, ring_steps = ring_ttt(make, x, y, slowdowns, batch, target, max_steps)
    n = len(x)
    waves = []
    for t in range(max_steps):
        ids = torch.arange(t * batch, (t + 1) * batch) % n
        waves.append([(x[ids[i:i + micro]], y[ids[i:i + micro]]) for i in range(0, batch, micro)])
    speeds = [1.0 / f for f in slowdowns]
    costs = partition.Costs((1.0,) * 8 + (0.0,), (0.0,) * 9, (0.0,) * 9)
    lay = partition.decide([partition.Candidate(r, s) for r, s in enumerate(speeds)], costs,
                           partition.Settings(2, micro, "1f1b", 2, batch // micro))
    assert lay is not None
    res = local.run(make, lay, waves, loss_fn=F.mse_loss, make_optimizer=_adam, kind="1f1b",
                    slowdowns=slowdowns, stop_loss=target, processes=True)
    starts = [s.started for st in res.stats.values() for s in st]
    ends = [s.ended for st in res.stats.values() for s in st]
    pipe_s = max(ends) - min(starts)
    return {"ttt_ring_s": ring_s, "ttt_pipeline_s": pipe_s, "ttt_ratio": pipe_s / ring_s,
            "ttt_ring_steps": ring_steps, "ttt_pipeline_waves": len(res.losses),
            "ttt_ballast_mb_per_layer": ballast_mb}


# -- a stage revoked, with real worker processes ----------------------------------------------


def _records(ring: Ring, name: str) -> list[dict[str, Any]]:
    return ring.metrics(name) if ring.metrics_path(name).exists() else []


def revoke(workdir: Path, layer_ms: float, settle: int, staleness: int = 0) -> dict[str, Any]:
    env = {"PIPE_EPOCHS": "200", "PIPE_LAYER_MS": str(layer_ms), "OMP_NUM_THREADS": "1",
           "PIPE_D": str(staleness)}
    with Ring(workdir, job=JOB, env=env, initial_world=4, heartbeat_timeout_s=2.0) as ring:
        names = ["a", "b", "c", "d"]
        for n in names:
            ring.add_worker(n)
        ring.wait_step(settle, 120)
        last = {n: _records(ring, n)[-1] for n in names}
        victim = next(n for n in names if last[n].get("slot") == [1, 1])
        quitter = next(n for n in names if last[n].get("slot") == [0, 1])
        waves = sorted(r["t"] for r in _records(ring, quitter))
        wave_s = statistics.median(b - a for a, b in zip(waves, waves[1:]))
        gen = max(r["generation"] for r in _records(ring, quitter))
        os.kill(ring.procs[victim].pid, signal.SIGKILL)
        t_kill = time.time()
        ring.add_worker("e")
        survivors = [n for n in names if n != victim]
        wait_for(lambda: any(r["generation"] > gen for n in survivors for r in _records(ring, n)),
                 60, "the survivors' first wave")
        recover = min(r["t"] for n in survivors for r in _records(ring, n)
                      if r["generation"] > gen) - t_kill
        wait_for(lambda: bool(_records(ring, "e")), 120, "the replacement's first wave")
        joined = [e["time"] for e in ring.coordinator.events() if e["kind"] == "join"
                  and e["name"] == "e"][0]
        replace = _records(ring, "e")[0]["t"] - joined
        lost_kill = ring.coordinator.stats()["steps_lost"]
        slot_e = _records(ring, "e")[0].get("slot")
        ring.procs[quitter].send_signal(signal.SIGTERM)
        ring.procs[quitter].wait(60)
        step = ring.step()
        ring.wait_step(step + 3, 60)
        lost_notice = ring.coordinator.stats()["steps_lost"] - lost_kill
    return {"stage_revoke_waves_lost": lost_kill, "stage_revoke_recover_s": recover,
            "stage_replace_s": replace, "stage_notice_waves_lost": lost_notice,
            "wave_s": wave_s, "replacement_slot": slot_e}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2, help="timing figures: the best of this "
                    "many runs (and the worst, *_worst): the host is shared")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=8, help="m per wave (bubble)")
    ap.add_argument("--micro", type=int, default=8, help="micro-batch size")
    ap.add_argument("--stage-ms", type=float, default=50.0)
    ap.add_argument("--waves", type=int, default=4, help="bubble and partition (the first "
                    "is left out)")
    ap.add_argument("--slowdowns", default="1,1.5,2,3", help="partition: one per stage")
    ap.add_argument("--work-ms", type=float, default=200.0,
                    help="partition: the whole model, one micro-batch, speed 1")
    ap.add_argument("--profile", type=Path, default=None,
                    help="per-layer profile JSON (benchmarks/pipeline_profile.py)")
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--ttt-slowdowns", default="1,1,2,2")
    ap.add_argument("--ttt-sample-ms", type=float, default=3.0)
    ap.add_argument("--target", type=float, default=0.3)
    ap.add_argument("--ballast-mb", type=float, default=0.0)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--revoke-layer-ms", type=float, default=0.3)
    ap.add_argument("--settle", type=int, default=10, help="waves before the kill")
    ap.add_argument("--skip-revoke", action="store_true")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    setup_logging(a.verbose)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"grad_rel_err": grad_rel_err(a.micro)}
    k, m, n = a.stages, a.micro_batches, max(1, a.trials)
    out["bubble_formula"] = sc.bubble(m, k)
    for kind, key in (("1f1b", "bubble_excess"), ("gpipe", "bubble_excess_gpipe")):
        runs = [bubble(k, m, a.micro, a.stage_ms, a.waves, kind) for _ in range(n)]
        out[key], out[f"{key}_worst"] = min(runs), max(runs)
    runs = [partition_ratio([float(s) for s in a.slowdowns.split(",")], m, a.micro,
                            a.work_ms, a.waves, a.profile) for _ in range(n)]
    out.update(min(runs, key=lambda r: r["partition_step_ratio"]))
    out["partition_step_ratio_worst"] = max(r["partition_step_ratio"] for r in runs)
    out["wsp_bound"] = a.staleness
    out["wsp_max_ahead"] = max(wsp_ahead(a.staleness, 10, a.micro) for _ in range(n))
    runs = [time_to_target([float(s) for s in a.ttt_slowdowns.split(",")], 64, a.micro,
                           a.ttt_sample_ms, a.target, a.ballast_mb, a.max_steps)
            for _ in range(n)]
    out.update(min(runs, key=lambda r: r["ttt_ring_s"]))
    best_pipe = min(runs, key=lambda r: r["ttt_pipeline_s"])
    out["ttt_pipeline_s"], out["ttt_pipeline_waves"] = (best_pipe["ttt_pipeline_s"],
                                                        best_pipe["ttt_pipeline_waves"])
    out["ttt_ratio"] = out["ttt_pipeline_s"] / out["ttt_ring_s"]
    if not a.skip_revoke:
        work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
        out.update(revoke(work / "sync", a.revoke_layer_ms, a.settle))
        wsp_runs = [revoke(work / f"wsp{i}", a.revoke_layer_ms, a.settle, a.staleness)
                    for i in range(n)]
        out["stage_revoke_waves_lost_wsp"] = max(r["stage_revoke_waves_lost"] for r in wsp_runs)
        out["stage_revoke_wsp_runs"] = [r["stage_revoke_waves_lost"] for r in wsp_runs]
    out["emulated"] = ["bubble_excess", "bubble_excess_gpipe", "partition_step_ratio",
                       "wsp_max_ahead", "stage_revoke_recover_s", "stage_replace_s", "wave_s",
                       "ttt_*: per-sample compute (the model and its losses are real)"]
    out["seconds"] = time.perf_counter() - t0
    out["load_avg_1m"] = os.getloadavg()[0]  # the host is shared: timings move with it
    emit({k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in out.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
