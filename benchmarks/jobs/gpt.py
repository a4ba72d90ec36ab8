"""A GPT-2-small-sized transformer on synthetic tokens: the benchmarks' large language job.

Design. GPT-2 small as published (12 pre-LayerNorm blocks, 12 heads, width 768, context
1024, vocabulary 50257, GELU MLP of 4x width, learned positions, the output projection tied
to the token embedding: 124,439,808 parameters), in plain torch with
``scaled_dot_product_attention`` (causal; flash attention on a GPU in bf16/fp16). The data
are synthetic: ``BENCH_SAMPLES`` random token sequences of ``GPT_CONTEXT + 1`` tokens from the
seed, in a ``TensorDataset`` of ``(inputs, next tokens)``; the loss is the mean next-token
cross-entropy over every position. AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1).
Nothing is learnt (random tokens): the job is for throughput (tokens/s = samples/s x
``GPT_CONTEXT``), and ``evaluate`` is left out.

Knobs (environment): ``BENCH_BATCH`` (global batch in sequences, default 16), ``BENCH_EPOCHS``
(default 1000), ``BENCH_SAMPLES`` (default 512), ``BENCH_PRECISION`` (default fp32),
``GPT_CONTEXT`` (default 1024), ``GPT_LAYERS`` (12), ``GPT_WIDTH`` (768), ``GPT_HEADS`` (12),
``GPT_VOCAB`` (50257), and ``BENCH_TINY=1``: a smoke-test size (2 layers, width 64, 2 heads,
vocabulary 512, context 64, 64 samples, batch 8).
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from trainer.job import Job


class Block(nn.Module):
    """Pre-LayerNorm causal self-attention and MLP, each with a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm, tied head."""

    def __init__(self, vocab: int, context: int, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight",
                                                                      "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of every sequence."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def make_job(seed: int) -> Job:
    """The synthetic GPT job; every worker calls this with the same ``seed``."""
    tiny = os.environ.get("BENCH_TINY") == "1"
    d = (dict(vocab=512, context=64, layers=2, width=64, heads=2, samples=64, batch=8) if tiny
         else dict(vocab=50257, context=1024, layers=12, width=768, heads=12, samples=512,
                   batch=16))
    env = os.environ.get
    vocab, context = int(env("GPT_VOCAB", d["vocab"])), int(env("GPT_CONTEXT", d["context"]))
    layers, width = int(env("GPT_LAYERS", d["layers"])), int(env("GPT_WIDTH", d["width"]))
    heads, samples = int(env("GPT_HEADS", d["heads"])), int(env("BENCH_SAMPLES", d["samples"]))
    torch.manual_seed(seed)
    model = GPT(vocab, context, layers, width, heads)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (samples, context + 1), generator=gen)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=6e-4, betas=(0.9, 0.95))
    return Job(model=model, optimizer=opt, loss_fn=next_token_loss,
               train_set=TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()),
               global_batch=int(env("BENCH_BATCH", d["batch"])),
               epochs=int(env("BENCH_EPOCHS", "1000")),
               precision=env("BENCH_PRECISION", "fp32"))
