"""Bounded staleness: versions, tickets and the rule that a zone may compute. Pure.

Design. A hybrid generation applies one global sequence of updates; ``version`` ``v`` is
the ``v``-th update of the job (the ring's step number), and a replica that applied updates
``0 .. w-1`` holds the weights of version ``w``. Each update is a whole global batch ``B``
(the job's, as one ring step) computed by one zone on the weights it holds: an *asynchronous
large mini-batch*. Which update a zone computes is a **ticket** handed out in order by the
:class:`Sequencer` (the leader of zone 0 keeps it): ticket ``v`` fixes the update's samples
(the data cursor after ``v`` updates) and its place in the sequence, so every replica applies
the same updates in the same order and the same version means the same bits everywhere.

**The bound** (:func:`may_compute`): a zone holding ticket ``v`` computes it only on weights
of version ``w >= v - s``; the update is applied to the weights of version ``v``, so it is
applied to weights at most ``s`` versions newer than those it was computed on (``s``
versions old, in the issue's words). ``s = 0`` would serialise the zones; the hybrid mode
runs the synchronous ring instead there. No deadlock: the smallest ticket handed out and not
yet applied needs only updates older than itself, all of them computed already.

**Stopping** (:meth:`Sequencer.issue`): the sequencer hands out no ticket at or past
``end`` (the job's last update) and none once any leader reports a newer generation; it
answers with ``final``, the number of tickets handed out. Every zone then computes the
tickets it holds, applies every update below ``final`` and leaves the generation at the
same version as every other zone (a join or a drain loses no update and makes no member
fetch the state).

Rule for callers: hand out tickets only through :meth:`Sequencer.issue`; compute a ticket
only when :func:`may_compute` says so; apply updates in version order, each exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from trainer.data.sampler import CursorState


@dataclass(frozen=True)
class Ticket:
    """The sequencer's answer: ``version`` to compute, or None and ``final`` (stop: every
    zone applies the updates below ``final`` and leaves the generation); ``newest``: the
    newest generation the sequencer has heard of."""

    version: int | None
    final: int | None = None
    newest: int = 0


@dataclass(frozen=True)
class Sequencer:
    """The tickets of one generation: ``next`` to hand out, none at or past ``end``;
    ``final`` once stopped."""

    generation: int
    next: int
    end: int
    final: int | None = None
    newest: int = 0

    def issue(self, newest_seen: int) -> tuple[Sequencer, Ticket]:
        """A ticket for a zone whose leader has seen generation ``newest_seen``.

        Returns the new sequencer and the :class:`Ticket` (a stop once the data ends or a
        newer generation was seen, by this or any earlier request).
        """
        seq = self
        if newest_seen > seq.newest:
            seq = replace(seq, newest=newest_seen)
        if seq.final is None and (seq.newest > seq.generation or seq.next >= seq.end):
            seq = replace(seq, final=seq.next)
        if seq.final is not None:
            return seq, Ticket(None, seq.final, seq.newest)
        return replace(seq, next=seq.next + 1), Ticket(seq.next, None, seq.newest)


def may_compute(ticket: int, weights_version: int, staleness: int) -> bool:
    """May ticket ``ticket`` be computed on weights of ``weights_version``? (the bound)"""
    return ticket - weights_version <= staleness


def contiguous(applied: int, have: set[int] | frozenset[int], limit: int) -> int:
    """How many updates from version ``applied`` on are at hand without a gap (at most
    ``limit``): those can be applied now, in order."""
    n = 0
    while n < limit and applied + n in have:
        n += 1
    return n


def cursor_after(cursor: CursorState, updates: int, dataset_size: int, global_batch: int,
                 min_batch: int) -> CursorState:
    """The data cursor ``updates`` updates after ``cursor`` (each update a step of the ring:
    ``B`` samples, the short last step of an epoch as :meth:`CursorState.step_total`)."""
    for _ in range(updates):
        cursor = cursor.advance(dataset_size, cursor.step_total(dataset_size, global_batch,
                                                                min_batch=min_batch))
    return cursor


def end_update(cursor: CursorState, step: int, dataset_size: int, global_batch: int,
               min_batch: int, ends: Callable[[int, int], bool]) -> int:
    """The first update ``u >= step`` at which ``ends(u, epoch)`` holds, ``epoch`` being the
    cursor's epoch after the updates from ``step`` (at ``cursor``) to ``u`` (the job's last
    ticket: ``ends`` is :meth:`trainer.job.Job.ends_at`, the one decision of where a job
    ends). ``ends`` must hold for some epoch and grow no weaker with the step or the epoch.
    Walks the current epoch; a whole epoch no step of which ends the job is skipped at
    once (every whole epoch has as many updates)."""
    whole: int | None = None
    while not ends(step, cursor.epoch):
        if cursor.cursor == 0:
            if whole is None:
                c, whole = CursorState(0, 0), 0
                while c.epoch == 0:
                    c = cursor_after(c, 1, dataset_size, global_batch, min_batch)
                    whole += 1
            if not ends(step + whole - 1, cursor.epoch):
                step, cursor = step + whole, CursorState(cursor.epoch + 1, 0)
                continue
        cursor = cursor_after(cursor, 1, dataset_size, global_batch, min_batch)
        step += 1
    return step
