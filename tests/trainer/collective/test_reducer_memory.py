"""The reducer's memory and layout: bucket views keep the parameters' strides, and a reducer
that is detached frees its buckets before the next generation's are built."""

from __future__ import annotations

import datetime
import gc
import warnings

import torch
import torch.distributed as dist

from trainer.collective.reducer import Reducer, bucket_view


def _group() -> dist.ProcessGroup:
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))


def test_bucket_views_keep_channels_last_and_permuted_strides() -> None:
    buf = torch.zeros(100)
    cl = torch.empty(2, 3, 2, 2).to(memory_format=torch.channels_last)
    v = bucket_view(buf, 10, cl)
    assert v.stride() == cl.stride() and v.storage_offset() == 10
    t = torch.empty(4, 5).t()
    assert bucket_view(buf, 0, t).stride() == t.stride()
    plain = torch.empty(3, 4)
    assert bucket_view(buf, 7, plain).is_contiguous()
    v.fill_(1.0)
    assert buf[10:34].sum() == 24 and buf[:10].sum() == 0 and buf[34:].sum() == 0


def test_a_channels_last_model_reduces_into_views_with_its_own_layout() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3)).to(memory_format=torch.channels_last)
    params = list(model.parameters())
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    red = Reducer(params, tail_numel=3)
    red.attach()
    red.begin(_group(), 1.0, lambda: False)
    views = [p.grad for p in params]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no layout warning, no copy back
        model(x).sum().backward()
    red.finish(torch.zeros(3))
    for p, v, e in zip(params, views, expected, strict=True):
        assert p.grad is v and p.grad.stride() == p.stride()
        torch.testing.assert_close(p.grad, e)
    red.detach()


def test_detach_frees_the_buckets_and_the_grad_views() -> None:
    params = [torch.nn.Parameter(torch.randn(256, 256)) for _ in range(4)]
    red = Reducer(params, tail_numel=5, bucket_mb=0.3, first_bucket_mb=0.3)
    red.attach()
    nbytes = red.nbytes
    assert nbytes >= 4 * 256 * 256 * 4
    storages = [b.buffer.untyped_storage() for b in red.buckets]
    red.detach()
    assert all(p.grad is None for p in params)
    assert red.nbytes == 0
    del storages
    gc.collect()
    # the next generation's reducer is the only copy of the gradients
    red2 = Reducer(params, tail_numel=5, bucket_mb=0.3, first_bucket_mb=0.3)
    red2.attach()
    assert red2.nbytes == nbytes and red.nbytes == 0
    try:
        red.begin(_group(), 1.0, lambda: False)
    except RuntimeError as e:
        assert "after detach" in str(e)
    else:
        raise AssertionError("a detached reducer was reused")
