"""Benchmark: the elastic ring's steady-state cost against plain DistributedDataParallel (issue 3).

Design. The same job (examples/digits.py), global batch and number of processes run twice in
one invocation: as a spotring ring (``python -m trainer worker`` processes around an
in-process coordinator) and as plain ``torch.nn.parallel.DistributedDataParallel`` ranks
under the real ``torchrun`` (``benchmarks/_common.py --mode ddp``). Both write one metrics
line per step; the steady rate skips the first steps (warm-up). With ``--rounds R`` the two
alternate R times and the median ratio is reported, which cancels slow drifts in the load of
a shared machine.

Figures (one JSON line on stdout): ``ddp_ratio`` = steady samples/s of spotring / of DDP
(goal >= 0.98), the two rates, and every round's ratio.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

from _common import (
    DEFAULT_JOB, Ring, digits_env, emit, read_jsonl, setup_logging, steady_rate, steps_by_number,
    stop, torchrun, wait_for,
)

log = logging.getLogger("benchmarks.overhead")


def spotring_rate(workdir: Path, job: Path, workers: int, global_batch: int, steps: int,
                  skip: int, timeout: float) -> float:
    """Steady samples/s of a spotring ring of ``workers`` equal workers."""
    names = [f"w{k}" for k in range(workers)]
    with Ring(workdir, job, digits_env(global_batch, steps + 10), initial_world=workers) as ring:
        for n in names:
            ring.add_worker(n)
        ring.wait_step(steps, timeout)
    recs = steps_by_number(read_jsonl(workdir / f"{names[0]}.jsonl"))
    return steady_rate({s: r for s, r in recs.items() if s <= steps}, skip=skip)


def ddp_rate(workdir: Path, job: Path, workers: int, global_batch: int, steps: int, skip: int,
             timeout: float) -> float:
    """Steady samples/s of plain DDP under torchrun, same job, batch and processes."""
    workdir.mkdir(parents=True, exist_ok=True)
    metrics = workdir / "ddp.jsonl"
    proc = torchrun(workers, ["--mode", "ddp", "--global-batch", str(global_batch), "--steps",
                              str(steps), "--job", str(job), "--metrics-file", str(metrics)],
                    workdir / "ddp.log")
    try:
        wait_for(lambda: proc.poll() is not None, timeout, "the DDP baseline")
    finally:
        stop([proc])
    recs = steps_by_number(read_jsonl(metrics))
    if len(recs) < steps:
        raise SystemExit(f"DDP baseline ran {len(recs)} of {steps} steps; see {workdir}/ddp.log")
    return steady_rate(recs, skip=skip)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the rate")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.workers < 1 or args.steps <= args.skip + 2:
        ap.error("--workers >= 1 and --steps > --skip + 2")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-overhead-"))
    ratios, spot, ddp = [], [], []
    for r in range(args.rounds):
        d = ddp_rate(workdir / f"ddp{r}", args.job, args.workers, args.global_batch, args.steps,
                     args.skip, args.timeout)
        s = spotring_rate(workdir / f"ring{r}", args.job, args.workers, args.global_batch,
                          args.steps, args.skip, args.timeout)
        log.info("round %d: spotring %.1f samples/s, ddp %.1f samples/s", r, s, d)
        spot.append(s)
        ddp.append(d)
        ratios.append(s / d)
    emit({
        "benchmark": "trainer_overhead",
        "workers": args.workers,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "ddp_ratio": round(statistics.median(ratios), 3),
        "ratios": [round(x, 3) for x in ratios],
        "spotring_samples_per_s": round(statistics.median(spot), 1),
        "ddp_samples_per_s": round(statistics.median(ddp), 1),
        "workdir": str(workdir),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
