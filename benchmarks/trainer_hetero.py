"""Benchmark: heterogeneity-aware batch sizes on a ring of unequal workers (issue 4).

Design. A spotring ring of workers slowed by ``--slowdowns`` (default 1, 1.5, 2, 4; each
sleeps ``(F - 1) x`` its measured compute, see ``python -m trainer worker --slowdown``) trains
examples/digits.py with a constant global batch; each worker writes one metrics line per
step. In the same run, the baseline is the equal-batch ring on the same job, processes and
slowdowns (``benchmarks/_common.py --mode equal`` under the real ``torchrun``).

Figures (one JSON line on stdout):

* ``batch_error``: mean over steps ``>= --converge-within`` of the mean relative distance
  ``|b_i - b*_i| / b*_i`` between the sizes the ring chose and the optimal integer sizes
  ``b*`` computed from the true speeds. True speeds: worker i's compute time is
  ``F_i x base(b)``, where ``base`` is a robust line fitted in hindsight to every step of
  the run (``compute_s / F_i`` against ``b``). Goal <= 0.02.
* ``batch_error_at``: the same distance at the first full step ``>= --converge-within``.
* ``steps_to_converge``: the first step from which the distance stays within
  ``--tolerance`` (0.02) for the rest of the run (null: never).
* ``idle_fraction``: collective wait / step time, averaged over workers and steady steps.
  Goal <= 0.03. ``idle_beyond_transfer``: the same less, in each step, the wait of the
  member that reached the collective last (the transfer itself, not idleness).
* ``speedup_vs_equal``: steady samples/s of spotring / of the equal-batch baseline.

Rule: run alone (the figures are ratios, but a loaded machine inflates wait and noise).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import (
    DEFAULT_JOB, Ring, digits_env, emit, read_jsonl, setup_logging, steady_rate, steps_by_number,
    stop, torchrun, wait_for,
)
from trainer.batching import LinearFit, optimal_sizes

log = logging.getLogger("benchmarks.hetero")


def robust_line(points: list[tuple[float, float]]) -> LinearFit:
    """Least-squares line through ``(b, t)`` after dropping residuals over 3 MADs (once)."""
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    keep = np.ones(len(b), dtype=bool)
    for _ in range(2):
        if np.ptp(b[keep]) > 0:
            c, a = np.polyfit(b[keep], t[keep], 1)
        else:
            c, a = float(np.mean(t[keep] / b[keep])), 0.0
        res = t - (a + c * b)
        mad = float(np.median(np.abs(res[keep] - np.median(res[keep])))) or 1e-12
        keep = np.abs(res - np.median(res[keep])) <= 3 * 1.4826 * mad
    a = max(0.0, float(a))
    c = float((np.mean(t[keep]) - a) / np.mean(b[keep]))
    return LinearFit(a, c, int(keep.sum()))


def distance(sizes: dict[str, int], opt: dict[str, int]) -> float:
    return sum(abs(sizes[m] - opt[m]) / opt[m] for m in opt) / len(opt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slowdowns", default="1,1.5,2,4", help="one factor per worker")
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
    factors = [float(f) for f in args.slowdowns.split(",")]
    if len(factors) < 2 or min(factors) < 1.0:
        ap.error("--slowdowns: give at least two factors, each >= 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-hetero-"))
    names = [f"w{k}" for k in range(len(factors))]
    slow = dict(zip(names, factors))
    env = digits_env(args.global_batch, args.steps + 10)

    t_start = time.monotonic()
    with Ring(workdir / "ring", args.job, env, initial_world=len(names)) as ring:
        for name in names:
            ring.add_worker(name, slow[name])
        ring.wait_step(args.steps, args.timeout)
    records = {n: steps_by_number(read_jsonl(workdir / "ring" / f"{n}.jsonl")) for n in names}
    log.info("spotring: %d steps in %.1fs", args.steps, time.monotonic() - t_start)

    base_metrics = workdir / "equal.jsonl"
    proc = torchrun(len(factors), ["--mode", "equal", "--slowdowns", args.slowdowns,
                                   "--global-batch", str(args.global_batch), "--steps",
                                   str(args.baseline_steps), "--job", str(args.job),
                                   "--metrics-file", str(base_metrics)], workdir / "equal.log")
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
    points = [(records[n][s]["batch"], records[n][s]["compute_s"] / slow[n])
              for n in names for s in common if records[n][s]["batch"] > 0]
    base = robust_line(points)
    truth = {n: LinearFit(base.fixed_s * slow[n], base.per_sample_s * slow[n], 0) for n in names}
    opt = optimal_sizes(truth, args.global_batch)
    err = {s: distance({n: records[n][s]["batch"] for n in names}, opt) for s in full}
    steady = [s for s in full if s >= args.converge_within]
    if not steady:
        raise SystemExit("no full step after --converge-within; raise --steps")
    converged = None
    for s in reversed(full):
        if err[s] > args.tolerance:
            break
        converged = s
    idle = [records[n][s]["wait_s"] / records[n][s]["step_s"]
            for n in names for s in steady if records[n][s].get("step_s")]
    # Wait beyond the last arriver's: in each step the member that reached the collective
    # last waits only for the transfer itself; the rest of everyone's wait is idleness
    # caused by unequal finishing times, which is what batch sizing can remove.
    excess = []
    for s in steady:
        waits = {n: records[n][s]["wait_s"] for n in names}
        floor = min(waits.values())
        excess += [(waits[n] - floor) / records[n][s]["step_s"] for n in names
                   if records[n][s].get("step_s")]
    first = min(steady)
    spot_rate = steady_rate({s: records[names[0]][s] for s in common if s >= first - 1})
    base_rate = steady_rate(baseline, skip=min(5, len(baseline) // 3))
    emit({
        "benchmark": "trainer_hetero",
        "slowdowns": factors,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "batch_error": round(statistics.fmean(err[s] for s in steady), 4),
        "batch_error_at": round(err[first], 4),
        "steps_to_converge": converged,
        "idle_fraction": round(statistics.fmean(idle), 4),
        "idle_beyond_transfer": round(statistics.fmean(excess), 4),
        "speedup_vs_equal": round(spot_rate / base_rate, 3) if base_rate else None,
        "samples_per_s": round(spot_rate, 1),
        "baseline_equal_samples_per_s": round(base_rate, 1),
        "optimal_sizes": [opt[n] for n in names],
        "chosen_sizes": [records[n][max(full)]["batch"] for n in names],
        "true_line_ms": [round(base.fixed_s * 1e3, 3), round(base.per_sample_s * 1e3, 4)],
        "workdir": str(workdir),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
