"""Benchmark: workers joining a running ring, against a checkpoint-restart baseline (issue 3).

Design. Two phases in one run, same job (examples/digits.py), global batch, devices and
window (from the moment the joiners are started until ``--after`` seconds after the last
one joined, at least ``--window`` seconds).

Devices. By default (``--emulation pace``) every worker, the joiners and the baseline's
ranks alike, computes on an emulated private device of the same speed
(``benchmarks/device.py``): its forward/backward is padded to ``K x (A + C x b)``
(``--device-ms A,C``, default 2 ms + 0.1 ms per sample, this host's single-core line for
digits; ``K`` = ``--base-slowdown``, default ``device.default_base_slowdown`` for all the
workers: 3 on two idle cores). A fleet's workers compute on devices of their own; on this
host two workers sharing a core set each other's speed (measured 2026-11-24 on the idle
machine: a ``--slowdown 2`` ring on CPU 0 drifted from 6.7k to 10k samples/s within 20 s
with nothing else running), so without private devices the rate before the join is not a
steady reference. The collectives, the state transfer, the joiner's boot and the
coordinator stay real. ``--emulation sleep`` keeps the old emulation (each worker's
``--slowdown`` on shared CPUs); ``device_fidelity`` reports measured compute / device time
for the ring's first worker (1.0: the emulation held).

* spotring: a ring of ``--workers`` runs until steady; then ``--joiners`` new
  ``python -m trainer worker`` processes start. They boot, build the job and profile
  *before* asking to join, so the ring keeps training; it switches generation at a step
  boundary. Joiners run with ``--boot-idle``: their imports, job build and profiling run
  under SCHED_IDLE (only CPU time the ring leaves idle) and they return to normal priority
  before asking to join. On a real fleet a joiner boots on its own machine; here it shares
  the two CPUs with the ring, and SCHED_IDLE keeps its boot from passing for a cost of the
  ring (``nice`` is not enough: a nice-10 process still gets ~10 % of a contended CPU).
  ``--pin 'RING;JOINERS'`` (default ``0;1``) pins the ring's workers to CPU 0 and the
  joiners to CPU 1 with ``taskset``: the joiner's CPU stands for its own machine. The
  checkpoint-restart baseline is not pinned (it keeps both CPUs: its favour).
* baseline: the real ``torchrun --standalone`` with the same ranks running the equal-batch
  worker of benchmarks/_common.py, saving a checkpoint after *every* step (the baseline's
  best case). At the join, after the time a new torchrun agent needs to boot
  (``python -c "import torch.distributed.run"``, measured in this run), every worker is
  stopped and torchrun restarts with ``workers + joiners`` ranks that reload the checkpoint:
  what torchrun elastic does on any membership change.

Figures (one JSON line on stdout): ``kept`` = spotring samples/s over the window / its steady
samples/s just before (goal >= 0.99); ``kept_boot`` = spotring samples/s from the moment the
joiners are started until the first step of the new generation (that step included: the
joiners' whole boot plus the switch, without the time after the join, when the joiner's CPU
adds to the ring) / the same steady samples/s (stricter than ``kept`` whenever the bigger
ring is faster); ``join_to_switch_s`` = that span; ``max_pause_s`` = the longest gap between two step
completions in the window; ``switch_ms`` = the extra time of the step at the generation
change over the median step; ``restart_ratio`` = samples spotring completed in the window /
samples the checkpoint-restart baseline completed in the same window length (a step redone
after the restart counts once).

Why not ``torchrun --nnodes 1:2`` with a second agent joining: tried here (torch 2.13), the
re-rendezvous after "Detected 1 new nodes" deadlocks with the shared agent TCP store, and
with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` the first all-reduce hangs; a stop and start of
torchrun restarts every worker and reloads the checkpoint just the same.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import (
    DEFAULT_JOB, PYTHON, Ring, digits_env, emit, read_jsonl, samples_between, setup_logging,
    steps_by_number, stop, torchrun, wait_for,
)
from device import (
    DEVICE_JOB, ENV_FACTOR, ENV_FACTORS, default_base_slowdown, device_env, fidelity,
    parse_device_ms,
)

log = logging.getLogger("benchmarks.join")


def agent_boot_s() -> float:
    """Seconds a fresh Python needs to import torchrun's launcher (a joining agent's boot)."""
    t0 = time.monotonic()
    subprocess.run([PYTHON, "-c", "import torch.distributed.run"], check=True)
    return time.monotonic() - t0


def spotring_phase(args: argparse.Namespace, workdir: Path) -> dict:
    names = [f"w{k}" for k in range(args.workers)]
    joiners = [f"j{k}" for k in range(args.joiners)]
    env = digits_env(args.global_batch, 100_000)
    job, slowdown = args.job, args.slowdown
    if args.device_env:  # every worker on a private device of the same speed
        env.update(args.device_env, **{ENV_FACTOR: "1"})
        job, slowdown = DEVICE_JOB, 1.0
    with Ring(workdir, job, env, initial_world=args.workers, device=args.device) as ring:
        pins = [c.strip() for c in args.pin.split(";")] if args.pin else ["", ""]
        for n in names:
            ring.add_worker(n, slowdown, cpus=pins[0])
        ring.wait_step(args.warm_steps, args.timeout)
        time.sleep(args.before)
        t_join = time.time()
        for j in joiners:
            ring.add_worker(j, slowdown, nice=args.joiner_nice, cpus=pins[1],
                            extra=() if args.no_boot_idle else ("--boot-idle",))

        def joined() -> bool:
            plan = ring.coordinator.plan()
            return set(joiners) <= set(plan.names if plan else ())

        wait_for(joined, args.timeout, f"joiners {joiners} to join (logs in {workdir})")
        # The window covers the whole join plus --after seconds, and at least --window.
        window = max(args.window, time.time() - t_join + args.after)
        wait_for(lambda: time.time() > t_join + window, window + 10, "the join window")
        recs = steps_by_number(ring.metrics(names[0]))
    fid = None
    if args.device_env:
        fixed_s, per_sample_s = args.line
        fid = fidelity(list(recs.values()), lambda b: fixed_s + per_sample_s * b)
    args.window = window  # the baseline is measured over the same window length
    ordered = sorted(recs.values(), key=lambda r: r["t"])
    before = samples_between(recs, t_join - args.before, t_join) / args.before
    during = samples_between(recs, t_join, t_join + args.window) / args.window
    gaps = [(b["t"] - a["t"], a, b) for a, b in zip(ordered, ordered[1:])]
    steady = [g for g, a, _ in gaps if a["t"] < t_join and a["t"] >= t_join - args.before]
    in_window = [(g, a, b) for g, a, b in gaps if t_join <= b["t"] < t_join + args.window]
    switches = [g for g, a, b in in_window if b["generation"] != a["generation"]]
    median_step = statistics.median(steady) if steady else 0.0
    # kept_boot: from the joiners' start to the first step of the new generation, included
    gen0 = max((r["generation"] for r in ordered if r["t"] < t_join), default=0)
    switch = next((r for r in ordered if r["t"] >= t_join and r["generation"] > gen0), None)
    boot = None
    if switch is not None and switch["t"] > t_join:
        done = sum(r["samples"] for r in ordered if t_join <= r["t"] <= switch["t"])
        boot = done / (switch["t"] - t_join)
    return {
        "kept": before and during / before,
        "kept_boot": boot / before if boot is not None and before else None,
        "boot_s": switch["t"] - t_join if switch is not None else None,
        "samples": samples_between(recs, t_join, t_join + args.window),
        "max_pause_s": max((g for g, _, _ in in_window), default=0.0),
        "switch_ms": (max(switches) - median_step) * 1e3 if switches else None,
        "steady_samples_per_s": before,
        "step_ms": median_step * 1e3,
        "fidelity": fid,
    }


def baseline_phase(args: argparse.Namespace, workdir: Path, boot_s: float) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    metrics, ckpt = workdir / "ckpt.jsonl", workdir / "ckpt.pt"
    common = ["--mode", "equal", "--global-batch", str(args.global_batch), "--ckpt", str(ckpt),
              "--device", args.device, "--metrics-file", str(metrics)]
    if args.device_env:  # the same private devices, one per rank (torchrun passes os.environ on)
        os.environ.update(args.device_env, **{ENV_FACTORS: ",".join(
            ["1"] * (args.workers + args.joiners))})
        common += ["--job", str(DEVICE_JOB)]
    else:
        common += ["--job", str(args.job), "--slowdowns", str(args.slowdown)]
    first = torchrun(args.workers, common, workdir / "first.log")
    second = None
    try:
        wait_for(lambda: len(read_jsonl(metrics)) >= args.warm_steps, args.timeout,
                 "the baseline's warm-up steps")
        time.sleep(args.before)
        t_join = time.time()
        time.sleep(boot_s)  # the joining agent boots while the old workers go on
        stop([first])  # torchrun: every worker stops on a membership change...
        second = torchrun(args.workers + args.joiners, common, workdir / "second.log")
        wait_for(lambda: time.time() > t_join + args.window, args.window + 10, "the window")
    finally:
        stop([p for p in (first, second) if p is not None])
    recs = steps_by_number(read_jsonl(metrics))
    restarted = [r for r in recs.values() if r["world"] == args.workers + args.joiners]
    return {
        "samples": samples_between(recs, t_join, t_join + args.window),
        "restart_pause_s": (min(r["t"] for r in restarted) - t_join) if restarted else None,
        "steady_samples_per_s": samples_between(recs, t_join - args.before, t_join) / args.before,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--joiners", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--emulation", choices=("pace", "sleep"), default="pace",
                    help="pace: every worker on a private device K x (A + C b) (default); "
                    "sleep: the workers' --slowdown on shared CPUs")
    ap.add_argument("--device-ms", default="2,0.1", metavar="A,C",
                    help="the device line in ms (fixed, per sample; default 2,0.1)")
    ap.add_argument("--base-slowdown", type=float, default=None,
                    help="K (default: device.default_base_slowdown for workers + joiners)")
    ap.add_argument("--slowdown", type=float, default=2.0,
                    help="--emulation sleep: every worker's slowdown (its sleep share leaves "
                    "CPU for the others)")
    ap.add_argument("--warm-steps", type=int, default=10)
    ap.add_argument("--before", type=float, default=3.0, help="seconds of steady rate measured")
    ap.add_argument("--window", type=float, default=10.0,
                    help="seconds from the join start (at least the join plus --after)")
    ap.add_argument("--after", type=float, default=3.0,
                    help="seconds the window goes on after the last joiner joined")
    ap.add_argument("--joiner-nice", type=int, default=0,
                    help="niceness of the joiners (default 0: --boot-idle does the job)")
    ap.add_argument("--no-boot-idle", action="store_true",
                    help="joiners boot at normal priority (default: worker --boot-idle, "
                    "SCHED_IDLE until profiled: their boot stands for another machine's)")
    ap.add_argument("--pin", default="0;1" if (os.cpu_count() or 1) >= 2 else "",
                    help="'RING;JOINERS' taskset CPU lists (default '0;1': the ring on CPU 0, "
                    "the joiners on CPU 1, standing for their own machine; '' = no pinning)")
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--device", default="cpu",
                    help="every worker's, joiner's and baseline rank's --device (cpu, cuda, "
                    "cuda:N; default cpu); ranks sharing one GPU reduce over gloo")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.workers < 1 or args.joiners < 1:
        ap.error("--workers and --joiners: at least 1")
    load = os.getloadavg()[0]
    k = None
    args.device_env = None
    if args.emulation == "pace":
        try:
            fixed_s, per_sample_s = parse_device_ms(args.device_ms)
        except ValueError as e:
            ap.error(str(e))
        k = args.base_slowdown if args.base_slowdown is not None else default_base_slowdown(
            [1.0] * (args.workers + args.joiners), os.cpu_count() or 1, load)
        if k < 1.0:
            ap.error(f"--base-slowdown {k}: must be >= 1")
        args.line = (k * fixed_s, k * per_sample_s)
        args.device_env = device_env(args.job, *args.line)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-join-"))
    spot = spotring_phase(args, workdir / "ring")
    boot = agent_boot_s()
    base = baseline_phase(args, workdir / "baseline", boot)
    emit({
        "benchmark": "trainer_join",
        "workers": args.workers,
        "joiners": args.joiners,
        "emulation": args.emulation,
        "device": args.device,
        "base_slowdown": k,
        "device_fidelity": None if spot["fidelity"] is None else round(spot["fidelity"][0], 3),
        "device_overrun": None if spot["fidelity"] is None else round(spot["fidelity"][1], 3),
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "window_s": args.window,
        "kept": round(spot["kept"], 3),
        "kept_boot": None if spot["kept_boot"] is None else round(spot["kept_boot"], 3),
        "join_to_switch_s": None if spot["boot_s"] is None else round(spot["boot_s"], 2),
        "max_pause_s": round(spot["max_pause_s"], 3),
        "switch_ms": None if spot["switch_ms"] is None else round(spot["switch_ms"], 1),
        "step_ms": round(spot["step_ms"], 1),
        "restart_ratio": round(spot["samples"] / base["samples"], 3) if base["samples"] else None,
        "spotring_samples": spot["samples"],
        "baseline_samples": base["samples"],
        "baseline_restart_pause_s": base["restart_pause_s"] and round(base["restart_pause_s"], 2),
        "agent_boot_s": round(boot, 2),
        "workdir": str(workdir),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
