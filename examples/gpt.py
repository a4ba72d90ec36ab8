"""A small GPT-style language model, written as nanoGPT's ``train.py`` is, run as a spotring job.

Design: the model is the usual decoder-only transformer (token and position embeddings,
pre-norm blocks of causal self-attention and an MLP, a tied head) whose ``forward(idx,
targets)`` returns ``(logits, loss)``, as nanoGPT's does. The corpus is the source text of a
few modules of Python's standard library read as bytes (a vocabulary of 256, no tokenizer
to ship); sample ``i`` is the window of ``BLOCK + 1`` bytes at ``i * STRIDE``, served as the
dict ``{"idx", "targets"}`` a Hugging Face collator would give. What a nanoGPT loop does by
hand maps onto the job's fields: the warmup + cosine learning rate (``scheduler``, stepped by
the ring once per committed step), gradient clipping (``grad_clip``), gradient accumulation
(``micro_batch``: a member computes its share in slices and reduces once), ``bf16`` autocast
when asked (``precision``), ``max_iters`` (``max_steps``), and the loss the model returns
(``forward_loss``). ``evaluate`` reports the held-out loss every ``eval_interval`` steps.

Knobs (environment, for tests and benchmarks): ``GPT_STEPS`` (max_steps, default 60),
``GPT_BATCH`` (global batch, default 32), ``GPT_MICRO`` (samples per forward pass, default
8), ``GPT_WIDTH`` (embedding, default 32), ``GPT_LAYERS`` (default 2), ``GPT_PRECISION``
(``fp32`` default, ``bf16``), ``GPT_EVAL_EVERY`` (default 20), ``GPT_SLEEP_MS`` (each training
forward sleeps this long: tests pace a ring with it).

Run it in a ring::

    python -m trainer coordinator --port 29400 --token-file token &
    python -m trainer worker --coordinator 127.0.0.1:29400 --token-file token \
        --job examples/gpt.py
"""

from __future__ import annotations

import inspect
import math
import os
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from trainer.job import Job

BLOCK, STRIDE = 32, 16
CORPUS = ("textwrap", "string", "json.decoder", "json.encoder", "argparse")


def corpus() -> torch.Tensor:
    """The bytes of a few standard-library modules' source (the same on every machine with
    this Python)."""
    import importlib

    text = "\n".join(inspect.getsource(importlib.import_module(m)) for m in CORPUS)
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


class Windows(Dataset):
    """Sample ``i``: ``{"idx": bytes[i*STRIDE : +BLOCK], "targets": the next byte of each}``."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __len__(self) -> int:
        return (len(self.data) - BLOCK - 1) // STRIDE

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        chunk = self.data[i * STRIDE:i * STRIDE + BLOCK + 1]
        return {"idx": chunk[:-1], "targets": chunk[1:]}


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """nanoGPT's shape: ``forward(idx, targets=None) -> (logits, loss)``."""

    def __init__(self, vocab: int = 256, width: int = 32, layers: int = 2, heads: int = 4
                 ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(BLOCK, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        self.sleep_s = float(os.environ.get("GPT_SLEEP_MS", "0")) / 1000

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.training and self.sleep_s:
            time.sleep(self.sleep_s)
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        loss = None if targets is None else F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def warmup_cosine(warmup: int, total: int, floor: float = 0.1):  # noqa: ANN201
    """nanoGPT's ``get_lr`` as a LambdaLR factor: linear warmup, cosine decay to ``floor``."""
    def factor(it: int) -> float:
        if it < warmup:
            return (it + 1) / (warmup + 1)
        if it >= total:
            return floor
        ratio = (it - warmup) / max(1, total - warmup)
        return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - floor)
    return factor


def make_job(seed: int) -> Job:
    """The GPT job; every worker calls this with the same ``seed``."""
    torch.manual_seed(seed)
    data = corpus()
    split = int(0.9 * len(data))
    train, val = Windows(data[:split]), Windows(data[split:])
    steps = int(os.environ.get("GPT_STEPS", "60"))
    model = GPT(width=int(os.environ.get("GPT_WIDTH", "32")),
                layers=int(os.environ.get("GPT_LAYERS", "2")))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=3e-3,
                            betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(max(1, steps // 10), steps))
    held_out = {k: torch.stack([val[i][k] for i in range(min(len(val), 64))])
                for k in ("idx", "targets")}

    def evaluate(m: nn.Module) -> dict[str, float]:
        dev = next(m.parameters()).device
        m.eval()
        with torch.no_grad():
            _, loss = m(held_out["idx"].to(dev), held_out["targets"].to(dev))
        return {"val_loss": float(loss)}

    return Job(model=model, optimizer=opt, train_set=train,
               forward_loss=lambda m, batch: m(**batch)[1],
               global_batch=int(os.environ.get("GPT_BATCH", "32")), max_steps=steps,
               scheduler=sched, grad_clip=1.0,
               micro_batch=int(os.environ.get("GPT_MICRO", "8")),
               precision=os.environ.get("GPT_PRECISION", "fp32"), evaluate=evaluate,
               eval_every_steps=int(os.environ.get("GPT_EVAL_EVERY", "20")), loader_workers=0,
               mode="ring")
