"""Stage-only placement: a pipeline member keeps on its device only its stage's layers (with
their optimiser state); every other layer is released, and received layers are materialised
as they arrive (issue 19, item 1). The device here is the CPU: a released layer's tensors are
``meta`` tensors, so what is resident is measurable without a GPU."""

from __future__ import annotations

import pytest
import torch

from trainer.pipeline import placement, profile
from trainer.pipeline.placement import DEVICE, HOST, RELEASED
from trainer.pipeline.stagestate import ModelIndex, bundle, load

CPU = torch.device("cpu")


def test_a_member_keeps_its_stage_on_the_device_and_releases_the_rest() -> None:
    assert placement.decide(4, 1, 3) == (RELEASED, DEVICE, DEVICE, RELEASED)
    assert placement.decide(3, 0, 0) == (RELEASED,) * 3  # a spare holds nothing
    assert placement.decide(3, 1, 2, whole=HOST) == (HOST,) * 3  # the head, gathered
    assert placement.only(4, 2, 4, DEVICE) == (None, None, DEVICE, DEVICE)
    with pytest.raises(ValueError):
        placement.decide(3, 0, 1, whole=RELEASED)


def test_the_head_gathers_on_its_device_only_when_the_whole_model_fits_beside_its_stage(
        ) -> None:
    layers = [100.0, 100.0, 200.0]
    # weights 400 + its stage's gradients and 2 Adam slots: 3 x 100
    assert placement.gather_target(layers, 0, 1, 2, 700.0) == DEVICE
    assert placement.gather_target(layers, 0, 1, 2, 699.0) == HOST
    assert placement.gather_target(layers, 2, 3, 2, 999.0) == HOST  # a bigger stage
    assert placement.gather_target(layers, 0, 1, 2, float("inf")) == DEVICE


def _model(seed: int) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                            torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    return m, torch.optim.Adam(m.parameters(), lr=1e-2)


def _train(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    m(torch.randn(6, 4)).pow(2).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _bytes(index: ModelIndex, lo: int, hi: int) -> int:
    return sum(t.numel() * t.element_size() for t in index.state(lo, hi).values())


def test_placing_keeps_only_the_stage_resident_and_the_tensors_their_identity() -> None:
    m, opt = _model(0)
    _train(m, opt)
    index = ModelIndex(m, opt)
    params = [id(p) for g in opt.param_groups for p in g["params"]]
    whole = index.resident(opt, CPU)
    index.keep_only(opt, 3, 5)
    index.place(placement.decide(len(index), 3, 5), CPU)
    weights, state = index.resident(opt, CPU)
    assert weights == _bytes(index, 3, 5) < whole[0]
    stage_params = index.params(3, 5)
    # Adam: two moments per parameter, and its step (a float32 scalar)
    assert state == sum(2 * p.numel() * 4 + 4 for p in stage_params) < whole[1]
    assert [id(p) for g in opt.param_groups for p in g["params"]] == params
    assert all(p.is_meta for p in index.params(0, 3)) and index.released()
    before = [p.detach().clone() for p in stage_params]
    sub = torch.nn.Sequential(*index.modules[3:5])
    sub(torch.randn(6, 8)).sum().backward()
    opt.step()  # the held stage trains as before; released layers have no gradient
    assert all(not torch.equal(a, p) for a, p in zip(before, stage_params))


def test_received_layers_are_materialised_on_the_device_and_loaded() -> None:
    src_m, src_opt = _model(0)
    _train(src_m, src_opt)
    src = ModelIndex(src_m, src_opt)
    m, opt = _model(1)
    index = ModelIndex(m, opt)
    index.keep_only(opt, 0, 0)
    index.place(placement.decide(len(index), 0, 0), CPU)  # a spare: nothing resident
    assert index.resident(opt, CPU) == (0, 0)
    tree = bundle(src, src_opt, 0, 3, {"step": 1})
    index.place(placement.only(len(index), 0, 3, DEVICE), CPU)
    assert load(index, opt, tree, 0, 3) == {"step": 1}
    for (n, a), b in zip(index.state(0, 3).items(), src.state(0, 3).values()):
        assert torch.equal(a, b), n
    assert index.resident(opt, CPU)[0] == _bytes(index, 0, 3)
    assert index.checksum(opt, 0, 3) == src.checksum(src_opt, 0, 3)


def test_profiling_moves_one_layer_at_a_time_and_computes_the_same_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _model(0)
    m.eval()
    x = torch.randn(5, 4)
    want = m(x)
    calls: list[tuple[int, str]] = []
    real = profile.place_module
    monkeypatch.setattr(profile, "place_module", lambda mod, dev: (
        calls.append((list(m).index(mod), dev.type)), real(mod, dev))[1])
    out, _ = profile.stepwise(m, x, torch.device("cpu"))
    assert torch.equal(out, want)
    # each layer onto the device for its forward, back to the host before the next
    assert calls == [(i, "cpu") for i in range(len(m)) for _ in (0, 1)]


def test_the_optimiser_state_follows_its_parameter_and_its_step_stays() -> None:
    # a state loaded on the host (a snapshot, a resume) must reach the device with its
    # layer; the 'meta' device stands in for a GPU here (no storage: where it went shows)
    m, opt = _model(0)
    _train(m, opt)
    index = ModelIndex(m, opt)
    index.place(placement.decide(len(index), 0, 1), torch.device("meta"), opt)
    p = index.params(0, 1)[0]
    assert p.is_meta and opt.state[p]["exp_avg"].is_meta
    assert not opt.state[p]["step"].is_meta  # Adam keeps its step on the host
    q = index.params(3, 4)[0]
    assert not opt.state[q]["exp_avg"].is_meta  # released: left to keep_only


def test_the_profile_step_reports_the_job_s_own_error_before_joining() -> None:
    from types import SimpleNamespace

    from trainer.errors import JobCodeError

    m, _ = _model(0)

    def bad_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise ValueError("shapes")

    job = SimpleNamespace(model=m, loss_fn=bad_loss, precision="fp32")
    with pytest.raises(JobCodeError, match="loss"):
        profile.profile_step(job, (torch.randn(5, 4), torch.randn(5, 2)), CPU)
    job.loss_fn = torch.nn.functional.mse_loss
    assert profile.profile_step(job, (torch.randn(5, 4), torch.randn(5, 2)), CPU) >= 0.0
