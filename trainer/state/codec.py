"""Training state as tensors and plain data: encoded without pickle, decoded with checks.

Design: the state a member sends to a joiner (and writes to a durable snapshot) is a tree of
dicts, lists, tuples, strings, numbers, booleans, ``None``, bytes, tensors and numpy arrays
(the optimiser's ``state_dict`` has integer keys; RNG states hold arrays). :func:`encode`
writes it as ``length (8) | header (JSON) | padding | blob``: the header describes the tree,
with every tensor or array replaced by an index into a table of ``(dtype, shape, offset,
nbytes)``, and the blob holds their bytes, each aligned to 64 bytes. :func:`decode` parses the
header with ``json`` (never ``pickle``), accepts only the dtypes listed in :data:`DTYPES`,
checks every offset and size against the blob and the tree's depth and size, and copies
each tensor out of the received bytes. Anything else raises :class:`BadState`.

:func:`checksum` digests the bytes of modules and state trees: equal checksums mean
bitwise-equal training state (the members compare theirs at every generation).

:func:`fingerprint` names a job's shape (parameter and buffer names, shapes and dtypes, the
optimiser, the global batch, the dataset size): members of one ring must share it, and a
received state must carry the one the generation's plan announces.

Rule for callers: treat bytes from the network as hostile until :func:`decode` returned, and
compare the result with your own model (:func:`check_like`) before loading it.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trainer.errors import BadState, Malformed
from trainer.protocol.messages import parse_json

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool,
    "complex64": torch.complex64, "complex128": torch.complex128,
}
_NAMES = {v: k for k, v in DTYPES.items()}
NP_DTYPES = ("uint32", "int64", "int32", "float64", "float32", "uint8")
ALIGN = 64
MAX_HEADER = 64 << 20
MAX_DEPTH = 64
_LEN = struct.Struct("!Q")


# -- encode -------------------------------------------------------------------------------------


def to_host(tree: Any, *, copy: bool) -> Any:
    """``tree`` with its tensors in host memory (``copy``: host tensors copied too, so the
    result holds this instant while training goes on with the originals; otherwise they are
    kept as they are). A GPU tensor is copied into pinned host memory without blocking, and
    each device is synchronised once after the last copy: one wait for the whole state, not
    a pageable copy (and a wait) per tensor. Strides are kept (``empty_like``)."""
    if not copy and not _any_gpu(tree):
        return tree  # nothing to move: the tree as it is
    on_gpu: list[torch.device] = []

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.device.type != "cuda":
                return t.to("cpu", copy=True) if copy else t
            out = torch.empty_like(t, device="cpu", pin_memory=True)
            out.copy_(t, non_blocking=True)
            if t.device not in on_gpu:
                on_gpu.append(t.device)
            return out
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x

    out = walk(tree)
    for device in on_gpu:  # the copies are queued on each device's current stream
        torch.cuda.current_stream(device).synchronize()
    return out


def _any_gpu(x: Any, depth: int = 0) -> bool:
    if isinstance(x, torch.Tensor):
        return x.device.type == "cuda"
    if depth > MAX_DEPTH:
        return False
    if isinstance(x, dict):
        return any(_any_gpu(v, depth + 1) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_any_gpu(v, depth + 1) for v in x)
    return False


def encode(tree: Any) -> torch.Tensor:
    """``tree`` as one uint8 tensor (see the module docstring). Raises ``TypeError`` for a
    value of another type (a class instance: convert it to plain data first). GPU tensors
    come to the host first through :func:`to_host` (pinned, one synchronisation)."""
    tree = to_host(tree, copy=False)
    table: list[list[Any]] = []
    parts: list[torch.Tensor] = []
    offset = 0

    def add(kind: str, dtype: str, shape: list[int], raw: torch.Tensor) -> int:
        nonlocal offset
        n = raw.numel()
        table.append([kind, dtype, shape, offset, n])
        parts.append(raw)
        offset += n + (-n % ALIGN)
        return len(table) - 1

    def walk(x: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise TypeError("state nested too deeply")
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return x if abs(x) < 2**63 else {"__bigint__": str(x)}
        if isinstance(x, float):
            return x if math.isfinite(x) else {"__float__": repr(x)}
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.dtype not in _NAMES:
                raise TypeError(f"tensor dtype {t.dtype} is not supported in a state")
            flat = t.to("cpu").contiguous().reshape(-1)
            return {"__tensor__": add("tensor", _NAMES[t.dtype], list(t.shape),
                                      flat.view(torch.uint8) if flat.numel() else
                                      torch.empty(0, dtype=torch.uint8))}
        if isinstance(x, np.ndarray):
            if x.dtype.name not in NP_DTYPES:
                raise TypeError(f"array dtype {x.dtype} is not supported in a state")
            raw = torch.from_numpy(np.ascontiguousarray(x).reshape(-1).view(np.uint8).copy())
            return {"__array__": add("array", x.dtype.name, list(x.shape), raw)}
        if isinstance(x, np.generic):
            return walk(x.item(), depth)
        if isinstance(x, (bytes, bytearray)):
            raw = torch.frombuffer(bytearray(x), dtype=torch.uint8) if x else torch.empty(
                0, dtype=torch.uint8)
            return {"__bytes__": add("bytes", "uint8", [len(x)], raw)}
        if isinstance(x, tuple):
            return {"__tuple__": [walk(v, depth + 1) for v in x]}
        if isinstance(x, list):
            return [walk(v, depth + 1) for v in x]
        if isinstance(x, Mapping):
            items = []
            for k, v in x.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError(f"state dict key {k!r}: only str and int keys")
                items.append([k, walk(v, depth + 1)])
            return {"__dict__": items}
        raise TypeError(f"{type(x).__name__} is not plain data; convert it before encoding")

    root = walk(tree, 0)
    header = json.dumps({"v": 1, "tensors": table, "root": root},
                        separators=(",", ":")).encode()
    start = _LEN.size + len(header)
    start += -start % ALIGN
    out = torch.zeros(start + offset, dtype=torch.uint8)
    out[: _LEN.size] = torch.frombuffer(bytearray(_LEN.pack(len(header))), dtype=torch.uint8)
    out[_LEN.size:_LEN.size + len(header)] = torch.frombuffer(bytearray(header),
                                                              dtype=torch.uint8)
    for (_, _, _, off, n), raw in zip(table, parts, strict=True):
        if n:
            out[start + off:start + off + n] = raw
    return out


# -- decode -------------------------------------------------------------------------------------


def decode(data: torch.Tensor | bytes) -> Any:
    """The tree :func:`encode` wrote. Raises :class:`BadState` for anything else."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else (
            torch.empty(0, dtype=torch.uint8))
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise BadState("a state is a 1-d uint8 tensor")
    total = data.numel()
    if total < _LEN.size:
        raise BadState("truncated state")
    (hlen,) = _LEN.unpack(bytes(data[: _LEN.size].tolist()))
    if hlen > MAX_HEADER or _LEN.size + hlen > total:
        raise BadState("state header length out of range")
    try:  # bounded: a header nested 200,000 deep is refused, not a RecursionError
        header = parse_json(data[_LEN.size:_LEN.size + hlen].numpy().tobytes(),
                            "state header", max_bytes=MAX_HEADER, max_depth=MAX_DEPTH + 4)
    except Malformed as e:
        raise BadState(str(e)) from None
    if not isinstance(header, dict) or header.get("v") != 1:
        raise BadState("not a state of this version")
    start = _LEN.size + hlen
    start += -start % ALIGN
    blob = data[start:]
    table = header.get("tensors")
    if not isinstance(table, list):
        raise BadState("state tensor table missing")
    built = [_entry(e, blob) for e in table]
    used: set[int] = set()

    def walk(x: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise BadState("state nested too deeply")
        if x is None or isinstance(x, (bool, str, int, float)):
            return x
        if isinstance(x, list):
            return [walk(v, depth + 1) for v in x]
        if isinstance(x, dict) and len(x) == 1:
            (tag, v), = x.items()
            if tag in ("__tensor__", "__array__", "__bytes__"):
                if not isinstance(v, int) or not 0 <= v < len(built) or v in used:
                    raise BadState("state refers to a tensor that is not in its table")
                kind, value = built[v]
                if kind != tag.strip("_"):
                    raise BadState("state tensor of the wrong kind")
                used.add(v)
                return value
            if tag == "__tuple__" and isinstance(v, list):
                return tuple(walk(i, depth + 1) for i in v)
            if tag == "__dict__" and isinstance(v, list):
                out = {}
                for item in v:
                    if (not isinstance(item, list) or len(item) != 2
                            or not isinstance(item[0], (str, int)) or isinstance(item[0], bool)):
                        raise BadState("state dict item malformed")
                    out[item[0]] = walk(item[1], depth + 1)
                return out
            if tag == "__float__" and v in ("nan", "inf", "-inf"):
                return float(v)
            if tag == "__bigint__" and isinstance(v, str) and v.lstrip("-").isdigit():
                return int(v)
        raise BadState("state holds a value of an unknown kind")

    return walk(header.get("root"), 0)


def _entry(e: Any, blob: torch.Tensor) -> tuple[str, Any]:
    if (not isinstance(e, list) or len(e) != 5 or e[0] not in ("tensor", "array", "bytes")
            or not isinstance(e[2], list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in e[2])
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                       for v in e[3:])):
        raise BadState("state tensor entry malformed")
    kind, dtype, shape, off, n = e
    if off % ALIGN or off + n > blob.numel():
        raise BadState("state tensor outside the state's bytes")
    raw = blob[off:off + n]
    numel = math.prod(shape)
    if kind == "tensor":
        if dtype not in DTYPES:
            raise BadState(f"state tensor dtype {dtype!r} not allowed")
        dt = DTYPES[dtype]
        if numel * torch.empty(0, dtype=dt).element_size() != n:
            raise BadState("state tensor size does not match its shape")
        # a tensor of its own (not a view of the received bytes: torch.set_rng_state, for
        # one, crashes on a view with a storage offset)
        t = raw.view(dt).reshape(shape).clone() if numel else torch.empty(shape, dtype=dt)
        return "tensor", t
    if kind == "array":
        if dtype not in NP_DTYPES:
            raise BadState(f"state array dtype {dtype!r} not allowed")
        dt = np.dtype(dtype)
        if numel * dt.itemsize != n:
            raise BadState("state array size does not match its shape")
        return "array", raw.numpy().view(dt).reshape(shape).copy()
    if dtype != "uint8" or shape != [n]:
        raise BadState("state bytes entry malformed")
    return "bytes", raw.numpy().tobytes()


