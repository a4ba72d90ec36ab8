"""The step with the user's code in it (issue 26), over real gloo groups in threads: buffers
agreed before ``optimizer.step()``, clipping of the reduced gradients, micro-batches whose
buckets launch once, an out-of-memory member discarding the step everywhere, ``forward_loss``
on a dict batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.trainer.collective.test_step import _data, _mlp, _run
from trainer.collective.step import Stepper, micro_bounds, slice_batch


def _stepper(m: nn.Module, opt: torch.optim.Optimizer, r: int, world: int, **kw: Any) -> Stepper:
    return Stepper(m, opt, nn.functional.mse_loss, world=world, rank=r,
                   device=torch.device("cpu"), **kw)


def _go(st: Stepper, pg: Any, batch: Any, b: int, total: int) -> Any:
    return st.step(pg, batch, b, total, step=0, latest=1, eval_s=0.0,
                   should_abort=lambda: False)


def _reference(clip: float | None = None) -> dict[str, torch.Tensor]:
    """One process, the whole batch of 12 at once: what every ring must reproduce."""
    x, y = _data()
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    nn.functional.mse_loss(m(x), y).backward()
    if clip is not None:
        nn.utils.clip_grad_norm_(m.parameters(), clip)
    opt.step()
    return m.state_dict()


def test_micro_bounds_and_slicing_of_any_batch_shape() -> None:
    assert micro_bounds(7, 2) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert micro_bounds(7, 3, min_batch=2) == [(0, 3), (3, 5), (5, 7)]
    assert micro_bounds(3, 1, min_batch=2) == [(0, 3)]  # never a slice below the minimum
    batch = {"x": torch.arange(6).view(3, 2), "meta": "keep", "pair": (torch.arange(3), 1.0)}
    got = slice_batch(batch, 1, 3)
    assert got["x"].tolist() == [[2, 3], [4, 5]] and got["meta"] == "keep"
    assert got["pair"][0].tolist() == [1, 2] and got["pair"][1] == 1.0


@pytest.mark.parametrize("bucket_mb", [25.0, 0.0005], ids=["one-bucket", "many-buckets"])
def test_micro_batches_launch_once_and_equal_the_whole_share(bucket_mb: float) -> None:
    x, y = _data()
    split = [(0, 5), (5, 12)]

    def rank(r: int, pg: Any) -> dict[str, torch.Tensor]:
        m = _mlp()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        st = _stepper(m, opt, r, 2, bucket_mb=bucket_mb, micro_batch=2)
        launched = []
        real = st.reducer._launch
        st.reducer._launch = lambda b: (launched.append(b.index), real(b))[1]  # type: ignore
        lo, hi = split[r]
        _go(st, pg, (x[lo:hi], y[lo:hi]), hi - lo, 12)
        st.close()
        assert sorted(launched) == sorted(set(launched))  # each bucket once
        return m.state_dict()

    ref = _reference()
    for sd in _run(2, rank):
        for k in ref:
            torch.testing.assert_close(sd[k], ref[k], rtol=1e-5, atol=1e-6)


def test_clipping_uses_the_global_norm_of_the_reduced_gradients() -> None:
    x, y = _data()
    split = [(0, 5), (5, 12)]

    def rank(r: int, pg: Any) -> tuple[dict[str, torch.Tensor], float | None]:
        m = _mlp()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        st = _stepper(m, opt, r, 2, grad_clip=0.01)
        lo, hi = split[r]
        res = _go(st, pg, (x[lo:hi], y[lo:hi]), hi - lo, 12)
        st.close()
        return m.state_dict(), res.grad_norm

    ref = _reference(clip=0.01)
    (a, na), (b, nb) = _run(2, rank)
    assert na == nb and na is not None and na > 0.01
    for k in ref:
        torch.testing.assert_close(a[k], ref[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b[k], ref[k], rtol=1e-5, atol=1e-6)


class _StampingSGD(torch.optim.SGD):
    """An optimiser whose step writes a model buffer (as an EMA kept in buffers does)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model.parameters(), lr=0.1)
        self.model = model

    def step(self, closure: Any = None) -> Any:  # noqa: ANN401
        out = super().step(closure)
        self.model.stamp.add_(1.0)
        return out


def test_a_buffer_the_optimizer_step_writes_survives_the_commit() -> None:
    x, y = _data()

    def rank(r: int, pg: Any) -> list[float]:
        m = _mlp()
        m.register_buffer("stamp", torch.zeros(()))
        st = _stepper(m, _StampingSGD(m), r, 2)
        for _ in range(3):
            _go(st, pg, (x[6 * r:6 * r + 6], y[6 * r:6 * r + 6]), 6, 12)
        st.close()
        return [float(m.stamp)]

    assert _run(2, rank) == [[3.0], [3.0]]  # was [0.0, 0.0]: overwritten after the step


def test_an_out_of_memory_member_discards_the_step_everywhere_and_lowers_its_cap() -> None:
    x, y = _data()
    before = _mlp().state_dict()

    def rank(r: int, pg: Any) -> tuple[list[bool], int | None, dict[str, torch.Tensor]]:
        m = _mlp()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        calls = []

        def forward_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            calls.append(len(batch["x"]))
            if r == 1 and len(calls) == 1:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return nn.functional.mse_loss(model(batch["x"]), batch["y"])

        st = _stepper(m, opt, r, 2, forward_loss=forward_loss)
        lo, hi = (0, 5) if r == 0 else (5, 12)
        batch = {"x": x[lo:hi], "y": y[lo:hi]}
        first = _go(st, pg, batch, hi - lo, 12)
        if r == 0:
            for k, v in m.state_dict().items():
                assert torch.equal(v, before[k]), k  # nothing applied on the healthy member
        second = _go(st, pg, batch, hi - lo, 12)
        st.close()
        return [first.discarded, second.discarded], st.micro_cap, m.state_dict()

    (d0, cap0, a), (d1, cap1, b) = _run(2, rank)
    assert d0 == d1 == [True, False]
    assert cap0 is None and cap1 == 3  # rank 1 tried 7 samples at once: now at most 3
    ref = _reference()
    for k in ref:
        torch.testing.assert_close(a[k], ref[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b[k], ref[k], rtol=1e-5, atol=1e-6)
