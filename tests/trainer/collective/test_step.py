"""The step: bucketed reduction, commit, buffers, unused parameters, precision (real gloo).

Two or three ranks run as threads of this process over a real ``ProcessGroupGloo`` on an
in-process ``HashStore``; each holds its own copy of the model built from the same seed, so a
test compares them with each other and with one process computing the full batch.
"""

from __future__ import annotations

import copy
import datetime
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainer.collective.reducer import Reducer, plan_buckets
from trainer.collective.step import Stepper, make_scaler
from trainer.errors import GenerationBroken, JobCodeError

torch.set_num_threads(1)
_BUILD = threading.RLock()  # torch's RNG is process-wide: ranks build their models in turn


def _groups(world: int) -> list[Any]:
    store = dist.HashStore()
    out: list[Any] = [None] * world

    def make(r: int) -> None:
        out[r] = dist.ProcessGroupGloo(dist.PrefixStore("t/", store), r, world,
                                       datetime.timedelta(seconds=30))

    ts = [threading.Thread(target=make, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def _run(world: int, fn: Callable[[int, Any], Any]) -> list[Any]:
    pgs = _groups(world)
    res: list[Any] = [None] * world
    errs: list[BaseException] = []

    def go(r: int) -> None:
        try:
            res[r] = fn(r, pgs[r])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errs.append(e)

    ts = [threading.Thread(target=go, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if errs:
        raise errs[0]
    return res


def _data(n: int = 12, d: int = 6, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, 1, generator=g)


def _mlp(seed: int = 0, bn: bool = False) -> nn.Module:
    with _BUILD:
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Linear(6, 16)]
        if bn:
            layers.append(nn.BatchNorm1d(16))
        layers += [nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)]
        return nn.Sequential(*layers)


def _step(model: nn.Module, opt: torch.optim.Optimizer, pg: Any, rank: int, world: int,
          batch: Any, b: int, total: int, **kw: Any) -> Any:
    st = Stepper(model, opt, nn.functional.mse_loss, world=world, rank=rank,
                 device=torch.device("cpu"), **kw)
    try:
        return st.step(pg, batch, b, total, step=0, latest=1, eval_s=0.0,
                       should_abort=lambda: False)
    finally:
        st.close()


def test_buckets_follow_reverse_order_caps_and_dtypes() -> None:
    f32, f16 = torch.float32, torch.float16
    sizes = [(400, f32, "cpu"), (400, f32, "cpu"), (100, f16, "cpu"), (900, f32, "cpu")]
    assert plan_buckets(sizes, 1000, 500) == [[3], [2], [1, 0]]
    assert plan_buckets(sizes, 10_000, 10_000) == [[3], [2], [1, 0]]
    assert plan_buckets([(10, f32, "cpu")] * 3, 25, 25) == [[2, 1], [0]]


@pytest.mark.parametrize("bucket_mb", [25.0, 0.0005], ids=["one-bucket", "many-buckets"])
def test_the_weighted_reduction_equals_the_full_batch_gradient(bucket_mb: float) -> None:
    x, y = _data()
    split = [(0, 5), (5, 12)]
    p0 = {k: v.clone() for k, v in _mlp().state_dict().items()}

    def rank(r: int, pg: Any) -> dict[str, torch.Tensor]:
        m = _mlp()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        lo, hi = split[r]
        res = _step(m, opt, pg, r, 2, (x[lo:hi], y[lo:hi]), hi - lo, 12, bucket_mb=bucket_mb)
        with torch.no_grad():
            full = float(nn.functional.mse_loss(_mlp()(x), y))
        assert res.loss == pytest.approx(full, rel=1e-5)
        return {k: v.clone() for k, v in m.state_dict().items()}

    a, b = _run(2, rank)
    ref = _mlp()
    ref.zero_grad()
    nn.functional.mse_loss(ref(x), y).backward()
    for (k, p), g in zip(ref.named_parameters(), (p.grad for p in ref.parameters())):
        assert torch.equal(a[k], b[k])  # identical on every member
        assert torch.allclose(p0[k] - a[k], g, rtol=1e-5, atol=1e-6), k
    if bucket_mb < 1:
        m = _mlp()
        assert len(Reducer(list(m.parameters()), tail_numel=1, bucket_mb=bucket_mb).buckets) > 2


def test_batchnorm_statistics_are_averaged_and_identical_everywhere() -> None:
    x, y = _data(n=16)

    def rank(r: int, pg: Any) -> dict[str, torch.Tensor]:
        m = _mlp(bn=True)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        lo, hi = (0, 6) if r == 0 else (6, 16)
        _step(m, opt, pg, r, 2, (x[lo:hi], y[lo:hi]), hi - lo, 16)
        return {k: v.clone() for k, v in m.named_buffers()}

    a, b = _run(2, rank)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ref = _mlp(bn=True)
    ref.train()
    ref(x)  # one single-process forward on the global batch
    bn = dict(ref.named_buffers())
    # the running mean moves exactly as a single process's on the global batch
    assert torch.allclose(a["1.running_mean"], bn["1.running_mean"], atol=1e-6)
    assert int(a["1.num_batches_tracked"]) == 1
    assert torch.allclose(a["1.running_var"], bn["1.running_var"], rtol=0.2)  # shard variances


class _Branchy(nn.Module):
    """``never`` is used by nobody; ``rare`` only for inputs whose first feature is > 5."""

    def __init__(self) -> None:
        super().__init__()
        with _BUILD:
            torch.manual_seed(0)
            self.body = nn.Linear(6, 1)
            self.rare = nn.Linear(6, 1)
            self.never = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        if bool((x[:, 0] > 5).any()):
            out = out + self.rare(x)
        return out


def test_a_parameter_nobody_used_is_not_stepped_and_one_some_used_is() -> None:
    x, y = _data()
    x[7, 0] = 9.0  # only rank 1's share triggers the rare branch

    def rank(r: int, pg: Any) -> dict[str, torch.Tensor]:
        m = _Branchy()
        opt = torch.optim.AdamW(m.parameters(), lr=0.1, weight_decay=0.5)
        lo, hi = (0, 5) if r == 0 else (5, 12)
        _step(m, opt, pg, r, 2, (x[lo:hi], y[lo:hi]), hi - lo, 12, bucket_mb=0.00001)
        return {k: v.clone() for k, v in m.state_dict().items()}

    a, b = _run(2, rank)
    init = _Branchy().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(a["never.weight"], init["never.weight"])  # AdamW would have decayed it
    assert not torch.equal(a["rare.weight"], init["rare.weight"])  # stepped on both members
    assert not torch.equal(a["body.weight"], init["body.weight"])


def test_a_member_with_no_samples_still_reduces_and_commits() -> None:
    x, y = _data()

    def rank(r: int, pg: Any) -> dict[str, torch.Tensor]:
        m = _mlp()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        batch, b = ((x, y), 12) if r == 0 else (None, 0)
        _step(m, opt, pg, r, 2, batch, b, 12)
        return {k: v.clone() for k, v in m.state_dict().items()}

    a, b = _run(2, rank)
    solo = _mlp()
    torch.optim.SGD(solo.parameters(), lr=1.0)
    solo.zero_grad()
    nn.functional.mse_loss(solo(x), y).backward()
    with torch.no_grad():
        for p in solo.parameters():
            p -= p.grad
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.allclose(a[k], v, atol=1e-6) for k, v in solo.state_dict().items())


def test_fp16_skip_decision_is_the_same_on_every_member() -> None:
    x, y = _data()

    def rank(r: int, pg: Any) -> tuple[bool, float, dict[str, torch.Tensor]]:
        m = _mlp()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = make_scaler("fp16", torch.device("cpu"))
        ys = y[:6].clone()
        if r == 1:
            ys[0] = float("inf")  # rank 1's gradients overflow: nobody may step
        res = _step(m, opt, pg, r, 2, (x[:6], ys), 6, 12, precision="fp16", scaler=scaler)
        return res.skipped, scaler.get_scale(), {k: v.clone() for k, v in m.state_dict().items()}

    (s0, sc0, a), (s1, sc1, b) = _run(2, rank)
    assert s0 and s1 and sc0 == sc1 < 65536.0  # both skipped, both halved their scale
    init = _mlp().state_dict()
    assert all(torch.equal(a[k], init[k]) and torch.equal(b[k], init[k]) for k in a)


def test_bf16_autocast_steps_and_stays_identical() -> None:
    x, y = _data()

    def rank(r: int, pg: Any) -> dict[str, torch.Tensor]:
        m = _mlp()
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        lo, hi = (0, 4) if r == 0 else (4, 12)
        _step(m, opt, pg, r, 2, (x[lo:hi], y[lo:hi]), hi - lo, 12, precision="bf16")
        return {k: v.clone() for k, v in m.state_dict().items()}

    a, b = _run(2, rank)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], v) for k, v in _mlp().state_dict().items())


def test_the_jobs_own_error_is_a_job_error_naming_the_stage() -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(6, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("Expected more than 1 value per channel when training")

    m = Broken()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    st = Stepper(m, opt, nn.functional.mse_loss, world=1, rank=0, device=torch.device("cpu"))
    pg = _groups(1)[0]
    with pytest.raises(JobCodeError, match="forward raised ValueError.*min_local_batch"):
        st.step(pg, _data(), 12, 12, step=7, latest=1, eval_s=0.0, should_abort=lambda: False)
    st.close()


def test_an_abandoned_reduction_applies_nothing() -> None:
    x, y = _data()
    m = _mlp(bn=True)  # its forward moves the running statistics: they must come back
    before = copy.deepcopy(m.state_dict())
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    pg = _groups(2)[0]  # rank 1 never shows up: the reduction cannot complete
    st = Stepper(m, opt, nn.functional.mse_loss, world=2, rank=0, device=torch.device("cpu"))
    calls = {"n": 0}

    def abort() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    with pytest.raises(GenerationBroken):
        st.step(pg, (x, y), 12, 24, step=0, latest=1, eval_s=0.0, should_abort=abort)
    st.close()
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
