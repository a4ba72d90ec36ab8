"""Training state from a peer to joiners (and to everyone after a failure), with no files.

Design: the state is one picklable dict (parameters, optimiser state, step, epoch, data
cursor, RNG states, the batch planner's speed model and sizes). After a generation forms,
its members all-reduce a tiny table (each rank fills its own row: committed step, fresh
flag). The source is the lowest rank holding the highest committed step (with the commit
rule, members can differ by at most the one step that completed on some members only). The
members that lack that step (joiners, and after a failure any member one step behind) are
the receivers: the source serialises the state with ``torch.save`` into memory once and
sends its length and bytes point-to-point to each receiver, all sends posted at once. The
members that already hold the step receive nothing and go straight on; with the commit rule
the same step means the same bits, so all hold bitwise-identical parameters afterwards.

Rule for callers: call :func:`sync_state` on every member of a new generation, right after
the group forms and before the first step.
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainer import ring

log = logging.getLogger(__name__)

_TAG_LENGTH, _TAG_STATE = 1, 2  # point-to-point tags of the state's length and bytes


def checksum(model: torch.nn.Module) -> str:
    """SHA-256 (hex, first 16 chars) of every parameter and buffer's bytes, in order."""
    h = hashlib.sha256()
    for t in list(model.parameters()) + list(model.buffers()):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def rng_state() -> dict[str, Any]:
    """The process's RNG states (python, numpy, torch CPU)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def dumps(state: dict[str, Any]) -> torch.Tensor:
    """Serialise ``state`` into a uint8 tensor."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def loads(data: torch.Tensor) -> dict[str, Any]:
    """Inverse of :func:`dumps`."""
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def sync_state(
    pg: Any,
    rank: int,
    world: int,
    step: int,
    fresh: bool,
    get_state: Callable[[], dict[str, Any]],
    should_abort: Callable[[], bool],
    *,
    initial: bool = False,
) -> tuple[dict[str, Any] | None, int, int]:
    """Agree on the newest state and send it to every member that lacks it.

    ``step``: this member's committed step (ignored when ``fresh``). ``initial``: the first
    generation of the job, where every member is fresh and rank 0's freshly built state is
    the one everybody takes. ``get_state`` builds the state dict (called on the source only,
    and only when some member lacks the newest step). Returns ``(state, src, nbytes)``: the
    state this member must load (None when it already holds the newest step: with the commit
    rule, the same step means the same bits), the source rank, and the state bytes this
    member sent (the source: the sum over its receivers) or received (0 for the others).
    Raises :class:`ring.RingBroken` on failure.
    """
    table = torch.zeros(world, 2, dtype=torch.float64)
    table[rank, 0] = -1 if fresh else step
    table[rank, 1] = 1 if fresh else 0
    ring.allreduce(pg, table, should_abort)
    steps = [int(s) for s in table[:, 0].tolist()]
    fresh_ranks = [bool(f) for f in table[:, 1].tolist()]
    best = max(steps)
    if best < 0 and initial:
        best = steps[0]
    elif best < 0:
        raise ring.RingBroken("no member of the new generation holds the training state")
    src = steps.index(best)
    receivers = [r for r in range(world)
                 if r != src and (fresh_ranks[r] or steps[r] != best)]
    if not receivers:
        return None, src, 0
    if rank == src:
        payload = dumps(get_state())
        length = torch.tensor([payload.numel()], dtype=torch.int64)
        ring.send(pg, [(t, dst, tag) for dst in receivers
                       for t, tag in ((length, _TAG_LENGTH), (payload, _TAG_STATE))],
                  should_abort)
        log.info("state sent", extra={"src": src, "to": receivers,
                                      "bytes": payload.numel(), "steps": steps})
        return None, src, payload.numel() * len(receivers)
    if rank not in receivers:
        return None, src, 0  # holds the newest step already: nothing travels to it
    length = torch.zeros(1, dtype=torch.int64)
    ring.recv(pg, length, src, _TAG_LENGTH, should_abort)
    data = torch.empty(int(length.item()), dtype=torch.uint8)
    ring.recv(pg, data, src, _TAG_STATE, should_abort)
    return loads(data), src, data.numel()
