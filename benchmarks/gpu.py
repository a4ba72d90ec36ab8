"""The trainer's GPU measures in one command (issue 14, item 9): one JSON line per figure.

Design. This script runs the other trainer benchmarks as child processes, each with the
flags of one figure, and prints one JSON line per figure as soon as it is measured:
``{"figure", "what", "goal", "met", "command", "result"}``, ``result`` being the benchmark's
own JSON line (its baseline measured in the same run, as every benchmark here). The figures:

* ``a_plain_resnet50_fp32``: one spotring worker on the GPU against a plain single-GPU loop
  of the same job (``_common.py --mode plain``: no DDP, no process group), ResNet-50 sized
  (``benchmarks/jobs/resnet.py``), fp32, batch 128; goal ``ratio >= 0.98`` (samples/s).
* ``a_plain_mlp13m``: the same on the 13.3M-parameter digits MLP (B = 256, about a
  millisecond a step on an H100): the trainer's fixed cost per step,
  ``overhead_ms_per_step``, where a step is short; no goal.
* ``b_gloo_ring2_resnet50``, ``b_gloo_ring4_resnet50``: rings of 2 and 4 workers sharing
  the one GPU (the coordinator picks gloo, with CUDA tensors, when members share a GPU)
  against ``DistributedDataParallel`` on the same setup (``init_process_group("gloo")``,
  the CUDA model, ``device_ids``; 25 MB buckets); goal ``ddp_ratio >= 0.98``. The figure
  also gives the reduction's share of the step (``reduction_share``, timed apart).
* ``c_resnet50_bf16``, ``c_gpt2_bf16``: ResNet-50 (batch 256, channels-last) and a
  GPT-2-small-sized transformer (``benchmarks/jobs/gpt.py``: 124M parameters, context 1024,
  batch 16) in bf16 autocast, one worker against the plain loop; samples/s, and tokens/s for
  GPT; goal ``ratio >= 0.98``.
* ``d_revoke``, ``d_join``: ``trainer_revoke.py`` and ``trainer_join.py`` with every worker on
  the GPU (``--device cuda``; the join pins the ring to CPUs 0-7 and the joiner to 8-15);
  goals as on the CPU: 0 / <= 1 steps lost, ``kill_recover_ms <= 1000``, ``kept >= 0.99``.

Measure. Everything runs on one machine with one GPU, one figure at a time; the ratios are
each benchmark's own (turns of spotring and its baseline alternating in ABBA order, every
process of the side not running stopped, so both see the same GPU and host). The device tool
of this project runs a command for at most 10 minutes, so run the figures in two calls:
``--only a,c`` (about 6 minutes) and ``--only b,d`` (about 6 minutes).

``--quick`` (issue 29, item 6) is the device check that fits a short lease: at most 6
minutes on one H100, and ONE JSON line: ``a_plain_resnet50_fp32`` and ``c_gpt2_bf16`` with
short turns (ratio goal >= 0.98), ``d_revoke`` (a notice, a kill and a hang of workers on the
GPU: steps lost, ``kill_recover_ms``, ``hang_detect_s``; the workers share the one GPU, so
that ring is gloo with CUDA tensors), and ``benchmarks/nccl_probes.py`` on the real backend
(F1: a collective held pending, old and new waits; F3: a poisoned store root; the gradient
copies at a switch). ``--dry`` runs the same path on the CPU in seconds (CI): the probes
with the NCCL double of tests/fakes/nccl.py and a tiny model, the figures' commands built
but not run.

``--device cpu --tiny`` runs the same command path on a CPU with small models, few steps
and short turns (a smoke test, 3-5 minutes on 2 cores; the figures mean nothing there);
``--dry-run`` prints each figure's command without running it (tests/trainer/
test_bench_gpu.py checks that every command parses).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
JOBS = HERE / "jobs"
GROUPS = ("a", "b", "c", "d")


def figures(device: str, tiny: bool, join_pin: str) -> list[dict[str, Any]]:
    """Every figure: its name, what it measures, its goal and its command (argv after the
    interpreter). ``tiny``: small models and short turns (a smoke test of the path)."""
    resnet, gpt = str(JOBS / "resnet.py"), str(JOBS / "gpt.py")
    tiny_env = ["--env", "BENCH_TINY=1"] if tiny else []
    # turns: long enough for a dozen big steps on an H100; a handful of small ones on a CPU
    turns = (["--slice", "1.5", "--pairs", "1", "--warmup", "0", "--timeout", "300"] if tiny
             else ["--slice", "5", "--pairs", "4", "--warmup", "1", "--timeout", "300"])
    ov = [str(HERE / "trainer_overhead.py"), "--device", device, *turns]

    def batch(full: int, small: int) -> list[str]:
        return ["--global-batch", str(small if tiny else full)]

    out = [
        dict(figure="a_plain_resnet50_fp32", group="a", goal="ratio >= 0.98",
             what="one worker / plain single-GPU loop, ResNet-50 fp32, samples/s",
             argv=[*ov, "--workers", "1", "--baseline", "plain", "--no-probe", "--job", resnet,
                   *tiny_env, *batch(128, 32)]),
        dict(figure="a_plain_mlp13m", group="a", goal=None,
             what="one worker / plain loop, 13.3M-parameter MLP: fixed cost per short step",
             argv=[*ov, "--workers", "1", "--baseline", "plain", "--no-probe", "--model", "mlp",
                   *(["--env", "DIGITS_WIDTH=256"] if tiny else []), *batch(256, 64)]),
        dict(figure="b_gloo_ring2_resnet50", group="b", goal="ddp_ratio >= 0.98",
             what="2 workers sharing the GPU over gloo / DDP (gloo, device_ids), ResNet-50 fp32",
             argv=[*ov, "--workers", "2", "--job", resnet, *tiny_env, *batch(128, 32)]),
        dict(figure="b_gloo_ring4_resnet50", group="b", goal="ddp_ratio >= 0.98",
             what="4 workers sharing the GPU over gloo / DDP (gloo, device_ids), ResNet-50 fp32",
             argv=[*ov, "--workers", "4", "--job", resnet, *tiny_env, *batch(128, 32)]),
        dict(figure="c_resnet50_bf16", group="c", goal="ratio >= 0.98",
             what="one worker / plain loop, ResNet-50 bf16 channels-last, samples/s",
             argv=[*ov, "--workers", "1", "--baseline", "plain", "--no-probe", "--job", resnet,
                   "--env", "BENCH_PRECISION=bf16", "--env", "RESNET_CHANNELS_LAST=1",
                   *tiny_env, *batch(256, 32)]),
        dict(figure="c_gpt2_bf16", group="c", goal="ratio >= 0.98",
             what="one worker / plain loop, GPT-2 small bf16, samples/s and tokens/s",
             argv=[*ov, "--workers", "1", "--baseline", "plain", "--no-probe", "--job", gpt,
                   "--env", "BENCH_PRECISION=bf16", *tiny_env, *batch(16, 8),
                   "--tokens-per-sample", "64" if tiny else "1024"]),
        dict(figure="d_revoke", group="d",
             goal="steps_lost_notice == 0, steps_lost_kill <= 1, kill_recover_ms <= 1000",
             what="notice, SIGKILL, SIGSTOP of workers on the GPU (4 workers, digits)",
             argv=[str(HERE / "trainer_revoke.py"), "--device", device, "--timeout", "300",
                   *(["--settle-steps", "4"] if tiny else [])]),
        dict(figure="d_join", group="d", goal="kept >= 0.99",
             what="a hot join on the GPU (2 workers + 1 joiner, digits) / torchrun restart",
             argv=[str(HERE / "trainer_join.py"), "--device", device, "--timeout", "300",
                   "--pin", join_pin,
                   *(["--window", "5", "--before", "2", "--warm-steps", "5"] if tiny else [])]),
    ]
    return out


QUICK = ("a_plain_resnet50_fp32", "c_gpt2_bf16", "d_revoke")
QUICK_TURNS = ["--slice", "3", "--pairs", "2", "--warmup", "1"]
QUICK_TIMEOUT_S = {"a_plain_resnet50_fp32": 100.0, "c_gpt2_bf16": 100.0, "d_revoke": 110.0,
                   "probes": 90.0}  # 400 s at most; about 5 minutes expected on an H100


def quick_figures(device: str, join_pin: str) -> list[dict[str, Any]]:
    """The figures of ``--quick``: those of :data:`QUICK`, with shorter turns."""
    out = []
    for fig in figures(device, False, join_pin):
        if fig["figure"] not in QUICK:
            continue
        argv = list(fig["argv"])
        if "--slice" in argv:
            i = argv.index("--slice")
            del argv[i:i + 6]  # --slice S --pairs P --warmup W
            argv[1:1] = QUICK_TURNS
        out.append({**fig, "argv": argv})
    return out


def quick(device: str, dry: bool, join_pin: str, workdir: Path) -> dict[str, Any]:
    """``--quick`` (``dry``: ``--dry``): every figure and the probes, in one dict."""
    t0 = time.monotonic()
    line: dict[str, Any] = {"quick": True, "dry": dry, "device": device, "figures": {},
                            "met": {}}
    for fig in quick_figures(device, join_pin):
        name = fig["figure"]
        if dry:
            line["figures"][name] = {"not_run": True, "argv": fig["argv"]}
            continue
        print(f"[gpu.py] {name}: running", file=sys.stderr, flush=True)
        got = run(fig, workdir, QUICK_TIMEOUT_S[name])
        line["figures"][name] = got.get("result", got)
        line["met"][name] = met(name, fig["goal"], got["result"]) if "result" in got else None
        # each figure as it comes, so a lease that ends early still leaves the first ones
        print(f"[gpu.py] {name}: " + json.dumps(line["figures"][name], sort_keys=True),
              file=sys.stderr, flush=True)
    probe = [str(HERE / "nccl_probes.py")]
    probe += (["--backend", "double", "--tiny", "--group-timeout", "1", "--probe-s", "1.5"]
              if dry else ["--group-timeout", "4", "--probe-s", "10"])
    # a CPU shared with other work may take minutes to start the probes' children
    got = run({"figure": "probes", "argv": probe}, workdir,
              900.0 if dry else QUICK_TIMEOUT_S["probes"])
    probes = got.get("result", got)
    line["probes"] = probes
    line["met"]["probes"] = probes_met(probes) if "result" in got else None
    line["wall_s"] = round(time.monotonic() - t0, 1)
    return line


def probes_met(p: dict[str, Any]) -> bool | None:
    """The probes' goals: the new wait gives up and the process outlives the group's timeout
    after the abort; the namespaced store protects a fresh process; one gradient copy at a
    switch (None when a probe is missing)."""
    try:
        return (p["f1"]["poll"] == "broken" and p["f1"]["new_path_alive"] is True
                and p["f3"]["namespaced_alive"] is True
                and p["memory"]["switch_grad_copies"] <= 1.05)
    except (KeyError, TypeError):
        return None


def met(figure: str, goal: str | None, result: dict[str, Any]) -> bool | None:
    """Whether ``result`` meets the figure's goal (None: no goal, or a figure missing)."""
    if goal is None:
        return None
    try:
        if figure.startswith(("a_", "c_")):
            return result["ratio"] >= 0.98
        if figure.startswith("b_"):
            return result["ddp_ratio"] >= 0.98
        if figure == "d_revoke":
            return (result["steps_lost_notice"] == 0 and result["steps_lost_kill"] <= 1
                    and result["kill_recover_ms"] <= 1000)
        if figure == "d_join":
            return result["kept"] >= 0.99
    except (KeyError, TypeError):
        return None
    return None


