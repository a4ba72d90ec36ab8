"""The state checksum hashes tensors in place (host) or through a pinned staging buffer (GPU)
and gives the digest of the tensors' bytes in order, as before (members of different
versions compare equal)."""

from __future__ import annotations

import hashlib

import torch

from trainer.state import codec


def _reference(*xs) -> str:
    h = hashlib.sha256()

    def walk(x) -> None:
        if isinstance(x, torch.nn.Module):
            for t in list(x.parameters()) + list(x.buffers()):
                walk(t)
        elif isinstance(x, torch.Tensor):
            t = x.detach().to("cpu").contiguous().reshape(-1)
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    for x in xs:
        walk(x)
    return h.hexdigest()[:16]


def test_the_checksum_is_the_digest_of_the_tensors_bytes_in_order() -> None:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    m = m.to(memory_format=torch.channels_last)  # non-contiguous parameters
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 3, 7, 7)).sum().backward()
    opt.step()
    extra = {"b": [torch.tensor([], dtype=torch.int64), 3], "a": torch.arange(5).to(torch.bfloat16)}
    got = codec.checksum(m, opt.state_dict(), extra)
    assert got == _reference(m, opt.state_dict(), extra)
    with torch.no_grad():
        next(m.parameters())[0, 0, 0, 0] += 1e-3
    assert codec.checksum(m, opt.state_dict(), extra) != got
