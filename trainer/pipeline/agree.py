"""The reductions that make a wave agreed, in wave order, off the member's main thread.

Design. After computing wave ``t`` a member posts its stage's pack to the all-reduce of its
stage group (the same stage of every virtual worker) and hands the wave to
:class:`Agreement`, whose thread waits for that reduction and only then joins the wave's
*control* reduction over the whole generation: one row per member (samples, busy and wall
seconds, the newest generation it saw, the last stage's loss and its samples, flags: the
head's duties once the wave is applied, a snapshot and the export of the trained model). So
the control reduction of wave ``t`` completes on a member only when every member's stage
reduction of ``t`` had completed: an agreed wave's reduced pack exists on every member of
every stage (that is what lets survivors of a failure roll forward to the newest wave
agreed anywhere; a stage's reduced pack of a wave not agreed is kept too, for completing
it: :mod:`trainer.pipeline.complete`).
With gradient clipping (``Job.grad_clip``), between the two: each member's stage's squared
gradient norm is summed over its virtual worker (a small all-reduce in the VW's group), so
every member knows the wave's total norm before it joins the control reduction, and a
survivor that rolls forward to a wave agreed elsewhere knows it too.
The main thread meanwhile computes the next waves (up to the staleness bound) and applies
agreed waves in order.

A wave whose control rows say a member ran out of memory is *spoiled*, and so is every
later wave (computed on top of it): handed to :meth:`Agreement.wait` like any other (so the
caller discards it), but never counted agreed nor its reduced pack kept (a failure before
the discard must not roll forward to it or complete from it), until :meth:`Agreement.forget`.

Rule for callers: :meth:`Agreement.submit` waves in order (the stage reduction is posted in
the caller's thread, so every member posts its collectives in the same order); read the
reduced packs of waves that were reduced but not agreed only after :meth:`Agreement.stop`.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainer.collective import groups
from trainer.errors import GenerationBroken
from trainer.pipeline.runner import transport

log = logging.getLogger(__name__)

ROW = 12  # the control row of one member
# SNAP, EXPORT: the head's duties once the wave is applied (VW 0 gathers on the head for them)
# OOM: the samples of the pass that ran out of memory on this member (0: none); CAP: this
# member's samples per pass from the next wave on (0: no cap)
SAMPLES, BUSY, WALL, LATEST, LOSS, EVAL, SNAP, STAGE0, LOSS_N, EXPORT, OOM, CAP = range(ROW)


@dataclass(frozen=True)
class Agreed:
    """A wave every member reduced: its reduced pack (None for a spare) and the reduced
    control rows ``(world, ROW)``, float64."""

    wave: int
    pack: torch.Tensor | None
    rows: torch.Tensor
    norm: float | None = None  # with clipping: the VW's total gradient norm (None: none)


class Agreement:
    """One generation's wave reductions (see the module docstring)."""

    def __init__(self, stage_pg: Any, ctl_pg: Any, world: int,
                 should_abort: Callable[[], bool], *,
                 clip: tuple[Any, Callable[[torch.Tensor], torch.Tensor]] | None = None
                 ) -> None:
        """``clip``: ``(pg, part)`` when the job clips gradients: after a wave's stage
        reduction, ``part(reduced pack)`` (a float64 vector, one entry per stage, this
        member's stage's squared norm in its place, zeros elsewhere) is summed over ``pg``
        (the member's virtual worker; None: a VW of one stage) and the wave's total norm is the square root of the
        sum of its entries in stage order: the same bits on every member."""
        self.stage_pg, self.ctl_pg, self.world = stage_pg, ctl_pg, world
        self.should_abort = should_abort
        self.clip = clip
        self.norms: dict[int, float | None] = {}  # the total norm of every reduced wave
        self._q: queue.Queue[tuple[int, Any, torch.Tensor | None, torch.Tensor] | None] = (
            queue.Queue())
        self._cond = threading.Condition()
        self.agreed: dict[int, Agreed] = {}
        self.reduced: dict[int, torch.Tensor | None] = {}  # stage-reduced, maybe not agreed
        self.error: BaseException | None = None
        self.newest = -1  # the newest wave agreed here
        self.spoiled: int | None = None  # the first wave a member ran out of memory in
        self._thread = threading.Thread(target=self._run, name="spotring-waves", daemon=True)
        self._thread.start()

    def submit(self, wave: int, pack: torch.Tensor | None, row: torch.Tensor) -> None:
        """Post wave ``wave``'s stage reduction of ``pack`` (None: a spare, or a stage of one
        VW) and queue its control reduction of ``row`` (this member's row filled)."""
        work = None
        if pack is not None and self.stage_pg is not None:
            with transport(f"stage reduction of wave {wave}"):
                work = self.stage_pg.allreduce([pack])
        self._q.put((wave, work, pack, row))

    def wait(self, wave: int) -> Agreed:
        """Block until ``wave`` is agreed. Raises :class:`trainer.errors.GenerationBroken` when a
        reduction failed or the generation was declared broken."""
        with self._cond:
            while wave not in self.agreed:
                if self.error is not None:
                    raise GenerationBroken(f"wave {wave}: {self.error}") from self.error
                if self.should_abort():
                    raise GenerationBroken(f"wave {wave}: aborted (the generation was "
                                          "declared broken)")
                self._cond.wait(groups.WAIT_SLICE_S)
            for done in [w for w in self.reduced if w < wave]:  # applied: not needed to
                del self.reduced[done]  # roll forward (kept, they held every wave's pack)
                self.norms.pop(done, None)
            return self.agreed.pop(wave)

    def forget(self, wave: int) -> None:
        """Waves ``wave`` and later were discarded (each one waited for): they will be
        submitted again."""
        with self._cond:
            self.spoiled = None
            for w in [w for w in (*self.reduced, *self.agreed) if w >= wave]:
                self.reduced.pop(w, None)
                self.agreed.pop(w, None)
                self.norms.pop(w, None)

    def stop(self) -> None:
        """Stop after the wave in progress (a failed or abandoned one ends at once)."""
        self._q.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while True:
                item = self._q.get()
                if item is None:
                    return
                wave, work, pack, row = item
                if work is not None:
                    groups.wait(work, self.should_abort, f"stage reduction of wave {wave}",
                              sliced=isinstance(self.stage_pg, dist.ProcessGroupGloo))
                norm = None
                if self.clip is not None and pack is not None:  # before the control
                    vec = self.clip[1](pack)  # reduction: a wave agreed anywhere has its
                    if self.clip[0] is not None:  # norm here (None: a VW of one stage)
                        groups.allreduce(self.clip[0], vec, self.should_abort)
                    norm = math.sqrt(math.fsum(vec.tolist()))  # exact: the same everywhere
                with self._cond:
                    self.reduced[wave] = pack
                    self.norms[wave] = norm
                groups.allreduce(self.ctl_pg, row, self.should_abort)
                with self._cond:
                    if self.spoiled is None and float(row[:, OOM].max()) > 0:
                        self.spoiled = wave
                    if self.spoiled is not None:  # discarded by every member: never kept
                        self.reduced.pop(wave, None)
                    else:
                        self.newest = wave
                    self.agreed[wave] = Agreed(wave, pack, row, norm)
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            with self._cond:
                self.error = e
                self._cond.notify_all()
            log.debug("wave reductions stopped: %s", e)
