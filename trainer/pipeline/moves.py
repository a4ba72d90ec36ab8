"""Stage layers moved between members, point to point: when a generation forms, at an epoch
end or a snapshot (VW 0 gathers on its head), and at a drain (a leaving stage hands over).

Design. A move (:class:`trainer.pipeline.partition.Transfer`) carries layers ``[lo, hi)``
with their optimiser state and the shared state's plain part (step, cursor, samples done,
metrics: :meth:`trainer.state.training.TrainingState.meta`), encoded by
:mod:`trainer.state.codec` (no pickle) and announced by its length and SHA-256 digest.
:func:`run_moves` posts every send of this member first, then receives and loads its own in
order, then waits for the sends, so no two members wait on each other. A received stage is
checked: the digest, the layers' names and shapes (:func:`trainer.pipeline.stagestate.
load`), the step every member agreed and the job's fingerprint.

Rule for callers: every member of the generation calls :func:`run_moves` with the same
moves and the same ``base`` tag (one per purpose: :data:`MOVE_TAG`, :data:`GATHER_TAG`,
:data:`HANDOVER_TAG`), in the same order.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainer.collective import groups
from trainer.errors import BadState, GenerationBroken
from trainer.pipeline import partition, placement
from trainer.pipeline.runner import transport
from trainer.pipeline.stagestate import ModelIndex, bundle, load
from trainer.state import codec

log = logging.getLogger(__name__)

MOVE_TAG, GATHER_TAG, HANDOVER_TAG = 1 << 30, (1 << 30) | (1 << 24), (1 << 30) | (2 << 24)


@dataclass(frozen=True)
class Moved:
    """What :func:`run_moves` did for this member: the bytes sent and received, the rank it
    last received from, and the shared state that came with a forming move (None: none)."""

    nbytes: int = 0
    source: int | None = None
    meta: dict[str, Any] | None = None


def digest(payload: torch.Tensor) -> list[int]:
    """The SHA-256 of a uint8 tensor as four int64 words (what a move announces)."""
    d = hashlib.sha256(payload.numpy().tobytes()).digest()
    return [int.from_bytes(d[i:i + 8], "big", signed=True) for i in range(0, 32, 8)]


def run_moves(pg: Any, rank: int, moves: Sequence[partition.Transfer], *, index: ModelIndex,
              optimizer: torch.optim.Optimizer, device: torch.device, meta: dict[str, Any],
              step: int, job: str, base: int, abort: Callable[[], bool],
              slot_of: Callable[[int], Any] | None = None) -> Moved:
    """Run the moves ``rank`` is in over ``pg`` (see the module docstring): layers received
    for this member to hold go onto ``device`` (a gather's stay where the head put them).
    ``meta`` is what this member's sends carry; the received stage must be of ``step`` and
    (when given) of the job ``job``. Returns :class:`Moved` (``meta``: a forming move's
    received shared state, which the caller loads). Raises
    :class:`trainer.errors.GenerationBroken` (a peer failed, or sent a state that is not
    this job's at ``step``)."""
    posted, keep, nbytes = [], [], 0
    source: int | None = None
    got_meta: dict[str, Any] | None = None
    for i, t in enumerate(moves):
        if t.src == rank:
            payload = codec.encode(bundle(index, optimizer, t.lo, t.hi, meta))
            head = torch.tensor([payload.numel(), *digest(payload)], dtype=torch.int64)
            with transport(f"send to rank {t.dst}"):
                posted += [(pg.send([head], t.dst, base + 2 * i), t.dst),
                           (pg.send([payload], t.dst, base + 2 * i + 1), t.dst)]
            keep += [head, payload]
            nbytes += payload.numel()
    for i, t in enumerate(moves):
        if t.dst != rank:
            continue
        head = torch.zeros(5, dtype=torch.int64)
        with transport(f"recv from rank {t.src}"):
            groups.recv(pg, head, t.src, base + 2 * i, abort)
        n = int(head[0])
        if not 0 < n <= 1 << 40:
            raise GenerationBroken(f"stage state from rank {t.src}: {n} bytes announced")
        data = torch.empty(n, dtype=torch.uint8)
        with transport(f"recv from rank {t.src}"):
            groups.recv(pg, data, t.src, base + 2 * i + 1, abort)
        nbytes += n
        try:
            if digest(data) != head[1:].tolist():
                raise BadState("digest differs from the one announced")
            if base != GATHER_TAG:  # layers this member will hold: onto its device
                index.place(placement.only(len(index), t.lo, t.hi, placement.DEVICE), device,
                            optimizer)
            their = load(index, optimizer, codec.decode(data), t.lo, t.hi)
            if their.get("step") != step or (job and their.get("job") != job):
                raise BadState(f"state of step {their.get('step')!r} of another job, "
                               f"or not the agreed step {step}")
            if base == MOVE_TAG:  # a gather or a handover carries the sender's metrics,
                got_meta = their  # older than the head's own
            source = t.src
            if t.hi > t.lo and base == MOVE_TAG:
                log.info("received layers %d..%d from rank %d (slot %s)", t.lo, t.hi - 1,
                         t.src, slot_of(t.src) if slot_of is not None else None)
        except (BadState, KeyError, TypeError, ValueError) as e:
            raise GenerationBroken(f"stage state from rank {t.src} rejected: {e}") from e
    groups.wait_posted(posted, abort)
    return Moved(nbytes, source, got_meta)
