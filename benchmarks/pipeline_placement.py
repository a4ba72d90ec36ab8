"""What a pipeline member keeps resident: its stage, not the whole model (issue 19, item 1).

Design. For each stage ``j`` of a ``k``-stage cut of a GPT-2-small-like model
(:func:`pipeline_profile.gpt2_like`; stage boundaries at equal shares of its FLOPs,
:func:`pipeline_profile.flops_profile`), a fresh model is built on the host as a job builds
it, given Adam's state (one step of zero gradients), and placed as a member of stage ``j``
places it (:meth:`trainer.pipeline.stagestate.ModelIndex.place` after ``keep_only``). It
reports the bytes resident on the member's device (weights and buffers, optimiser state) and
the process's resident set before and after. On a CPU the device is the host, so the RSS
drop is the released layers' memory given back; on a GPU the resident bytes are what the
device holds.

Each stage is measured in a process of its own. Output: one JSON line on stdout. ``--blocks 2
--width 64 --seq 32 --vocab 512`` runs small.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pipeline_profile as prof  # noqa: E402

from trainer.pipeline import placement  # noqa: E402
from trainer.pipeline.stagestate import ModelIndex  # noqa: E402


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def bounds(costs: list[float], stages: int) -> list[int]:
    """Cut points nearest to equal shares of the total cost (contiguous, non-empty)."""
    prefix = [sum(costs[:c]) for c in range(len(costs) + 1)]
    cuts = [0]
    for j in range(1, stages):
        lo, hi = cuts[-1] + 1, len(costs) - (stages - j)
        cuts.append(min(range(lo, hi + 1),
                        key=lambda c: abs(prefix[c] - prefix[-1] * j / stages)))
    return cuts + [len(costs)]


def one_stage(shape: dict[str, int], lo: int, hi: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = prof.gpt2_like(shape["blocks"], shape["width"], shape["heads"], shape["seq"],
                           shape["vocab"])
    opt = torch.optim.Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    index = ModelIndex(model, opt)
    cpu = torch.device("cpu")
    whole = index.resident(opt, cpu)
    gc.collect()
    before = _rss()
    index.keep_only(opt, lo, hi)
    index.place(placement.decide(len(index), lo, hi), cpu, opt)
    gc.collect()
    return {"layers": [lo, hi], "whole_mb": round(sum(whole) / 1e6, 1),
            "resident_mb": round(sum(index.resident(opt, cpu)) / 1e6, 1),
            "rss_before_mb": round(before / 1e6, 1), "rss_after_mb": round(_rss() / 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=4)
    for k, v in prof.GPT2_SMALL.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--one", default=None, help="lo,hi: measure this stage only (each "
                    "stage runs in a process of its own, so the resident sets are clean)")
    a = ap.parse_args(argv)
    shape = {k: getattr(a, k) for k in prof.GPT2_SMALL}
    if a.one:
        lo, hi = map(int, a.one.split(","))
        print(json.dumps(one_stage(shape, lo, hi)))
        return 0
    costs = [x["seconds"] for x in prof.flops_profile(a.blocks, a.width, a.seq, a.vocab)]
    cuts = bounds(costs, a.stages)
    extra = [f"--{k}={v}" for k, v in shape.items()]
    out = [json.loads(subprocess.run(
        [sys.executable, __file__, "--one", f"{cuts[j]},{cuts[j + 1]}", *extra],
        check=True, capture_output=True, text=True).stdout) for j in range(len(cuts) - 1)]
    print(json.dumps({"shape": shape, "stages": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
