"""Gradient clipping across pipeline stages (``Job.grad_clip``): two stages as threads, each
with its own :class:`trainer.pipeline.agree.Agreement` over real gloo groups (the virtual
worker's and the control group), give the same total norm, bit for bit, and the step
``torch.nn.utils.clip_grad_norm_`` gives on the whole model."""

from __future__ import annotations

import copy
import datetime
import math

import pytest
import torch
import torch.distributed as dist

from tests.trainer.ranks import on_ranks
from trainer.pipeline.agree import Agreement
from trainer.pipeline.local import _gloo
from trainer.pipeline.stagestate import StagePack, clip_coefficient

CLIP = 0.05


def _model() -> torch.nn.Sequential:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _whole_step(model: torch.nn.Sequential, x: torch.Tensor, y: torch.Tensor,
                clip: float) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    torch.nn.functional.mse_loss(model(x), y).backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    opt.step()
    return norm


def test_the_total_norm_is_over_every_stage_and_the_step_is_torch_s() -> None:
    # drawn from a generator of its own: from the global one they hung on the tests run
    # before in the same process, and one order gave a norm under 10 x CLIP (a loaded run)
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    model = _model()
    reference = copy.deepcopy(model)
    ref_norm = _whole_step(reference, x, y, CLIP)
    assert ref_norm > 10 * CLIP  # the clipping matters

    stages = [model[:3], model[3:]]
    opts = [torch.optim.SGD(s.parameters(), lr=0.5) for s in stages]
    packs = [StagePack(list(s.parameters()), list(s.buffers())) for s in stages]
    before = [p.live_buffers() for p in packs]
    torch.nn.functional.mse_loss(model(x), y).backward()
    flats = [p.pack(b, torch.device("cpu"))[0] for p, b in zip(packs, before, strict=True)]

    store = dist.HashStore()

    def stage(j: int) -> float | None:
        t = datetime.timedelta(seconds=30)
        vw = _gloo(dist.PrefixStore("v/", store), j, 2, t)
        ctl = _gloo(dist.PrefixStore("c/", store), j, 2, t)

        def part(reduced: torch.Tensor) -> torch.Tensor:
            vec = torch.zeros(2, dtype=torch.float64)
            vec[j] = packs[j].grad_sqnorm(reduced)
            return vec

        a = Agreement(None, ctl, 2, lambda: False, clip=(vw, part))
        a.submit(0, flats[j], torch.zeros(2, 12, dtype=torch.float64))
        agreed = a.wait(0)
        a.stop()
        return agreed.norm

    got = on_ranks(stage, 2)
    assert got[0] == got[1]  # the same bits on every stage: every member clips alike
    assert got[0] is not None and math.isclose(got[0], ref_norm, rel_tol=1e-5)
    coef = clip_coefficient(got[0], CLIP)
    for p, f, o in zip(packs, flats, opts, strict=True):
        p.apply(f, o, clip=coef)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("norm", "expect"), [(0.01, 1.0), (2.0, 0.05 / (2.0 + 1e-6))])
def test_the_coefficient_is_torch_s(norm: float, expect: float) -> None:
    assert math.isclose(clip_coefficient(norm, CLIP), expect, rel_tol=1e-6)
    g = torch.full((4,), norm / 2)  # a gradient of norm `norm`
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([p], CLIP)
    torch.testing.assert_close(p.grad, g * clip_coefficient(norm, CLIP))


def test_a_non_finite_norm_spoils_the_step_as_torch_s_does() -> None:
    assert math.isnan(clip_coefficient(float("nan"), CLIP))
    assert clip_coefficient(float("inf"), CLIP) == 0.0
