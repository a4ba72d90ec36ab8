"""Wave Synchronous Parallel over all-reduce: when a virtual worker may start a wave, and
which update it applies first.

Design. A *wave* is one global batch: every virtual worker (VW) computes its micro-batches of
it and each stage all-reduces its gradients with the same stage of the other VWs; a small
*control* reduction over the whole generation then says that every stage of every VW has the
reduced gradient (the wave is **agreed**). The update of wave ``t`` is applied by every
member in wave order, identically, so all replicas of a layer hold the same bits (HetPipe's
parameter server is replaced by the reduction; its staleness bound is kept):

* with staleness bound ``D``, a member starts wave ``w`` only after waves ``0 .. w - D - 1``
  are agreed and applies them first (:func:`needed_before`): wave ``w`` is computed on
  weights that miss at most the ``D`` newest updates, and a VW starts a wave at most ``D``
  waves beyond what the slowest VW has finished (:func:`max_ahead` measures it);
* ``D = 0`` is synchronous: wave ``w`` runs on every update before it, and the update is the
  gradient of the whole global batch, equal to one process on the same micro-batches;
* a change of generation (a join, a drain) seen in the control reduction of wave ``t`` stops
  every member after the same wave, ``t + D`` (:func:`stop_wave`): nobody may have started a
  later one (it needed wave ``t`` agreed), and every wave started is finished and applied, so
  a change with notice loses nothing.

Rule for callers: gate every wave with :func:`needed_before`; apply agreed waves strictly in
order; never start a wave past :func:`stop_wave` of a switch already seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

START, DONE = "start", "done"


def needed_before(wave: int, staleness: int) -> int:
    """How many waves (``0 .. n - 1``) must be agreed and applied before ``wave`` starts."""
    if staleness < 0:
        raise ValueError(f"staleness bound {staleness}: must be >= 0")
    return max(0, wave - staleness)


def stop_wave(seen_in: int, staleness: int) -> int:
    """The last wave to compute when the control reduction of wave ``seen_in`` announced a
    newer generation: every member stops after the same one."""
    return seen_in + staleness


@dataclass(frozen=True)
class WaveEvent:
    """A VW started (``start``) or finished computing (``done``) ``wave`` at ``time``."""

    time: float
    vw: int
    kind: str
    wave: int


def max_ahead(events: Iterable[WaveEvent]) -> int:
    """The most waves any VW started beyond what the slowest VW had finished: at each
    ``start`` of wave ``w``, ``w - min_v(waves VW v had finished)``; never above the bound
    ``D`` when the gate is kept (0 when synchronous)."""
    evs = sorted(events, key=lambda e: (e.time, e.kind != DONE))
    vws = {e.vw for e in evs}
    done = dict.fromkeys(vws, 0)
    worst = 0
    for e in evs:
        if e.kind == DONE:
            done[e.vw] = max(done[e.vw], e.wave + 1)
        else:
            worst = max(worst, e.wave - min(done.values()))
    return worst
