"""The GPU benchmark command (benchmarks/gpu.py) without a GPU: its path, in seconds.

CI has no GPU, so the GPU figures are checked for what can go wrong before a GPU is lent:
``gpu.py --dry-run`` prints one JSON line per figure, every figure's command parses with its
benchmark's own argument parser (a renamed flag would otherwise surface only on the GPU
machine), and the benchmark-only jobs (a ResNet-50-sized CNN and a GPT-2-small-sized
transformer) build and train a step at their ``BENCH_TINY`` size through the trainer's own
step and the baselines' batch path. The whole command runs on a CPU with ``--device cpu
--tiny`` (a few minutes: by hand, docs/benchmarks-trainer.md).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device,tiny", [("cuda", False), ("cpu", True)])
def test_dry_run_prints_one_line_per_figure_and_every_command_parses(device, tiny):
    argv = [sys.executable, str(BENCH / "gpu.py"), "--dry-run", "--device", device]
    out = subprocess.run(argv + (["--tiny"] if tiny else []), capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    lines = [json.loads(x) for x in out.splitlines()]
    names = [x["figure"] for x in lines]
    assert {n[0] for n in names} == {"a", "b", "c", "d"}
    assert len(names) == len(set(names)) == 8
    parsers = {s: _load(s).build_parser() for s in ("trainer_overhead", "trainer_revoke",
                                                    "trainer_join")}
    for line in lines:
        assert line["dry_run"] and line["command"].startswith("python3 benchmarks/")
        script, *flags = line["argv"]
        args = parsers[Path(script).stem].parse_args(flags)
        assert args.device == device
        if Path(script).stem == "trainer_overhead":
            if line["figure"][0] in "ac":
                assert args.workers == 1 and args.baseline == "plain"
            else:
                assert args.workers in (2, 4) and args.baseline == "ddp"
            for item in args.env:
                assert "=" in item


def test_only_selects_groups_and_names():
    out = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--dry-run", "--only",
                          "c,d_join"], capture_output=True, text=True, check=True).stdout
    assert [json.loads(x)["figure"] for x in out.splitlines()] == [
        "c_resnet50_bf16", "c_gpt2_bf16", "d_join"]


def test_goals_are_read_from_each_benchmarks_line():
    gpu = _load("gpu")
    assert gpu.met("a_plain_resnet50_fp32", "ratio >= 0.98", {"ratio": 0.985}) is True
    assert gpu.met("c_gpt2_bf16", "ratio >= 0.98", {"ratio": 0.9}) is False
    assert gpu.met("b_gloo_ring4_resnet50", "x", {"ddp_ratio": 1.0}) is True
    assert gpu.met("d_revoke", "x", {"steps_lost_notice": 0, "steps_lost_kill": 1,
                                     "kill_recover_ms": 700}) is True
    assert gpu.met("d_join", "x", {"kept": 0.9}) is False
    assert gpu.met("a_plain_mlp13m", None, {"ratio": 0.5}) is None
    assert gpu.met("d_join", "x", {}) is None


@pytest.mark.parametrize("job", ["resnet", "gpt"])
def test_tiny_jobs_train_a_step_through_the_trainer_and_the_baselines_batches(job, monkeypatch):
    import torch

    from trainer.collective.step import Stepper
    from trainer.job import load_job

    monkeypatch.setenv("BENCH_TINY", "1")
    monkeypatch.setenv("BENCH_PRECISION", "bf16")
    common = _load("_common")
    j = load_job(str(BENCH / "jobs" / f"{job}.py"), 0)
    assert j.precision == "bf16" and j.global_batch == (32 if job == "resnet" else 8)
    x, y = common._make_batch(j, torch.arange(4), torch.device("cpu"))
    assert torch.equal(x, j.train_set.tensors[0][:4])
    stepper = Stepper(j.model, j.optimizer, j.loss_fn, world=1, rank=0,
                      device=torch.device("cpu"), precision=j.precision)
    before = [p.detach().clone() for p in j.model.parameters()]

    from datetime import timedelta

    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    res = stepper.step(group, (x, y), 4, 4, step=0, latest=0, eval_s=0.0,
                       should_abort=lambda: False)
    stepper.close()
    assert res.loss > 0 and not res.skipped
    assert any(not torch.equal(a, b) for a, b in zip(before, j.model.parameters()))


def test_full_size_jobs_have_the_published_parameter_counts(monkeypatch):
    """ResNet-50: 25,557,032 parameters; GPT-2 small (tied head): 124,439,808. Built with a
    tiny dataset so the check stays cheap."""
    from trainer.job import load_job

    monkeypatch.delenv("BENCH_TINY", raising=False)
    monkeypatch.setenv("BENCH_SAMPLES", "2")
    monkeypatch.setenv("GPT_CONTEXT", "8")  # positions: 8 x 768 instead of 1024 x 768
    counts = {}
    for job in ("resnet", "gpt"):
        j = load_job(str(BENCH / "jobs" / f"{job}.py"), 0)
        counts[job] = sum(p.numel() for p in j.model.parameters())
    assert counts["resnet"] == 25_557_032
    assert counts["gpt"] == 124_439_808 - (1024 - 8) * 768


@pytest.mark.slow  # its probes wait out watchdogs: started first, it does not end the suite
def test_dry_runs_the_quick_device_check_on_the_cpu_and_prints_one_line(tmp_path):
    """``gpu.py --dry`` (CI): the probes run for real with the NCCL double and meet their
    goals (the new wait gives up and the process outlives the watchdog; the old blocking
    wait is killed; a poisoned store root kills a process under a PrefixStore, not under the
    namespaced store; one gradient copy at a switch); the figures' commands parse."""
    out = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--dry", "--workdir",
                          str(tmp_path)], capture_output=True, text=True, check=False,
                         cwd=REPO, timeout=1000).stdout
    (line,) = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert line["quick"] and line["dry"], line
    assert line["met"] == {"probes": True}, line["probes"]
    p = line["probes"]
    assert p["backend"] == "double"
    assert p["f1"]["future_done_at_enqueue"] and not p["f1"]["completed_at_enqueue"]
    assert p["f1"]["old_path_exit"] < 0 and not p["f1"]["old_path_alive"]
    assert p["f3"]["prefix_exit"] < 0 and p["f3"]["namespaced_alive"]
    assert p["memory"]["switch_grad_copies"] == 1.0
    gpu = _load("gpu")
    assert set(line["figures"]) == set(gpu.QUICK)
    parsers = {s: _load(s).build_parser() for s in ("trainer_overhead", "trainer_revoke")}
    for fig in line["figures"].values():
        script, *flags = fig["argv"]
        args = parsers[Path(script).stem].parse_args(flags)
        if Path(script).stem == "trainer_overhead":
            assert (args.slice, args.pairs, args.warmup) == (3.0, 2, 1)
