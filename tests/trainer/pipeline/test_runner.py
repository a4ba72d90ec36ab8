"""Virtual workers on real gloo groups (threads of this process): gradients equal to one
process, replicas equal to each other, buffers carried, the WSP bound kept."""

from __future__ import annotations

import pytest
import torch

from trainer.pipeline import local, wsp
from trainer.pipeline.emulate import sleepy_mlp
from trainer.pipeline.partition import Layout

F = torch.nn.functional


def make_mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return sleepy_mlp(12, [0.0] * 5, classes=3)


def make_bn() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3))


def data(waves: int, micro: list[int], seed: int = 1) -> list[list[tuple[torch.Tensor,
                                                                       torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g))
             for n in micro] for _ in range(waves)]


def sgd(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def reference_grads(make: object, wave: list[tuple[torch.Tensor, torch.Tensor]]
                    ) -> dict[str, torch.Tensor]:
    model = make()  # type: ignore[operator]
    total = sum(int(y.shape[0]) for _, y in wave)
    for x, y in wave:
        (F.cross_entropy(model(x), y) * y.shape[0] / total).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def rel_err(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    num = sum(float(((got[n] - g) ** 2).sum()) for n, g in ref.items())
    den = sum(float((g ** 2).sum()) for g in ref.values())
    return (num / den) ** 0.5


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("vws", "bounds"), [
    (((0, 1, 2), (3, 4, 5)), (0, 2, 4, 6)),  # 2 VWs x 3 stages
    (((0, 1),), (0, 1, 6)),  # one VW, uneven stages
    (((0,), (1,), (2,)), (0, 6)),  # plain data parallel (k = 1)
])
def test_synchronous_waves_give_the_gradient_of_one_process(kind: str, vws: tuple,
                                                             bounds: tuple) -> None:
    waves = data(1, [4, 4, 4, 4, 3, 3])
    layout = Layout(vws, bounds, tuple(1.0 for _ in vws))
    res = local.run(make_mlp, layout, waves, loss_fn=F.cross_entropy, make_optimizer=sgd,
                    kind=kind, record=True)
    ref = reference_grads(make_mlp, waves[0])
    assert set(res.grads) == set(ref)
    assert rel_err(res.grads, ref) <= 1e-6


def test_replicas_of_a_stage_hold_the_same_bits_and_the_model_learns() -> None:
    layout = Layout(((0, 1), (2, 3)), (0, 3, 6), (2.0, 1.0))  # VW 0 takes more micro-batches
    waves = data(1, [4] * 6) * 12  # the same batch again: it can be learned
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.02)  # noqa: E731
    res = local.run(make_mlp, layout, waves, loss_fn=F.cross_entropy, make_optimizer=adam,
                    kind="1f1b")
    for a, b in ((0, 2), (1, 3)):
        assert res.params[a].keys() == res.params[b].keys() and res.params[a]
        for n in res.params[a]:
            assert torch.equal(res.params[a][n], res.params[b][n]), n
    assert res.losses[-1] < 0.8 * res.losses[0]
    assert len(res.stats[0]) == len(res.stats[2]) == 12


def test_batchnorm_statistics_move_by_every_worker_and_replicas_agree() -> None:
    layout = Layout(((0, 1), (2, 3)), (0, 3, 6), (1.0, 1.0))
    waves = data(3, [4] * 6)
    frozen = lambda m: torch.optim.SGD(m.parameters(), lr=0.0)  # noqa: E731 - buffers only
    res = local.run(make_bn, layout, waves, loss_fn=F.cross_entropy, make_optimizer=frozen)
    bn0, bn2 = res.buffers[0], res.buffers[2]
    assert int(bn0["1.num_batches_tracked"]) == 3 * 6  # every micro-batch of every VW counted
    for n in bn0:
        assert torch.equal(bn0[n], bn2[n]), n
    # one process over the same micro-batches, in order: the running mean agrees to first
    # order in the momentum (the VWs' changes are summed: 2 x (1 - 0.9^3) of the way per
    # wave here, against 1 - 0.9^6 in one process; averaging them would give 1 - 0.9^3)
    ref = make_bn()
    for wave in waves:
        for x, _ in wave:
            ref(x)
    want = ref[1].running_mean
    assert float((bn0["1.running_mean"] - want).abs().max()) <= 0.25 * float(want.abs().max())


@pytest.mark.parametrize("staleness", [0, 2])
def test_a_fast_worker_runs_at_most_d_waves_ahead(staleness: int) -> None:
    layout = Layout(((0, 1), (2, 3)), (0, 3, 6), (1.0, 1.0))
    fast = 0.002
    make = lambda: sleepy_mlp(12, [fast] * 5, classes=3)  # noqa: E731
    waves = data(8, [2] * 4)
    res = local.run(make, layout, waves, loss_fn=F.cross_entropy, make_optimizer=sgd,
                    staleness=staleness, slowdowns=[1.0, 1.0, 3.0, 3.0], counts=[2, 2])
    ahead = wsp.max_ahead(res.events)
    assert ahead <= staleness
    if staleness:
        assert ahead >= 1  # the fast worker did use the slack
