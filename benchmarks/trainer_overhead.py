"""Benchmark: the elastic ring's steady-state cost against plain DistributedDataParallel (issue 3).

Design. The same job (examples/digits.py), global batch and number of processes run as a
spotring ring (``python -m trainer worker`` processes around an in-process coordinator) and
as plain ``torch.nn.parallel.DistributedDataParallel`` ranks under the real ``torchrun``
(``benchmarks/_common.py --mode ddp --epoch-loop``). Both do the same work: the baseline
walks the job's epochs as a spotring worker does (same seeded order, the short last step of
each epoch) and runs the job's ``evaluate`` on rank 0 at each epoch end, as spotring's rank 0
does. Both write one metrics line per step.

Measure. A run's steady rate is the samples of steps ``--skip`` .. ``--steps`` over the time
between their completions (default 20 .. 200: 180 steady steps, several seconds, not one).
``--rounds`` (default 5) pairs are run in ABBA order (DDP then spotring, spotring then DDP,
...), so a drift of the shared machine's load during the run favours neither side; each
round gives one ratio and ``ddp_ratio`` is their median. The spread is reported
(``ratios``, ``ratio_min``, ``ratio_max``).

Figures (one JSON line on stdout): ``ddp_ratio`` = steady samples/s of spotring / of DDP
(goal >= 0.98), the two median rates, every round's ratio, and ``ddp_ratio_train_only``:
the same ratio against DDP with its evaluation time taken out of its elapsed time (the
baseline as it was measured before 2026-11-22 03:00, when it skipped the job's evaluation
that spotring runs; a stricter figure, for comparison).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

from _common import (
    DEFAULT_JOB, Ring, digits_env, emit, read_jsonl, setup_logging, steps_by_number, stop,
    torchrun, wait_for,
)

log = logging.getLogger("benchmarks.overhead")


def window_rate(recs: dict[int, dict], skip: int, steps: int, exclude: str = "") -> float:
    """Samples/s over steps ``skip .. steps``: samples of steps after ``skip`` divided by the
    time from step ``skip``'s completion to step ``steps``'s (``exclude``: a per-step key of
    seconds taken out of that time, e.g. ``eval_s``)."""
    window = [recs[s] for s in range(skip, steps + 1) if s in recs]
    if len(window) < 2:
        raise SystemExit(f"only {len(window)} steps in the window {skip}..{steps}")
    done = sum(r["samples"] for r in window[1:])
    took = window[-1]["t"] - window[0]["t"]
    if exclude:
        took -= sum(float(r.get(exclude, 0.0)) for r in window[1:])
    return done / took


def spotring_rate(workdir: Path, job: Path, workers: int, global_batch: int, steps: int,
                  skip: int, timeout: float) -> float:
    """Steady samples/s of a spotring ring of ``workers`` equal workers."""
    names = [f"w{k}" for k in range(workers)]
    with Ring(workdir, job, digits_env(global_batch, steps + 10), initial_world=workers) as ring:
        for n in names:
            ring.add_worker(n)
        ring.wait_step(steps, timeout)
    return window_rate(steps_by_number(read_jsonl(workdir / f"{names[0]}.jsonl")), skip, steps)


def ddp_rate(workdir: Path, job: Path, workers: int, global_batch: int, steps: int, skip: int,
             timeout: float) -> tuple[float, float]:
    """Steady samples/s of plain DDP under torchrun (same job, batch, processes and epoch
    walk); and the same with its evaluation time taken out."""
    workdir.mkdir(parents=True, exist_ok=True)
    metrics = workdir / "ddp.jsonl"
    proc = torchrun(workers, ["--mode", "ddp", "--epoch-loop", "--global-batch",
                              str(global_batch), "--steps", str(steps), "--job", str(job),
                              "--metrics-file", str(metrics)],
                    workdir / "ddp.log")
    try:
        wait_for(lambda: proc.poll() is not None, timeout, "the DDP baseline")
    finally:
        stop([proc])
    recs = steps_by_number(read_jsonl(metrics))
    if len(recs) < steps:
        raise SystemExit(f"DDP baseline ran {len(recs)} of {steps} steps; see {workdir}/ddp.log")
    return window_rate(recs, skip, steps), window_rate(recs, skip, steps, exclude="eval_s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--skip", type=int, default=20, help="warm-up steps left out of the rate")
    ap.add_argument("--rounds", type=int, default=5, help="ABBA-ordered pairs; median ratio")
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.workers < 1 or args.steps <= args.skip + 2 or args.rounds < 1:
        ap.error("--workers >= 1, --rounds >= 1 and --steps > --skip + 2")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-overhead-"))
    ratios, ratios_train, spot, ddp = [], [], [], []
    for r in range(args.rounds):
        order = ("ddp", "ring") if r % 2 == 0 else ("ring", "ddp")  # ABBA: drifts cancel
        got: dict[str, tuple[float, float]] = {}
        for side in order:
            if side == "ddp":
                got["ddp"] = ddp_rate(workdir / f"ddp{r}", args.job, args.workers,
                                      args.global_batch, args.steps, args.skip, args.timeout)
            else:
                s = spotring_rate(workdir / f"ring{r}", args.job, args.workers,
                                  args.global_batch, args.steps, args.skip, args.timeout)
                got["ring"] = (s, s)
        s, (d, d_train) = got["ring"][0], got["ddp"]
        log.info("round %d (%s first): spotring %.1f samples/s, ddp %.1f (%.1f without its "
                 "evaluation): ratio %.3f", r, order[0], s, d, d_train, s / d)
        spot.append(s)
        ddp.append(d)
        ratios.append(s / d)
        ratios_train.append(s / d_train)
    emit({
        "benchmark": "trainer_overhead",
        "workers": args.workers,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "steady_steps": args.steps - args.skip,
        "rounds": args.rounds,
        "ddp_ratio": round(statistics.median(ratios), 3),
        "ratios": [round(x, 3) for x in ratios],
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "ddp_ratio_train_only": round(statistics.median(ratios_train), 3),
        "spotring_samples_per_s": round(statistics.median(spot), 1),
        "ddp_samples_per_s": round(statistics.median(ddp), 1),
        "workdir": str(workdir),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
