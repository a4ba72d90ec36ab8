"""Benchmark: the elastic ring's steady cost against plain DistributedDataParallel (issues 3, 14).

Design. The same job (examples/digits.py by default; ``--model mlp`` for its 13.3M-parameter
MLP, ``--job`` for any job file, ``--env KEY=VALUE`` for its knobs), global batch, device and
number of processes run as a spotring ring (a ``python -m trainer coordinator`` process and
``python -m trainer worker`` processes) and as plain
``torch.nn.parallel.DistributedDataParallel`` ranks with DDP's defaults (25 MB buckets) under
the real ``torchrun`` (``benchmarks/_common.py --mode ddp --epoch-loop``), or with
``--baseline plain --workers 1`` as the plain single-device loop (``--mode plain``: no DDP, no
process group). Both do the same work: the baseline walks the job's epochs as a spotring
worker does (same seeded order, the short last step of each epoch) and runs the job's
``evaluate`` on rank 0 at each epoch end, as spotring's rank 0 does; both run the job's
precision on ``--device`` (cpu by default; on ``cuda`` several ranks share the GPU and both
sides reduce over gloo with CUDA tensors). Both write one metrics line per step.

Measure. On a shared 2-core machine the other tenants' load moves by the second, and two
separate runs of a few seconds each differed by 2x here. So both systems are started once
and run in turns: every process of one side (for spotring the coordinator too) is stopped
with SIGSTOP while the other side runs for ``--slice`` seconds (default 3: ~150 digits
steps), then they swap. Turns come in ABBA order (DDP, spotring, spotring, DDP, ...) after
``--warmup`` slices each, so a drift of the load favours neither side. A slice's rate is the
samples of the steps completed in it, the first one left out (it contains the pause), over
the time from that first completion to the last. Slices are paired in order (pair k = turns
2k and 2k+1); each pair gives one ratio; ``ddp_ratio`` is the median of ``--pairs`` (default
6) pair ratios. Heartbeat and collective timeouts are far longer than a slice, so the ring
never notices its pauses.

Figures (one JSON line on stdout): ``ratio`` (and ``ddp_ratio`` or ``plain_ratio``, the same
number named after the baseline) = steady samples/s of spotring / of the baseline (goal >=
0.98); ``ratios`` (one per pair), ``ratio_min``, ``ratio_max``; ``pooled_ratio``: the
step-weighted mean rate of spotring's slices against the baseline's; the median rates
(``*_tokens_per_s`` too with ``--tokens-per-sample``); ``overhead_ms_per_step`` = B / spotring's
rate - B / the baseline's (what a step costs more; negative: less); ``steady_steps``: steps
counted per side; ``ddp_ratio_train_only``: the same median against the baseline with its
evaluation time taken out (the comparison as it was made before 2026-11-22 03:00; stricter);
``cpu_ratio``: the baseline's CPU seconds per sample (every process of the side, from
``/proc``, over the same slices) / spotring's (coordinator included), median over the pairs:
on a machine whose cores other tenants saturate, the rate a side gets follows its CPU per
sample, so this explains a low ``ratio`` there and is far less noisy than it;
``spotring_wait_share``: median share of a spotring step spent waiting for the reduction
after the backward pass (what the overlap did not hide); ``load``: the 1-minute load average
before and after. With a reduction (``--workers`` > 1) and ``--probe`` (default), after the
turns ``_common.py --mode probe`` times the local step and a bare all-reduce of a flat buffer
the size of the gradients apart, on the same ranks: ``reduction_share`` = all-reduce / (step
+ all-reduce), the share of the step the reduction would take if nothing overlapped it
(``probe_compute_ms``, ``probe_allreduce_ms``, ``grad_mb``).

Memory (``--memory``, issue 14 item 2: peak memory at most DDP's plus one bucket). Both sides
load the job through ``benchmarks/jobs/rss.py``, which records each process's RSS at the end
of ``make_job``; the benchmark reads rank 0's peak RSS (``VmHWM``) once it has done
``--memory-steps`` (20) steps, and again at the end. ``memory`` holds each side's growth
(peak - RSS when the job was built, MB), ``ratio`` (spotring / baseline), whether spotring
stays within the baseline plus one bucket (``--bucket-mb``, 25), and the gradient + bucket
bytes counted from the model: spotring's buckets hold the gradients themselves
(``Reducer.nbytes``: gradients plus the step's tail), DDP's defaults hold each ``.grad`` and
a bucket copy of it (``gradient_as_bucket_view=False``).
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
    DEFAULT_JOB, PYTHON, REPO, descendants, digits_env, emit, free_port, plain, proc_status_kb,
    read_jsonl, setup_logging, spawn, stop, torchrun, wait_for,
)

RSS_JOB = REPO / "benchmarks" / "jobs" / "rss.py"  # the wrapper that records RSS when built
RSS_ENV_JOB, RSS_ENV_DIR = "RSS_JOB", "RSS_DIR"

log = logging.getLogger("benchmarks.overhead")


def signal_all(procs: list[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to every process of ``procs`` and their descendants."""
    for proc in procs:
        for pid in descendants(proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def cpu_seconds(procs: list[subprocess.Popen]) -> float:
    """User + system CPU seconds used so far by ``procs`` and every process below them
    (``/proc/<pid>/stat``: all threads, exited ones included)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in procs:
        for pid in descendants(proc.pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=256,
                    help="B (sets DIGITS_BATCH and BENCH_BATCH for the job; default 256)")
    ap.add_argument("--slice", type=float, default=3.0, help="seconds per turn")
    ap.add_argument("--pairs", type=int, default=6, help="measured pairs of turns (ABBA)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured turns per side first")
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--model", choices=("cnn", "mlp"), default=None,
                    help="examples/digits.py's model (DIGITS_MODEL): mlp is the 13.3M-parameter "
                    "MLP whose reduction is a real share of the step")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="add to both sides' environment (repeatable; e.g. DIGITS_WIDTH=2048)")
    ap.add_argument("--baseline", choices=("ddp", "plain"), default="ddp",
                    help="ddp: DistributedDataParallel under torchrun (default); plain: a "
                    "single-device loop without any process group (needs --workers 1)")
    ap.add_argument("--device", default="cpu",
                    help="both sides' device: cpu (default), cuda, cuda:N; several ranks on "
                    "one GPU reduce over gloo with CUDA tensors on both sides")
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="the spotring workers' --bucket-mb (default: theirs, 25 as DDP's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (1)")
    ap.add_argument("--memory", action="store_true",
                    help="also measure each side's peak RSS growth of rank 0 (VmHWM over its "
                    "first --memory-steps steps against its RSS once the job is built)")
    ap.add_argument("--memory-steps", type=int, default=20)
    ap.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                    help="time the local step and a bare all-reduce of the gradients apart "
                    "after the turns: the reduction's share of the step (default on; off "
                    "without a reduction: --workers 1)")
    ap.add_argument("--tokens-per-sample", type=int, default=0,
                    help="report tokens/s too (a language model's context length)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=180.0, help="boot timeout (s)")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``["K=V", ...]`` -> ``{K: V}``; raises ``ValueError`` naming ``--env`` and the form."""
    out = {}
    for item in pairs:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--env {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def grad_bucket_mb(job_path: Path, env: dict[str, str], workers: int,
                   bucket_mb: float | None) -> dict[str, float]:
    """Gradient and bucket memory of each side, counted from the model (MB): spotring's
    gradients are views into its buckets (:class:`trainer.collective.reducer.Reducer`, its ``nbytes``:
    the gradients plus the step's tail); DDP with its defaults (``gradient_as_bucket_view=
    False``) holds each ``.grad`` and a bucket copy of it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from trainer.job import load_job
        from trainer.collective.step import Stepper

        job = load_job(str(job_path), 0)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    kw = {"bucket_mb": bucket_mb} if bucket_mb else {}
    stepper = Stepper(job.model, job.optimizer, job.loss_fn, world=workers, rank=0,
                      device=next(job.model.parameters()).device, **kw)
    spot = stepper.reducer.nbytes
    stepper.close()
    grads = sum(p.numel() * p.element_size() for p in job.model.parameters() if p.requires_grad)
    return {"spotring": spot / 2**20, "ddp": 2 * grads / 2**20, "grads": grads / 2**20,
            "params": sum(p.numel() for p in job.model.parameters())}


def _ms(xs: list[float]) -> float | None:
    """The median of ``xs`` seconds in milliseconds (None when empty)."""
    return round(statistics.median(xs) * 1e3, 2) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.workers < 1 or args.pairs < 1 or args.slice < 0.5 or args.warmup < 0:
        ap.error("--workers >= 1, --pairs >= 1, --slice >= 0.5, --warmup >= 0")
    if args.baseline == "plain" and args.workers != 1:
        ap.error("--baseline plain is one process: use --workers 1")
    try:
        extra_env = parse_env(args.env)
    except ValueError as e:
        ap.error(str(e))
    if args.model:
        extra_env["DIGITS_MODEL"] = args.model
    load0 = os.getloadavg()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-overhead-"))
    workdir.mkdir(parents=True, exist_ok=True)
    steps_needed = int((args.pairs + args.warmup + 2) * args.slice * 200) + 1000
    env = {**digits_env(args.global_batch, steps_needed), "BENCH_BATCH": str(args.global_batch),
           "OMP_NUM_THREADS": str(args.threads), **extra_env}
    job = args.job.resolve()
    rss_dir = workdir / "rss"
    if args.memory:  # both sides load the job through the wrapper that records RSS when built
        env.update({RSS_ENV_JOB: str(job), RSS_ENV_DIR: str(rss_dir)})
        job = RSS_JOB
    token = workdir / "token"
    token.write_bytes(os.urandom(16).hex().encode())
    port = free_port()
    names = [f"w{k}" for k in range(args.workers)]
    bucket = ["--bucket-mb", str(args.bucket_mb)] if args.bucket_mb else []
    ring = [spawn([PYTHON, "-m", "trainer", "--log-level", "WARNING", "coordinator",
                   "--host", "127.0.0.1", "--port", str(port), "--token-file", str(token),
                   "--heartbeat-timeout", "120", "--initial-world", str(args.workers)],
                  workdir / "coordinator.log")]
    ring += [spawn([PYTHON, "-m", "trainer", "--log-level", "WARNING", "worker",
                    "--coordinator", f"127.0.0.1:{port}", "--token-file", str(token),
                    "--job", str(job), "--name", n, "--collective-timeout", "120",
                    "--device", args.device, "--threads", str(args.threads), *bucket,
                    "--metrics-file", str(workdir / f"{n}.jsonl")],
                   workdir / f"{n}.log", env) for n in names]
    ddp_metrics = workdir / "ddp.jsonl"
    base_args = ["--epoch-loop", "--global-batch", str(args.global_batch), "--job", str(job),
                 "--device", args.device, "--threads", str(args.threads),
                 "--metrics-file", str(ddp_metrics)]
    if args.baseline == "plain":
        ddp = [plain(base_args, workdir / "ddp.log", env)]
    else:
        ddp = [torchrun(args.workers, ["--mode", "ddp", *base_args], workdir / "ddp.log", env)]
    sides = {"ring": ring, "ddp": ddp}
    files = {"ring": workdir / f"{names[0]}.jsonl", "ddp": ddp_metrics}
    peaks: dict[str, dict[str, int | None]] = {}
    try:
        boot_steps = max(20, args.memory_steps if args.memory else 0)

        def booted() -> bool:
            done = True
            for side, path in files.items():
                n = len(read_jsonl(path))
                if args.memory and side not in peaks and n >= args.memory_steps:
                    peaks[side] = {"steps": n, **rank0_memory(side, sides, rss_dir)}
                done = done and n >= boot_steps
            return done

        wait_for(booted, args.timeout, f"both sides to run {boot_steps} steps (logs in {workdir})")
        signal_all(ring, signal.SIGSTOP)
        turns = ["ddp", "ring"] * args.warmup
        for k in range(args.pairs):
            turns += ["ddp", "ring"] if k % 2 == 0 else ["ring", "ddp"]
        running = "ddp"
        slices: list[tuple[str, float, float]] = []
        cpu: list[float] = []  # CPU seconds the side used in each slice (all its processes)
        for side in turns:
            if side != running:
                signal_all(sides[running], signal.SIGSTOP)
                signal_all(sides[side], signal.SIGCONT)
                running = side
            c0, t0 = cpu_seconds(sides[side]), time.time()
            time.sleep(args.slice)
            slices.append((side, t0, time.time()))
            cpu.append(cpu_seconds(sides[side]) - c0)
        signal_all(sides[running], signal.SIGSTOP)
        recs = {side: read_jsonl(path) for side, path in files.items()}
        end_peaks = {side: rank0_memory(side, sides, rss_dir) for side in sides} if args.memory \
            else {}
    finally:
        for procs in sides.values():
            signal_all(procs, signal.SIGCONT)
            stop(procs, signal.SIGKILL, grace=5.0)
    measured = slices[2 * args.warmup:]
    measured_cpu = cpu[2 * args.warmup:]
    cpu_ratios = []
    ratios, ratios_train, rates = [], [], {"ring": [], "ddp": []}
    totals = {"ring": [0.0, 0], "ddp": [0.0, 0]}
    waits: list[float] = []
    computes: list[float] = []
    steps: list[float] = []
    gaps: list[float] = []
    for k in range(args.pairs):
        got, per_sample = {}, {}
        for (side, t0, t1), used in zip(measured[2 * k: 2 * k + 2],
                                        measured_cpu[2 * k: 2 * k + 2], strict=True):
            rate, n = slice_rate(recs[side], t0, t1)
            got[side] = rate
            done = sum(r["samples"] for r in recs[side] if t0 <= r["t"] < t1)
            per_sample[side] = used / done if done else float("nan")
            if side == "ddp":
                got["ddp_train"] = slice_rate(recs[side], t0, t1, exclude="eval_s")[0]
            else:
                inside = [r for r in recs[side] if t0 <= r["t"] < t1]
                waits += [r["wait_s"] / r["step_s"] for r in inside if r.get("step_s")]
                computes += [r["compute_s"] for r in inside if "compute_s" in r]
                steps += [r["step_s"] for r in inside if "step_s" in r]
                gaps += [b["t"] - a["t"] for a, b in zip(inside, inside[1:])]
            rates[side].append(rate)
            totals[side][0] += rate * n
            totals[side][1] += n
        ratios.append(got["ring"] / got["ddp"])
        cpu_ratios.append(per_sample["ddp"] / per_sample["ring"])
        ratios_train.append(got["ring"] / got["ddp_train"])
        log.info("pair %d: spotring %.1f samples/s, %s %.1f (%.1f without its evaluation): "
                 "ratio %.3f", k, got["ring"], args.baseline, got["ddp"], got["ddp_train"],
                 ratios[-1])
    # pooled: each side's samples over its time (a rate-weighted mean over its slices)
    pooled = {s: totals[s][0] / totals[s][1] for s in totals}
    ring_rate, base_rate = statistics.median(rates["ring"]), statistics.median(rates["ddp"])
    out = {
        "benchmark": "trainer_overhead",
        "baseline": args.baseline,
        "device": args.device,
        "job": str(args.job),
        "env": extra_env,
        "workers": args.workers,
        "global_batch": args.global_batch,
        "slice_s": args.slice,
        "pairs": args.pairs,
        "ratio": round(statistics.median(ratios), 3),
        f"{args.baseline}_ratio": round(statistics.median(ratios), 3),
        "ratios": [round(x, 3) for x in ratios],
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "pooled_ratio": round(pooled["ring"] / pooled["ddp"], 3),
        "ddp_ratio_train_only": round(statistics.median(ratios_train), 3),
        "spotring_samples_per_s": round(ring_rate, 1),
        "ddp_samples_per_s": round(base_rate, 1),
        # the step time spotring adds (negative: it saves), from the two median rates
        "overhead_ms_per_step": round((args.global_batch / ring_rate
                                       - args.global_batch / base_rate) * 1e3, 2),
        "spotring_wait_share": round(statistics.median(waits), 3) if waits else None,
        # where a spotring step's time goes (medians, ms): the compute (forward and backward,
        # the GPU's stream included), the compute and the reduction's wait, and the interval
        # from one step's record to the next; interval - step is the host's own time (commit,
        # batch, records) that neither hides
        "spotring_compute_ms": _ms(computes),
        "spotring_step_ms": _ms(steps),
        "spotring_interval_ms": _ms(gaps),
        # CPU seconds per sample of the baseline's processes / of spotring's (coordinator
        # included): above 1, spotring needs less CPU per sample; it sets the ratio on a
        # machine whose cores are saturated by others
        "cpu_ratio": round(statistics.median(cpu_ratios), 3),
        "cpu_ratios": [round(x, 3) for x in cpu_ratios],
        "steady_steps": {s: totals[s][1] for s in totals},
        "load": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
        "workdir": str(workdir),
    }
    if args.tokens_per_sample:
        out["spotring_tokens_per_s"] = round(ring_rate * args.tokens_per_sample)
        out["ddp_tokens_per_s"] = round(base_rate * args.tokens_per_sample)
    if args.memory:
        out["memory"] = memory_figures(args, peaks, end_peaks, job, env, rss_dir)
    if args.probe and args.workers > 1:
        out.update(probe(args, job, env, workdir))
    emit(out)
    return 0


def rank0_memory(side: str, sides: dict[str, list[subprocess.Popen]],
                 rss_dir: Path) -> dict[str, int | None]:
    """Rank 0's ``VmHWM`` now and its RSS when its job was built (kB) for ``side``."""
    built = {}
    for f in rss_dir.glob("*.json"):
        rec = read_jsonl(f)
        if rec:
            built[rec[0]["pid"]] = rec[0]
    if side == "ring":
        pid = sides["ring"][1].pid  # w0: the worker process itself (no wrapper)
    else:
        below = set(descendants(sides["ddp"][0].pid))
        pid = next((p for p, r in built.items() if p in below and r["rank"] in ("0", "")), -1)
    rec = built.get(pid, {})
    return {"pid": pid, "hwm_kb": proc_status_kb(pid, "VmHWM"),
            "built_rss_kb": rec.get("rss_kb"), "built_hwm_kb": rec.get("hwm_kb")}


def memory_figures(args: argparse.Namespace, peaks: dict, end_peaks: dict, job: Path,
                   env: dict[str, str], rss_dir: Path) -> dict:
    """Peak RSS growth of each side's rank 0 (MB) and the ratio, at ``--memory-steps`` and at
    the end; plus the gradient and bucket memory counted from the model."""
    def growth(p: dict) -> float | None:
        if not p or p.get("hwm_kb") is None or p.get("built_rss_kb") is None:
            return None
        return (p["hwm_kb"] - p["built_rss_kb"]) / 1024

    plain_env = {k: v for k, v in env.items() if k not in (RSS_ENV_JOB, RSS_ENV_DIR)}
    counted = grad_bucket_mb(Path(env.get(RSS_ENV_JOB, job)), plain_env, args.workers,
                             args.bucket_mb)
    bucket = args.bucket_mb or 25.0
    out: dict = {"steps": {s: peaks.get(s, {}).get("steps") for s in ("ring", "ddp")},
                 "bucket_mb": bucket, "params": counted["params"]}
    for when, got in (("", peaks), ("_end", end_peaks)):
        g_ring, g_base = growth(got.get("ring", {})), growth(got.get("ddp", {}))
        out[f"spotring_peak_growth_mb{when}"] = None if g_ring is None else round(g_ring, 1)
        out[f"{args.baseline}_peak_growth_mb{when}"] = None if g_base is None else round(g_base, 1)
        if g_ring is not None and g_base:
            out[f"ratio{when}"] = round(g_ring / g_base, 3)
            out[f"within_one_bucket{when}"] = g_ring <= g_base + bucket
    out["spotring_grad_bucket_mb"] = round(counted["spotring"], 1)
    out["ddp_grad_bucket_mb"] = round(counted["ddp"], 1)
    out["grad_bucket_ratio"] = round(counted["spotring"] / counted["ddp"], 3)
    out["raw"] = {"at_steps": peaks, "end": end_peaks}
    return out


def probe(args: argparse.Namespace, job: Path, env: dict[str, str], workdir: Path) -> dict:
    """The reduction's share of the step, timed apart (``_common.py --mode probe``)."""
    path = workdir / "probe.json"
    proc = torchrun(args.workers, ["--mode", "probe", "--global-batch", str(args.global_batch),
                                   "--job", str(job), "--device", args.device,
                                   "--threads", str(args.threads), "--metrics-file", str(path)],
                    workdir / "probe.log", env)
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        log.warning("the probe did not finish within %.0fs (logs in %s)", args.timeout, workdir)
    finally:
        stop([proc], signal.SIGKILL, grace=1.0)
    rec = read_jsonl(path)
    if not rec:
        return {"reduction_share": None}
    r = rec[0]
    return {"reduction_share": round(r["reduction_share"], 3),
            "probe_compute_ms": round(r["compute_s"] * 1e3, 2),
            "probe_allreduce_ms": round(r["allreduce_s"] * 1e3, 2),
            "grad_mb": round(r["grad_mb"], 2)}


if __name__ == "__main__":
    raise SystemExit(main())
