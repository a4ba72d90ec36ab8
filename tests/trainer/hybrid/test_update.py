"""An update computed by a zone and applied by a replica is the ring's committed step."""

from __future__ import annotations

import copy
import datetime

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainer.collective.step import Stepper
from trainer.hybrid.update import SAMPLES, STALENESS, ZONE, UpdateLayout, ZoneStepper


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.b = nn.Linear(8, 3)
        self.unused = nn.Linear(2, 2)  # never in the forward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.bn(self.a(x))))


def _pg() -> dist.ProcessGroupGloo:
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))


def _job() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = Net()
    return m, torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1)


@pytest.mark.parametrize("clip", [None, 0.05])
def test_apply_equals_the_rings_commit(clip: float | None) -> None:
    """... clipped as the ring clips (Job.grad_clip: the norm over the update's gradients)."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
               for _ in range(3)]
    ring_m, ring_o = _job()
    hyb_m, hyb_o = _job()
    pg = _pg()
    stepper = Stepper(ring_m, ring_o, nn.functional.cross_entropy, world=1, rank=0,
                      device=torch.device("cpu"), grad_clip=clip)
    layout = UpdateLayout(hyb_m)
    zs = ZoneStepper(hyb_m, layout, nn.functional.cross_entropy, world=1, rank=0,
                     device=torch.device("cpu"), precision="fp32")
    for step, batch in enumerate(batches):
        ring = stepper.step(pg, batch, 16, 16, step=step, latest=1, eval_s=0.0,
                            should_abort=lambda: False)
        before = copy.deepcopy(hyb_m.state_dict())
        res = zs.compute(pg, batch, 16, 16, step=step, latest=1, eval_s=0.0, staleness=2,
                         zone=1, should_abort=lambda: False)
        after = hyb_m.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)  # nothing moved yet
        meta = layout.meta(res.update)
        assert (meta[SAMPLES], meta[STALENESS], meta[ZONE]) == (16, 2, 1)
        norm = layout.apply(res.update, hyb_o, clip=clip)
        assert (norm is None) == (clip is None)
        if clip is not None:
            assert ring.grad_norm is not None and norm is not None
            assert norm > clip and abs(norm - ring.grad_norm) <= 1e-5 * norm  # it clipped
    for (k, a), b in zip(ring_m.state_dict().items(), hyb_m.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), k
    assert int(hyb_m.bn.num_batches_tracked) == 3
    assert torch.equal(hyb_m.unused.weight, ring_m.unused.weight)  # not decayed: no grad
    assert all(id(p) not in {id(q) for q in hyb_o.state} for p in hyb_m.unused.parameters())


def test_an_update_applies_on_a_replica_that_did_not_compute_it() -> None:
    a_m, a_o = _job()
    b_m, b_o = _job()
    la, lb = UpdateLayout(a_m), UpdateLayout(b_m)
    zs = ZoneStepper(a_m, la, nn.functional.cross_entropy, world=1, rank=0,
                     device=torch.device("cpu"), precision="fp32")
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    res = zs.compute(_pg(), (x, y), 8, 8, step=0, latest=1, eval_s=0.0, staleness=0, zone=0,
                     should_abort=lambda: False)
    la.apply(res.update.clone(), a_o)
    lb.apply(res.update.clone(), b_o)
    for p, q in zip(a_m.state_dict().values(), b_m.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(ValueError):
        lb.apply(torch.zeros(3), b_o)


def test_fp16_is_refused() -> None:
    m, _ = _job()
    with pytest.raises(ValueError, match="fp16"):
        ZoneStepper(m, UpdateLayout(m), nn.functional.cross_entropy, world=1, rank=0,
                    device=torch.device("cpu"), precision="fp16")