# -- checks ---------------------------------------------------------------------------------------


def signature(state_dict: Mapping[str, Any]) -> list[tuple[str, list[int], str]]:
    """``(name, shape, dtype)`` of every tensor of a module's ``state_dict``, in order."""
    return [(k, list(v.shape), str(v.dtype).removeprefix("torch."))
            for k, v in state_dict.items() if isinstance(v, torch.Tensor)]


def check_like(received: Mapping[str, Any], own: Mapping[str, Any], what: str) -> None:
    """Raise :class:`BadState` unless ``received`` has exactly ``own``'s tensor names,
    shapes and dtypes (a model's ``state_dict`` against this member's own)."""
    if not isinstance(received, Mapping):
        raise BadState(f"{what}: not a mapping")
    mine, theirs = signature(own), signature(received)
    if mine != theirs or set(received) != set(own):
        diff = sorted(set(map(str, mine)) ^ set(map(str, theirs)))[:3]
        raise BadState(f"{what} does not match this member's model (e.g. {diff})")


def fingerprint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, global_batch: int,
                dataset_size: int, mode: str = "ring") -> str:
    """A short hash of the job's shape and training mode: every member of a ring must have
    the same one (a worker of another mode is refused as another job's)."""
    h = hashlib.sha256()
    shape = [signature(model.state_dict()), type(optimizer).__name__,
             len(optimizer.param_groups), global_batch, dataset_size]
    h.update(json.dumps(shape if mode == "ring" else [*shape, mode]).encode())
    return h.hexdigest()[:16]


