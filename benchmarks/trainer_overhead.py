"""Benchmark: the elastic ring's steady-state cost against plain DistributedDataParallel (issue 3).

Design. The same job (examples/digits.py), global batch and number of processes run as a
spotring ring (a ``python -m trainer coordinator`` process and ``python -m trainer worker``
processes) and as plain ``torch.nn.parallel.DistributedDataParallel`` ranks under the real
``torchrun`` (``benchmarks/_common.py --mode ddp --epoch-loop``). Both do the same work: the
baseline walks the job's epochs as a spotring worker does (same seeded order, the short last
step of each epoch) and runs the job's ``evaluate`` on rank 0 at each epoch end, as
spotring's rank 0 does. Both write one metrics line per step.

Measure. On a shared 2-core machine the other tenants' load moves by the second, and two
separate runs of a few seconds each differed by 2x here. So both systems are started once
and run in turns: every process of one side (for spotring the coordinator too) is stopped
with SIGSTOP while the other side runs for ``--slice`` seconds (default 3: ~150 steps), then
they swap. Turns come in ABBA order (DDP, spotring, spotring, DDP, ...) after ``--warmup``
slices each, so a drift of the load favours neither side. A slice's rate is the samples of
the steps completed in it, the first one left out (it contains the pause), over the time
from that first completion to the last. Slices are paired in order (pair k = turns 2k and
2k+1); each pair gives one ratio; ``ddp_ratio`` is the median of ``--pairs`` (default 6)
pair ratios. Heartbeat and collective timeouts are far longer than a slice, so the ring
never notices its pauses.

Figures (one JSON line on stdout): ``ddp_ratio`` = steady samples/s of spotring / of DDP
(goal >= 0.98); ``ratios`` (one per pair), ``ratio_min``, ``ratio_max``; ``pooled_ratio``:
all of spotring's slices against all of DDP's; the median rates; ``steady_steps``: steps
counted per side; and ``ddp_ratio_train_only``: the same median against DDP with its
evaluation time taken out (the comparison as it was made before 2026-11-22 03:00, when the
baseline skipped the job's evaluation that spotring runs; stricter, for comparison).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import (
    DEFAULT_JOB, PYTHON, descendants, digits_env, emit, free_port, read_jsonl, setup_logging,
    spawn, stop,
    torchrun, wait_for,
)

log = logging.getLogger("benchmarks.overhead")


def signal_all(procs: list[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to every process of ``procs`` and their descendants."""
    for proc in procs:
        for pid in descendants(proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def slice_rate(recs: list[dict], t0: float, t1: float, exclude: str = "") -> tuple[float, int]:
    """Samples/s of the steps completed in ``[t0, t1)``, the first left out (it holds the
    pause before the slice); ``exclude``: a per-step key of seconds taken out of the time.
    Returns (rate, steps counted)."""
    inside = sorted((r for r in recs if t0 <= r["t"] < t1), key=lambda r: r["t"])
    if len(inside) < 3:
        raise SystemExit(f"only {len(inside)} steps in a {t1 - t0:.1f}s slice; raise --slice")
    counted = inside[1:]
    took = counted[-1]["t"] - inside[0]["t"]
    if exclude:
        took -= sum(float(r.get(exclude, 0.0)) for r in counted)
    return sum(r["samples"] for r in counted) / took, len(counted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--slice", type=float, default=3.0, help="seconds per turn")
    ap.add_argument("--pairs", type=int, default=6, help="measured pairs of turns (ABBA)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured turns per side first")
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=180.0, help="boot timeout (s)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.workers < 1 or args.pairs < 1 or args.slice < 0.5 or args.warmup < 0:
        ap.error("--workers >= 1, --pairs >= 1, --slice >= 0.5, --warmup >= 0")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-overhead-"))
    workdir.mkdir(parents=True, exist_ok=True)
    steps_needed = int((args.pairs + args.warmup + 2) * args.slice * 200) + 1000
    env = digits_env(args.global_batch, steps_needed)
    token = workdir / "token"
    token.write_bytes(os.urandom(16).hex().encode())
    port = free_port()
    names = [f"w{k}" for k in range(args.workers)]
    ring = [spawn([PYTHON, "-m", "trainer", "--log-level", "WARNING", "coordinator",
                   "--host", "127.0.0.1", "--port", str(port), "--token-file", str(token),
                   "--heartbeat-timeout", "120", "--initial-world", str(args.workers)],
                  workdir / "coordinator.log")]
    ring += [spawn([PYTHON, "-m", "trainer", "--log-level", "WARNING", "worker",
                    "--coordinator", f"127.0.0.1:{port}", "--token-file", str(token),
                    "--job", str(args.job), "--name", n, "--collective-timeout", "120",
                    "--metrics-file", str(workdir / f"{n}.jsonl")],
                   workdir / f"{n}.log", env) for n in names]
    ddp_metrics = workdir / "ddp.jsonl"
    ddp = [torchrun(args.workers, ["--mode", "ddp", "--epoch-loop", "--global-batch",
                                   str(args.global_batch), "--job", str(args.job),
                                   "--metrics-file", str(ddp_metrics)], workdir / "ddp.log")]
    sides = {"ring": ring, "ddp": ddp}
    files = {"ring": workdir / f"{names[0]}.jsonl", "ddp": ddp_metrics}
    try:
        for side, path in files.items():  # both boot at once, then take turns
            wait_for(lambda p=path: len(read_jsonl(p)) >= 20, args.timeout,
                     f"{side} to run 20 steps (logs in {workdir})")
        signal_all(ring, signal.SIGSTOP)
        turns = ["ddp", "ring"] * args.warmup
        for k in range(args.pairs):
            turns += ["ddp", "ring"] if k % 2 == 0 else ["ring", "ddp"]
        running = "ddp"
        slices: list[tuple[str, float, float]] = []
        for side in turns:
            if side != running:
                signal_all(sides[running], signal.SIGSTOP)
                signal_all(sides[side], signal.SIGCONT)
                running = side
            t0 = time.time()
            time.sleep(args.slice)
            slices.append((side, t0, time.time()))
        signal_all(sides[running], signal.SIGSTOP)
        recs = {side: read_jsonl(path) for side, path in files.items()}
    finally:
        for procs in sides.values():
            signal_all(procs, signal.SIGCONT)
            stop(procs, signal.SIGKILL, grace=5.0)
    measured = slices[2 * args.warmup:]
    ratios, ratios_train, rates = [], [], {"ring": [], "ddp": []}
    totals = {"ring": [0.0, 0], "ddp": [0.0, 0]}
    for k in range(args.pairs):
        got = {}
        for side, t0, t1 in measured[2 * k: 2 * k + 2]:
            rate, n = slice_rate(recs[side], t0, t1)
            got[side] = rate
            if side == "ddp":
                got["ddp_train"] = slice_rate(recs[side], t0, t1, exclude="eval_s")[0]
            rates[side].append(rate)
            totals[side][0] += rate * n
            totals[side][1] += n
        ratios.append(got["ring"] / got["ddp"])
        ratios_train.append(got["ring"] / got["ddp_train"])
        log.info("pair %d: spotring %.1f samples/s, ddp %.1f (%.1f without its evaluation): "
                 "ratio %.3f", k, got["ring"], got["ddp"], got["ddp_train"], ratios[-1])
    # pooled: each side's samples over its time (a rate-weighted mean over its slices)
    pooled = {s: totals[s][0] / totals[s][1] for s in totals}
    emit({
        "benchmark": "trainer_overhead",
        "workers": args.workers,
        "global_batch": args.global_batch,
        "slice_s": args.slice,
        "pairs": args.pairs,
        "ddp_ratio": round(statistics.median(ratios), 3),
        "ratios": [round(x, 3) for x in ratios],
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "pooled_ratio": round(pooled["ring"] / pooled["ddp"], 3),
        "ddp_ratio_train_only": round(statistics.median(ratios_train), 3),
        "spotring_samples_per_s": round(statistics.median(rates["ring"]), 1),
        "ddp_samples_per_s": round(statistics.median(rates["ddp"]), 1),
        "steady_steps": {s: totals[s][1] for s in totals},
        "workdir": str(workdir),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
