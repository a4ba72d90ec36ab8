"""A GPT-2-small-like model's per-layer profile: from FLOPs here, measured in bf16 on a GPU.

Design. ``benchmarks/pipeline.py`` emulates stages with sleeps; what each layer costs comes
from a profile, a JSON list of layers (``name``, ``seconds`` per sample forward and backward,
``param_bytes``, ``act_bytes`` per sample) plus, when measured, ``stage_move_s``: the time to
move each stage's weights GPU -> host -> GPU (what a replacement's stage costs when it comes
through host memory). Without a GPU the profile is :func:`flops_profile`: the model's FLOPs
per layer (an embedding, 12 blocks each cut into attention and MLP, the head: 26 layers), so
the *shape* of the costs is GPT-2 small's (the head is as expensive as ~5 blocks) and only the
scale is arbitrary.

On a machine with a GPU, one command measures the real thing (nothing here has run on one
yet: no session so far was lent a GPU)::

    python benchmarks/pipeline_profile.py --out gpt2s_profile.json      # CUDA, bf16
    python benchmarks/pipeline.py --profile gpt2s_profile.json           # fed to the emulator

``--device cpu --blocks 2 --width 64 --seq 32 --vocab 512`` runs the same code small on a CPU
(the tests' smoke run). Output: the profile JSON at ``--out`` and one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

GPT2_SMALL = {"blocks": 12, "width": 768, "heads": 12, "seq": 1024, "vocab": 50257}


def flops_profile(blocks: int = 12, width: int = 768, seq: int = 1024, vocab: int = 50257,
                  bytes_per: int = 2) -> list[dict[str, Any]]:
    """Per-layer forward+backward FLOPs per sample (a sequence of ``seq`` tokens) as
    ``seconds`` at 1 FLOP/s (scale as needed), parameter and activation bytes."""
    d = width
    layers = [{"name": "embed", "seconds": 3.0 * seq * d, "param_bytes": (vocab + seq) * d
               * bytes_per, "act_bytes": seq * d * bytes_per}]
    for b in range(blocks):
        attn = 2 * seq * 4 * d * d + 2 * 2 * seq * seq * d
        layers.append({"name": f"attn{b}", "seconds": 3.0 * attn,
                       "param_bytes": 4 * d * d * bytes_per, "act_bytes": seq * d * bytes_per})
        layers.append({"name": f"mlp{b}", "seconds": 3.0 * 2 * seq * 8 * d * d,
                       "param_bytes": 8 * d * d * bytes_per, "act_bytes": seq * d * bytes_per})
    layers.append({"name": "head", "seconds": 3.0 * 2 * seq * d * vocab,
                   "param_bytes": d * vocab * bytes_per, "act_bytes": seq * vocab * bytes_per})
    return layers


class Embed(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln, self.heads = nn.LayerNorm(d), heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.ln(x))))


class Head(nn.Module):
    def __init__(self, d: int, vocab: int) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def gpt2_like(blocks: int, width: int, heads: int, seq: int, vocab: int) -> nn.Sequential:
    """GPT-2 small's shape as an ``nn.Sequential`` (what the pipeline mode cuts), head untied."""
    layers: list[nn.Module] = [Embed(vocab, seq, width)]
    for _ in range(blocks):
        layers += [Attention(width, heads), MLP(width)]
    return nn.Sequential(*layers, Head(width, vocab))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(model: nn.Sequential, micro: int, seq: int, vocab: int, device: torch.device,
            repeats: int) -> list[dict[str, Any]]:
    """Each layer's forward+backward seconds per sample (the fastest of ``repeats``) on its
    real input, under bf16 autocast on a GPU."""
    cast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
            else torch.autocast("cpu", dtype=torch.bfloat16))
    x: torch.Tensor = torch.randint(0, vocab, (micro, seq), device=device)
    with cast:  # warm-up: kernels chosen, memory pools filled
        model(x).float().square().mean().backward()
    model.zero_grad(set_to_none=True)
    out = []
    for i, layer in enumerate(model):
        best = math.inf
        for _ in range(repeats):
            inp = x.detach().requires_grad_(x.is_floating_point())
            _sync(device)
            t0 = time.perf_counter()
            with cast:
                y = layer(inp)
            y.float().square().mean().backward()
            _sync(device)
            best = min(best, time.perf_counter() - t0)
        with torch.no_grad(), cast:
            x = layer(x)
        out.append({"name": f"layer{i}:{type(layer).__name__}", "seconds": best / micro,
                    "param_bytes": sum(p.numel() * p.element_size() for p in layer.parameters()),
                    "act_bytes": x.numel() * x.element_size() / micro})
        layer.zero_grad(set_to_none=True)
    return out


def stage_move_s(model: nn.Sequential, stages: int, device: torch.device) -> list[float]:
    """For an even cut into ``stages``: seconds to copy each stage's weights device -> pinned
    host -> device (the move a replacement's stage makes through host memory)."""
    n = len(model)
    cuts = [round(j * n / stages) for j in range(stages + 1)]
    times = []
    for j in range(stages):
        params = [p for layer in list(model)[cuts[j]:cuts[j + 1]] for p in layer.parameters()]
        host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=device.type == "cuda")
                for p in params]
        _sync(device)
        t0 = time.perf_counter()
        for h, p in zip(host, params, strict=True):
            h.copy_(p.detach(), non_blocking=True)
        _sync(device)
        back = [h.to(device, non_blocking=True) for h in host]
        _sync(device)
        times.append(time.perf_counter() - t0)
        del back
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--micro", type=int, default=8, help="micro-batch (sequences)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stages", type=int, default=4)
    for k, v in GPT2_SMALL.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run this on a machine with a GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = gpt2_like(a.blocks, a.width, a.heads, a.seq, a.vocab).to(device)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    layers = measure(model, a.micro, a.seq, a.vocab, device, a.repeats)
    moves = stage_move_s(model, a.stages, device)
    a.out.write_text(json.dumps({"device": str(device) if device.type != "cuda" else
                                 torch.cuda.get_device_name(device), "micro": a.micro,
                                 "layers": layers, "stage_move_s": moves}, indent=1))
    print(json.dumps({"layers": len(layers), "total_s_per_sample": sum(x["seconds"]
                                                                        for x in layers),
                      "stage_move_s": moves, "out": str(a.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