STAGE_BYTES = 64 << 20  # the pinned staging buffer of a checksum of GPU tensors


def checksum(*modules_or_states: Any) -> str:
    """SHA-256 (hex, first 16 chars) of the bytes of every tensor in the arguments, in order:
    modules (their parameters and buffers) and state dicts (any nesting of dicts and lists,
    e.g. an optimiser's). Equal checksums mean bitwise-equal training state.

    Host tensors are hashed in place (no copy); GPU tensors go through one pinned staging
    buffer of at most :data:`STAGE_BYTES`, chunk by chunk, never through pageable copies of
    the whole state."""
    h = hashlib.sha256()
    stage: list[torch.Tensor] = []

    def feed(t: torch.Tensor) -> None:
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if flat.device.type == "cpu":
            h.update(memoryview(flat.numpy()))
            return
        if not stage:
            stage.append(torch.empty(min(STAGE_BYTES, max(flat.numel(), 1)),
                                     dtype=torch.uint8, pin_memory=True))
        buf = stage[0]
        for i in range(0, flat.numel(), buf.numel()):
            n = min(buf.numel(), flat.numel() - i)
            buf[:n].copy_(flat[i:i + n], non_blocking=True)
            torch.cuda.current_stream(flat.device).synchronize()
            h.update(memoryview(buf[:n].numpy()))

    def walk(x: Any) -> None:
        if isinstance(x, torch.nn.Module):
            for t in list(x.parameters()) + list(x.buffers()):
                walk(t)
        elif isinstance(x, torch.Tensor):
            if x.numel():
                feed(x)
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    for x in modules_or_states:
        walk(x)
    return h.hexdigest()[:16]
