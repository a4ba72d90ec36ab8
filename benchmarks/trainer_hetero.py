"""Benchmark: heterogeneity-aware batch sizes on a ring of unequal workers (issue 4).

Design. A spotring ring of ``len(--slowdowns)`` workers (default 1, 1.5, 2, 4) trains
examples/digits.py (``--job``) with a constant global batch ``--global-batch`` (512) for
``--steps`` (45); each worker writes one metrics line per step. In the same run, the baseline
is the equal-batch ring on the same job and the same emulated devices
(``benchmarks/_common.py --mode equal`` under the real ``torchrun``).

Emulated devices. The issue asks for workers 1x, 1.5x, 2x, 4x slower than each other. On
this host every worker is a process on a shared CPU (2 cores for 4 workers), so a worker's
real compute time depends on who else computes at the same moment, and the workers all
start computing together (right after each all-reduce). Measured here: with the worker's
``--slowdown F`` (a sleep of ``(F - 1) x batch x`` its running median of *measured* compute
seconds per sample) the sharing slows each worker's real compute by 1.1-2.2x, differently
per worker, and the sleep multiplies that by ``F``: the emulated speeds then depend on one
another and no truth exists to measure sizes against. So by default (``--emulation pace``)
each worker is an emulated *private device*, as a GPU is (``benchmarks/device.py``, which
the workers load as their job: it wraps ``--job`` and pads every forward/backward to the
device's time)::

    t_i(b) = K x F_i x (A + C x b)

``A + C x b`` is the 1x device's line, ``--device-ms A,C`` (default 2 ms + 0.1 ms per
sample: the digits job's forward/backward on one core of this project's 2-vCPU machine,
which measured 0.5-2.5 ms + 0.068-0.11 ms/sample between 02:39 and 03:03 UTC on
2026-11-22, varying with the other tenants' load; a fixed figure keeps runs comparable).
``--device-ms host`` measures this host's line in the run instead (fastest of 9 runs at 6
batch sizes, interleaved). ``K`` is ``--base-slowdown`` (default
``device.default_base_slowdown``: the ring's CPU demand at most half the host, and all
workers computing at once next to the other tenants' load still inside their device time;
3 for the default ring on 2 idle cores, 6 at load 4). The
optimal sizes do not depend on ``K``. The padding sleeps in the backward pass of an identity
placed on the model's input, i.e. after the last gradient is computed; the worker's
``--slowdown`` stays 1. The true speeds are then known exactly, independent of the
other workers, and the relative speeds are the issue's ``F_i``. ``device_fidelity`` reports
whether the emulation held: per worker, the median of measured compute / ``t_i(b)`` over the
steady steps (1.0 = exact; real compute that overran the device shows as > 1), and
``device_overrun`` the share of steady steps measured more than 5 % over ``t_i(b)``.
``--emulation sleep`` runs the old emulation instead (the workers' ``--slowdown K x F_i``,
same truth), to show the coupling.

Figures (one JSON line on stdout):

* ``batch_error``: mean over full steps ``>= --converge-within`` (20) of the mean relative
  distance ``|b_i - b*_i| / b*_i`` between the sizes the ring chose and ``b*``, the integer
  optimum (:func:`trainer.data.batching.optimal_sizes`) for the *true* lines ``t_i`` above, never
  the ring's own estimates. Goal <= 0.02. Steps with a head start (the step after rank 0's
  evaluation, re-split so that rank 0 starts it later: ``head_start_s`` in the metrics) are
  left out of this and the next two figures: their sizes are meant to differ from ``b*``.
* ``batch_error_at``: the same distance at the first full step ``>= --converge-within``.
* ``steps_to_converge``: the first step from which the distance stays within
  ``--tolerance`` (0.02) for the rest of the run (null: never).
* ``idle_fraction``: collective wait / step time, averaged over workers and every step
  ``>= --converge-within`` (epoch tails included). Goal <= 0.03. Additional keys, to say
  where the wait comes from: ``idle_beyond_transfer``, the same less, in each step, the
  wait of the member that reached the collective last (the transfer itself, not idleness);
  ``idle_from_sizing``, ``(max_j compute_j - compute_i) / step_i`` averaged the same way
  (the wait that unequal compute times alone cause: what batch sizing controls; rank 0's
  compute counts its head start);
  ``idle_without_eval_steps``, ``idle_fraction`` without the steps that follow an epoch end
  (rank 0 runs the job's ``evaluate`` there while the others wait in the next collective;
  with digits' 1437 samples and B=512 that is every third step).
* ``speedup_vs_equal``: steady samples/s of spotring / of the equal-batch baseline (same
  devices, same global batch).
* ``base_slowdown`` (K), ``effective_slowdowns`` (``K x F_i``), ``slowdowns`` (``F_i``),
  ``optimal_sizes``, ``chosen_sizes`` (last full step), ``device_line_ms`` (``[A, C]``),
  ``load`` (1-minute load average at the start and at the end).

Rule: run alone, under the shared lock (the figures are ratios, but a loaded machine
inflates wait and noise).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # _common, device

import torch  # noqa: E402

from _common import (  # noqa: E402
    DEFAULT_JOB, Ring, digits_env, emit, read_jsonl, setup_logging, steady_rate, steps_by_number,
    stop, torchrun, wait_for,
)
from device import (  # noqa: E402
    DEVICE_JOB, ENV_FACTOR, ENV_FACTORS, ENV_JOB, ENV_LINE, OVERRUN, default_base_slowdown,
    device_env, device_ratios, parse_device_ms,
)
from trainer.data.batching import LinearFit, optimal_sizes  # noqa: E402
from trainer.job import load_job  # noqa: E402

log = logging.getLogger("benchmarks.hetero")

CALIBRATION_SIZES = (8, 32, 64, 128, 256, 384)

# -- the benchmark --------------------------------------------------------------------------


def calibrate(job_path: Path, sizes: tuple[int, ...] = CALIBRATION_SIZES, reps: int = 9
              ) -> LinearFit:
    """This host's single-core forward/backward line for the job: the fastest of ``reps``
    runs at each batch size, least squares over the sizes (the host's best, not its noise)."""
    torch.set_num_threads(1)
    job = load_job(str(job_path), 0)
    n = len(job)
    best = {min(b, n): float("inf") for b in sizes}
    for _ in range(reps):  # interleaved, so a burst of other load does not hit one size
        for b in best:
            ids = torch.arange(b)
            t0 = time.perf_counter()
            x, y = job.batch(ids)
            job.model.zero_grad(set_to_none=True)
            job.loss_fn(job.model(x), y).backward()
            best[b] = min(best[b], time.perf_counter() - t0)
    points = sorted(best.items())
    mb = statistics.fmean(b for b, _ in points)
    mt = statistics.fmean(t for _, t in points)
    c = sum((b - mb) * (t - mt) for b, t in points) / sum((b - mb) ** 2 for b, _ in points)
    a = max(0.0, mt - c * mb)
    return LinearFit(a, (mt - a) / mb, len(points))


def distance(sizes: dict[str, int], opt: dict[str, int]) -> float:
    """Mean relative distance of ``sizes`` from ``opt``."""
    return sum(abs(sizes[m] - opt[m]) / opt[m] for m in opt) / len(opt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slowdowns", default="1,1.5,2,4", help="relative factor F_i per worker")
    ap.add_argument("--base-slowdown", type=float, default=None,
                    help="K, multiplies every factor (default: max(1, sum 1/F_i / (0.5 x cores), "
                    "1.5 x (workers + load average) / cores); see the module docstring)")
    ap.add_argument("--emulation", choices=("pace", "sleep"), default="pace",
                    help="pace: private devices t_i(b) = K F_i (A + C b) (default); sleep: the "
                    "workers' --slowdown K F_i")
    ap.add_argument("--device-ms", default="2,0.1", metavar="A,C",
                    help="the 1x device line in ms (fixed, per sample; default 2,0.1), or "
                    "'host' to measure this host's single-core line for the job")
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=45, help="spotring steps to run")
    ap.add_argument("--baseline-steps", type=int, default=25)
    ap.add_argument("--converge-within", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    try:
        factors = [float(f) for f in args.slowdowns.split(",")]
    except ValueError:
        ap.error(f"--slowdowns {args.slowdowns!r}: give comma-separated numbers, e.g. 1,1.5,2,4")
    if len(factors) < 2 or min(factors) < 1.0:
        ap.error("--slowdowns: give at least two factors, each >= 1")
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    k = args.base_slowdown if args.base_slowdown is not None else default_base_slowdown(
        factors, cores, load)
    if k < 1.0:
        ap.error(f"--base-slowdown {k}: must be >= 1")
    if args.device_ms != "host":
        try:
            line = LinearFit(*parse_device_ms(args.device_ms), 0)
        except ValueError as e:
            ap.error(f"{e}, or host")
    else:
        line = calibrate(args.job)
    log.info("1x device line %.3f ms + %.4f ms/sample; K=%.2f (%d cores)", line.fixed_s * 1e3,
             line.per_sample_s * 1e3, k, cores)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-hetero-"))
    names = [f"w{i}" for i in range(len(factors))]
    slow = dict(zip(names, factors))
    effective = [round(k * f, 4) for f in factors]
    truth = {n: LinearFit(k * slow[n] * line.fixed_s, k * slow[n] * line.per_sample_s, 0)
             for n in names}
    opt = optimal_sizes(truth, args.global_batch)

    pace = args.emulation == "pace"
    env = digits_env(args.global_batch, args.steps + 10)
    job = args.job
    if pace:
        job = DEVICE_JOB
        env.update(device_env(args.job, k * line.fixed_s, k * line.per_sample_s))
    t_start = time.monotonic()
    with Ring(workdir / "ring", job, env, initial_world=len(names)) as ring:
        for name in names:
            if pace:
                ring.env = dict(env, **{ENV_FACTOR: repr(slow[name])})
                ring.add_worker(name)
            else:
                ring.add_worker(name, k * slow[name])
        ring.wait_step(args.steps, args.timeout)
    records = {n: steps_by_number(read_jsonl(workdir / "ring" / f"{n}.jsonl")) for n in names}
    log.info("spotring: %d steps in %.1fs", args.steps, time.monotonic() - t_start)

    base_metrics = workdir / "equal.jsonl"
    base_args = ["--mode", "equal", "--global-batch", str(args.global_batch),
                 "--steps", str(args.baseline_steps), "--job", str(job),
                 "--metrics-file", str(base_metrics)]
    if pace:
        os.environ.update({ENV_JOB: env[ENV_JOB], ENV_LINE: env[ENV_LINE],
                           ENV_FACTORS: ",".join(repr(f) for f in factors)})
    else:
        base_args += ["--slowdowns", ",".join(repr(f) for f in effective)]
    proc = torchrun(len(factors), base_args, workdir / "equal.log")
    try:
        wait_for(lambda: proc.poll() is not None, args.timeout, "the equal-batch baseline")
    finally:
        stop([proc])
    baseline = steps_by_number(read_jsonl(base_metrics))
    if len(baseline) < args.baseline_steps:
        raise SystemExit(f"baseline ran {len(baseline)} of {args.baseline_steps} steps; "
                         f"see {workdir / 'equal.log'}")

    # Steps every worker recorded with the full global batch (epoch tails are partial).
    common = sorted(set.intersection(*(set(r) for r in records.values())))
    full = [s for s in common if all(records[n][s]["samples"] == args.global_batch
                                     for n in names)]
    heads = {s for s in full if any(records[n][s].get("head_start_s", 0) > 0 for n in names)}
    full = [s for s in full if s not in heads]  # re-split on purpose (see batch_error)
    err = {s: distance({n: records[n][s]["batch"] for n in names}, opt) for s in full}
    steady = [s for s in full if s >= args.converge_within]
    if not steady:
        raise SystemExit("no full step after --converge-within; raise --steps")
    converged = None
    for s in reversed(full):
        if err[s] > args.tolerance:
            break
        converged = s
    late = [s for s in common if s >= args.converge_within]
    idle = [records[n][s]["wait_s"] / records[n][s]["step_s"]
            for n in names for s in late if records[n][s].get("step_s")]
    # Wait beyond the last arriver's: in each step the member that reached the collective
    # last waits only for the transfer itself; the rest of everyone's wait is idleness
    # caused by unequal finishing times, which is what batch sizing can remove.
    excess = []
    for s in late:
        waits = {n: records[n][s]["wait_s"] for n in names}
        floor = min(waits.values())
        excess += [(waits[n] - floor) / records[n][s]["step_s"] for n in names
                   if records[n][s].get("step_s")]
    # The wait that unequal compute times alone would cause (what sizing controls), and the
    # idle fraction without the steps that follow an epoch end (rank 0 evaluates the job
    # there while the others wait; with 1437 samples and B=512 that is every third step).
    sizing = []
    for s in late:
        busy = {n: records[n][s]["compute_s"] + records[n][s].get("head_start_s", 0)
                for n in names}
        top = max(busy.values())
        sizing += [(top - busy[n]) / records[n][s]["step_s"] for n in names
                   if records[n][s].get("step_s")]
    after_eval = {s for s in late if s - 1 in records[names[0]] and s - 2 in records[names[0]]
                  and records[names[0]][s - 1]["epoch"] != records[names[0]][s - 2]["epoch"]}
    idle_no_eval = [records[n][s]["wait_s"] / records[n][s]["step_s"]
                    for n in names for s in late if s not in after_eval
                    and records[n][s].get("step_s")]
    ratio = {n: device_ratios([records[n][s] for s in late], truth[n].time) for n in names}
    overrun = statistics.fmean(r > OVERRUN for n in names for r in ratio[n])
    if overrun > 0.1:
        log.warning("the emulated devices did not hold: real compute overran the device time "
                    "in %.0f%% of the steps (load %.1f); raise --base-slowdown", 100 * overrun,
                    os.getloadavg()[0])
    first = min(steady)
    spot_rate = steady_rate({s: records[names[0]][s] for s in common if s >= first - 1})
    base_rate = steady_rate(baseline, skip=min(5, len(baseline) // 3))
    emit({
        "benchmark": "trainer_hetero",
        "emulation": args.emulation,
        "slowdowns": factors,
        "base_slowdown": k,
        "effective_slowdowns": effective,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "batch_error": round(statistics.fmean(err[s] for s in steady), 4),
        "batch_error_at": round(err[first], 4),
        "steps_to_converge": converged,
        "idle_fraction": round(statistics.fmean(idle), 4),
        "idle_beyond_transfer": round(statistics.fmean(excess), 4),
        "idle_from_sizing": round(statistics.fmean(sizing), 4),
        "idle_without_eval_steps": round(statistics.fmean(idle_no_eval), 4)
        if idle_no_eval else None,
        "speedup_vs_equal": round(spot_rate / base_rate, 3) if base_rate else None,
        "samples_per_s": round(spot_rate, 1),
        "baseline_equal_samples_per_s": round(base_rate, 1),
        "optimal_sizes": [opt[n] for n in names],
        "chosen_sizes": [records[n][max(full)]["batch"] for n in names],
        "device_line_ms": [round(line.fixed_s * 1e3, 3), round(line.per_sample_s * 1e3, 4)],
        "device_fidelity": [round(statistics.median(ratio[n]), 3) for n in names],
        "device_overrun": round(overrun, 3),
        "cores": cores,
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "workdir": str(workdir),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