def run(fig: dict[str, Any], workdir: Path, timeout: float) -> dict[str, Any]:
    """Run one figure's benchmark; its JSON line, or the error with its log's tail."""
    logf = workdir / f"{fig['figure']}.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    argv = [*fig["argv"], "--workdir", str(workdir / fig["figure"])]
    t0 = time.monotonic()
    with open(logf, "wb") as err:
        # a session of its own, so that a figure past its time ends with every process below
        # it (its rings run in sessions of their own: one left behind kept the GPU busy under
        # the next figures on the first H200 run)
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=err,
                                env=env, cwd=str(REPO), start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            from _common import stop

            stop([proc])
            return {"error": f"timed out after {timeout:.0f}s", "log": str(logf)}
    line = (stdout.decode(errors="replace").strip().splitlines() or [""])[-1]
    try:
        result = json.loads(line)
    except json.JSONDecodeError:
        tail = logf.read_text(errors="replace").splitlines()[-8:]
        return {"error": f"exit {proc.returncode}, no JSON line", "log": str(logf),
                "tail": tail}
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return {"result": result}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu with --tiny")
    ap.add_argument("--tiny", action="store_true",
                    help="small models, few steps, short turns: a smoke test of the command path")
    ap.add_argument("--only", default=",".join(GROUPS),
                    help="comma list of figure groups or names (default a,b,c,d)")
    ap.add_argument("--join-pin", default=None,
                    help="trainer_join --pin (default '0-7;8-15' with 16 CPUs or more, else "
                    "its own default '0;1')")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per figure (600)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--quick", action="store_true",
                    help="the short device check (<= 6 min on one H100): one JSON line")
    ap.add_argument("--dry", action="store_true",
                    help="--quick on the CPU in seconds (the NCCL double; figures not run)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    cpus = os.cpu_count() or 1
    pin = args.join_pin if args.join_pin is not None else (
        "0-7;8-15" if cpus >= 16 else "0;1" if cpus >= 2 else "")
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    figs = [f for f in figures(args.device, args.tiny, pin)
            if f["group"] in wanted or f["figure"] in wanted]
    if not figs:
        ap.error(f"--only {args.only!r}: no figure; use groups {', '.join(GROUPS)} or names")
    if args.device == "cpu" and not args.tiny and not args.dry_run:
        ap.error("--device cpu runs the smoke test only: add --tiny")
    workdir = args.workdir or Path(f"/tmp/spotring-gpu-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.quick or args.dry:
        workdir.mkdir(parents=True, exist_ok=True)
        line = quick("cpu" if args.dry else args.device, args.dry, pin, workdir)
        print(json.dumps(line, sort_keys=True), flush=True)
        return 0 if all(v is not False for v in line["met"].values()) else 1
    failed = 0
    for fig in figs:
        line: dict[str, Any] = {"figure": fig["figure"], "what": fig["what"], "goal": fig["goal"],
                                "device": args.device, "tiny": args.tiny,
                                "command": " ".join(["python3", *[os.path.relpath(a, REPO)
                                                                  if a.startswith(str(REPO))
                                                                  else a for a in fig["argv"]]])}
        if args.dry_run:
            line["dry_run"] = True
            line["argv"] = fig["argv"]
        else:
            workdir.mkdir(parents=True, exist_ok=True)
            print(f"[gpu.py] {fig['figure']}: running ({line['command']})", file=sys.stderr,
                  flush=True)
            got = run(fig, workdir, args.timeout)
            line.update(got)
            line["met"] = met(fig["figure"], fig["goal"], got["result"]) if "result" in got \
                else None
            failed += "error" in got
        print(json.dumps(line, sort_keys=True), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
