"""Training state from a peer to joiners (and to everyone after a failure), with no files.

Design: after a generation forms, its members all-reduce a tiny table (each rank fills its
own row: committed step, fresh flag). The source is the lowest rank holding the highest
committed step (with the commit rule, members can differ by at most the one step that
completed on some members only). The members that lack that step (joiners, and after a
failure any member one step behind) are the receivers: the source encodes the state once
with :func:`trainer.state.codec.encode` (tensors and plain data, no pickle) and sends its length
and SHA-256 digest, then its bytes, point-to-point to each receiver, all sends posted at
once. A receiver checks the digest, decodes with :func:`trainer.state.codec.decode` and checks the
result against what the generation announces (the step the table agreed on, the job
fingerprint of the plan) before the caller loads it. The members that already hold the step
receive nothing and go straight on; with the commit rule the same step means the same bits.

Rule for callers: call :func:`sync_state` on every member of a new generation, right after
the group forms and before the first step; load the state only after :func:`check` passed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from trainer.collective import groups
from trainer.errors import BadState, GenerationBroken
from trainer.state import codec as st

log = logging.getLogger(__name__)

_TAG_LENGTH, _TAG_STATE = 1, 2  # point-to-point tags of the state's length and bytes
_DIGEST_WORDS = 4  # the SHA-256 digest as four int64 words after the length


def _digest_words(payload: torch.Tensor) -> list[int]:
    d = hashlib.sha256(payload.numpy().tobytes()).digest()
    return [int.from_bytes(d[i:i + 8], "big", signed=True) for i in range(0, 32, 8)]


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
) -> tuple[dict[str, Any] | None, int, int, int]:
    """Agree on the newest state and send it to every member that lacks it.

    ``step``: this member's committed step (ignored when ``fresh``). ``initial``: the first
    generation of the job, where every member is fresh and rank 0's freshly built state is
    the one everybody takes. ``get_state`` builds the state (plain data and tensors; called
    on the source only, and only when some member lacks the newest step). Returns
    ``(state, src, nbytes, best)``: the decoded state this member must load (None when it
    already holds the newest step), the source rank, the state bytes this member sent (the
    source: the sum over its receivers) or received, and the agreed newest step. Raises
    :class:`groups.GenerationBroken` on failure, :class:`trainer.errors.BadState` when the bytes
    received are not a state or fail their digest.
    """
    table = torch.zeros(world, 3, dtype=torch.float64)
    table[rank, 0] = -1 if fresh else step
    table[rank, 1] = 1 if fresh else 0
    table[rank, 2] = step  # what the state of a fresh member says (the first generation's)
    groups.allreduce(pg, table, should_abort)
    steps = [int(s) for s in table[:, 0].tolist()]
    fresh_ranks = [bool(f) for f in table[:, 1].tolist()]
    best = max(steps)
    if best < 0 and initial:
        best = steps[0]
    elif best < 0:
        raise GenerationBroken("no member of the new generation holds the training state")
    src = steps.index(best)
    best = int(table[src, 2])
    receivers = [r for r in range(world)
                 if r != src and (fresh_ranks[r] or steps[r] != best)]
    if not receivers:
        return None, src, 0, best
    if rank == src:
        payload = st.encode(get_state())
        head = torch.tensor([payload.numel(), *_digest_words(payload)], dtype=torch.int64)
        groups.send(pg, [(t, dst, tag) for dst in receivers
                       for t, tag in ((head, _TAG_LENGTH), (payload, _TAG_STATE))],
                  should_abort)
        log.info("state sent", extra={"src": src, "to": receivers,
                                      "bytes": payload.numel(), "steps": steps})
        return None, src, payload.numel() * len(receivers), best
    if rank not in receivers:
        return None, src, 0, best  # holds the newest step already: nothing travels to it
    head = torch.zeros(1 + _DIGEST_WORDS, dtype=torch.int64)
    groups.recv(pg, head, src, _TAG_LENGTH, should_abort)
    n = int(head[0])
    if not 0 < n <= 1 << 40:
        raise BadState(f"the state source announced {n} bytes")
    data = torch.empty(n, dtype=torch.uint8)
    groups.recv(pg, data, src, _TAG_STATE, should_abort)
    if _digest_words(data) != head[1:].tolist():
        raise BadState("the state received does not match the digest its source announced")
    return st.decode(data), src, n, best


def check(state: Any, *, step: int, job: str) -> dict[str, Any]:
    """Check a received state against what the generation announced: a mapping whose
    ``step`` is the agreed newest ``step`` and whose ``job`` fingerprint is the plan's
    (when the plan names one). Returns it; raises :class:`trainer.errors.BadState`."""
    if not isinstance(state, dict):
        raise BadState("the state received is not a mapping")
    if state.get("step") != step:
        raise BadState(f"the state received is at step {state.get('step')!r}, the "
                          f"generation agreed on {step}")
    if job and state.get("job") != job:
        raise BadState("the state received is of another job than the generation's plan")
    return state
