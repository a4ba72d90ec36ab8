"""The pipeline mode: HetPipe virtual workers under Wave Synchronous Parallel.

Design. :class:`PipelineMode` is a mode of the member skeleton (:mod:`trainer.worker.member`:
the admission, generations, roll calls, drains, heartbeats, the commit and the reports are
the skeleton's); what differs is inside a generation.

* **Forming** (:meth:`~PipelineMode.transfer_state`, :meth:`~PipelineMode.prepare`). After
  the generation's group forms, every member fills its row of a table
  (:mod:`trainer.pipeline.table`) and the table is all-reduced. From it, every member
  computes the same things: the newest wave agreed anywhere (survivors roll forward to it
  from the reduced packs they kept, so a failure loses only the waves not yet agreed), the
  layout (:func:`trainer.pipeline.partition.decide`: virtual workers, slots, boundaries),
  and the moves (:func:`~trainer.pipeline.partition.transfers`): a replacement receives its
  stage's layers from the same stage of another virtual worker, point to point
  (:mod:`trainer.pipeline.moves`). Layers nobody holds any more (a stage of the only
  virtual worker) come from the newest durable snapshot: every member rolls back to it;
  without one the job fails with that reason. Each stage's members then form their own
  group (``g<n>/s<j>/``) for the stage's reduction, and a last small reduction gives every
  member a checksum over all stages (equal everywhere when every stage's replicas are).
* **Waves** (:meth:`~PipelineMode.step`). A wave is one global batch: split into fixed-size
  micro-batches, given to the virtual workers by their rates
  (:func:`~trainer.pipeline.partition.split_micro`), each stage runs its schedule
  (:mod:`trainer.pipeline.runner`), packs its gradients and posts them to its stage group;
  :class:`trainer.pipeline.agree.Agreement` then joins the control reduction. Waves are
  applied in order, identically on every replica, once agreed (each one commit of the
  skeleton); with the staleness bound D, wave ``w`` starts after waves ``< w - D`` are
  applied (:mod:`trainer.pipeline.wsp`). The head (VW 0's stage 0) claims the skeleton's
  duties (a snapshot, the export of the trained model) in a wave's control row, so every
  member of VW 0 knows to gather its layers on the head (:meth:`~PipelineMode.whole_model`)
  at the same wave. What is gathered is the committed state of that wave: with D > 0 the
  later waves are already computed and each stage's live buffers hold its own changes of
  them, so the gather sends the buffers as committed with the wave
  (:meth:`trainer.pipeline.stagestate.StagePack.committed_in_place`). An epoch end is a
  barrier (every wave applied), and so is a wave after which ``Job.eval_every_steps`` asks
  for an evaluation: the evaluation gathers the same way, on the committed model.
* **Changes.** A newer generation seen in the control reduction of wave ``t`` stops every
  member after wave ``t + D``, every started wave applied: a join or a drain loses nothing.
  After a failure the next generation completes the waves started and not agreed anywhere
  from the packs the survivors kept (:mod:`trainer.pipeline.complete`): only the micro-batches
  no kept pack covers run again. When a VW may hold more than one wave's work unreduced
  (D > 0), each member also sends its packs to the same stage of the next VW as backups
  (:mod:`trainer.pipeline.backups`).

* **Memory.** Each member has a cap of samples per pass (``Job.micro_batch`` at first, none
  without it), known to all: in the forming table, then in every wave's control row. A
  virtual worker cuts its micro-batches to the least cap of its members (more, smaller
  micro-batches: :func:`trainer.collective.step.micro_bounds`). A stage that runs out of
  memory finishes its schedule with spoiled (NaN) messages (:mod:`trainer.pipeline.runner`),
  halves its cap and says so in the wave's control row: every member then discards that
  wave and every later one it started (nothing applied, buffers restored; the reductions
  drained so every member stays in step; :meth:`trainer.pipeline.agree.Agreement.forget`)
  and computes them again from the discarded wave's cursor: never a job error while a cap
  can halve, the same samples, exactly once.
* **The job's scheduler** (``Job.scheduler``) is stepped by the skeleton's commit, once per
  committed wave on every member (never for a discarded one); its state and the optimiser's
  hyperparameters it sets (``lr``, momentum, ...) travel with every forming move (a
  joiner's take the sender's, as the progress: a stage's move carries only its layers'
  per-parameter state) and its state is in every member's digest of its stage.
* **Ends.** The data's end, ``Job.max_steps`` or the run's ``--until-steps`` and
  ``--until-epochs``: no wave starts beyond the first of them (:meth:`trainer.job.Job.ends_at`,
  as the ring's steps).

Files. The moves of layers (forming, the roll forward and back, the gather on the head) are
in :mod:`trainer.worker.modes.pipeline_forming` (:class:`PipelineMode`'s base class); the
waves, their agreement, the out-of-memory discard and the commit are here.

Rule for callers: as :class:`~trainer.worker.modes.base.Mode`; the job's model must be an
``nn.Sequential`` and ``Job.pipeline`` a :class:`trainer.pipeline.PipelineSettings`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer.collective import groups
from trainer.collective.step import lowered_cap, micro_bounds
from trainer.data.sampler import CursorState
from trainer.errors import (ControlLost, ControlTimeout, GenerationBroken, LayoutError,
                            Malformed)
from trainer.pipeline import agree, complete, partition, placement, profile, wsp
from trainer.pipeline.agree import Agreement
from trainer.pipeline.backups import Backups
from trainer.pipeline.moves import HANDOVER_TAG
from trainer.pipeline.runner import Micro, StageRunner
from trainer.pipeline.schedule import schedule
from trainer.pipeline.settings import PipelineSettings
from trainer.pipeline.stagestate import ModelIndex, StagePack, clip_coefficient
from trainer.protocol import messages as mb
from trainer.worker.modes.base import PIPELINE_LACKS, Commit, Duties, Unsettled, lacking
from trainer.worker.modes.pipeline_forming import Forming, PipelineForming, StartedWave

if TYPE_CHECKING:
    from trainer.worker.member import Member

log = logging.getLogger(__name__)


class PipelineMode(PipelineForming):
    """The pipeline mode (see the module docstring)."""

    def __init__(self, member: Member) -> None:
        self.m = member
        w = member.w
        job = w.job
        self.ps: PipelineSettings = job.pipeline
        self._problem: str | None = None
        self.index: ModelIndex | None = None
        try:
            if not isinstance(job.pipeline, PipelineSettings):
                raise LayoutError("Job.pipeline must be a trainer.pipeline.PipelineSettings")
            if job.precision == "fp16":
                raise LayoutError("precision fp16 is not supported by virtual workers; use "
                                  "bf16 or fp32")
            if self.ps.micro_batch < w.runtime.min_batch:
                raise LayoutError(f"micro_batch {self.ps.micro_batch} is below the minimum "
                                  f"local batch {w.runtime.min_batch}")
            self.index = ModelIndex(job.model, job.optimizer)
            rt = w.runtime
            self.measured = profile.layer_costs(
                job.model, self.ps.layer_seconds, lambda: rt.batch(torch.arange(min(
                    len(job), self.ps.micro_batch)), 0)[0], rt.device, job.precision)
        except (LayoutError, ValueError) as e:
            self._problem = str(e)
        self.memory = placement.memory_of(getattr(self.ps, "memory_bytes", None),
                                          w.runtime.device)
        self.lo = self.hi = 0  # the layers this member holds, current at the state's step
        self.slot: tuple[int, int] | None = None
        self.bounds: tuple[int, ...] | None = None
        self.layout_gen = 0
        self.layout: partition.Layout | None = None
        self.sgroup: groups.Group | None = None
        self.vgroup: groups.Group | None = None
        self.runner: StageRunner | None = None
        self.pack: StagePack | None = None
        self.agree: Agreement | None = None
        self.pending: list[StartedWave] = []
        self.ccursor = CursorState()
        self.stop_at: int | None = None
        self.newest = 0
        self.kept: dict[int, StartedWave] = {}  # started, not agreed, kept through a failure
        self.completion: dict[int, complete.WavePlan] = {}
        self.history: list[StartedWave] = []  # the newest waves applied (the dead's records)
        self.backups: Backups | None = None
        self.backup_kept: dict[int, tuple[torch.Tensor, float, int]] = {}
        self._forming: Forming | None = None
        self.caps: dict[str, int] = {}  # every member's samples per pass (agreed; none: no cap)

    # -- setup ------------------------------------------------------------------------------

    def problem(self) -> str | None:
        return self._problem or lacking(self.m.w.job, PIPELINE_LACKS, "pipeline")

    def drop(self) -> None:
        if self.agree is not None:
            self.agree.stop()
        for g in (self.sgroup, self.vgroup):
            if g is not None:
                g.abort()
                groups.bury(g)
        self.sgroup = self.vgroup = None
        self.runner = None

    def close(self) -> None:
        if self.agree is not None:
            self.agree.stop()

    def unsettled(self) -> Unsettled | None:
        return None  # the waves a gone member took part in are recorded while forming

    # -- waves ----------------------------------------------------------------------------------

    def step(self) -> int:
        """One wave (see the module docstring). Returns the newest generation seen, once every
        started wave is applied at the generation's stop point; else this generation."""
        m, w = self.m, self.m.w
        plan = m.plan
        assert plan is not None and m.hb is not None
        gen = plan.generation
        if self.layout is None:  # nothing fits: wait for the next generation
            time.sleep(0.05)
            return max(gen, m.hb.latest)
        applied = lambda: w.state.progress.step  # noqa: E731
        wave = applied() + len(self.pending)
        if not self._apply_through(wsp.needed_before(wave, self.ps.staleness)):
            return gen  # discarded (out of memory): computed again from the next call
        stop = self.stop_at is not None and wave > self.stop_at
        if stop or w.job.ends_at(wave, self.ccursor.epoch, until_steps=w.cfg.until_steps,
                                 until_epochs=w.cfg.until_epochs):
            if not self._apply_through(applied() + len(self.pending)):
                return gen
            if stop:
                self._handover()
            return self.newest if stop else gen
        epoch = self.ccursor.epoch
        self._compute(wave)
        # an epoch end and an evaluation (Job.eval_every_steps) are barriers: everything
        # applied, so the head evaluates the committed model (no wave's own buffer changes)
        if self.ccursor.epoch != epoch or self.m.eval_due(False, wave + 1):
            if not self._apply_through(applied() + len(self.pending)):
                return gen
        elif not self._apply_through(wsp.needed_before(wave + 1, self.ps.staleness)):
            return gen
        if self.stop_at is not None and applied() > self.stop_at and not self.pending:
            self._handover()
            return self.newest
        return gen

    def _handover(self) -> None:
        """At a generation's stop point (every started wave applied): the stages whose every
        replica leaves with notice go to members that stay, so a drain loses nothing."""
        m = self.m
        assert m.plan is not None and self.layout is not None
        try:
            nxt = mb.Plan.from_json(m.store.get(mb.k_plan(self.newest)))
        except (ControlLost, ControlTimeout, Malformed) as e:
            raise GenerationBroken(f"reading generation {self.newest}: {e}") from e
        staying = [r for r, mid in enumerate(m.plan.members) if mid in set(nxt.members)]
        moves = partition.handover(self.layout, staying)
        if not moves:
            return
        self._move(moves, m.w.state.progress.step, HANDOVER_TAG)
        for t in moves:
            if t.dst == m.rank:
                lo, hi = (t.lo, t.hi) if self.hi <= self.lo else (
                    min(self.lo, t.lo), max(self.hi, t.hi))
                self.lo, self.hi = lo, hi
                log.info("took over layers %d..%d from rank %d, which leaves", t.lo, t.hi - 1,
                         t.src)

    def _compute(self, wave: int) -> None:
        m, w, layout, ps = self.m, self.m.w, self.layout, self.ps
        job, rt, plan = w.job, w.runtime, m.plan
        assert layout is not None and plan is not None and m.hb is not None
        cur = self.ccursor
        total = cur.step_total(len(job), job.global_batch, min_batch=rt.min_batch)
        ids = rt.order(cur.epoch)[cur.cursor:cur.cursor + total]
        sizes = partition.micro_sizes(total, ps.micro_batch)
        wp = self.completion.pop(wave, None)  # a wave started before a failure
        kw = self.kept.pop(wave, None)
        bk = self.backup_kept.pop(wave, None)
        todo = list(range(len(sizes))) if wp is None else list(wp.recompute)
        counts = partition.split_micro(len(todo), layout.rates, layout.stages)
        offs = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        members = plan.members
        heads = complete.parts(wp, layout, todo, counts, len(sizes), 0)
        parts = tuple((members[r], [int(i) for mb_ in p for i in ids[offs[mb_]:offs[mb_ + 1]]])
                      for r, p in heads.items())
        rows = torch.zeros(len(members), agree.ROW, dtype=torch.float64)
        me = rows[m.rank]
        me[agree.LATEST] = m.hb.latest
        mine: list[int] = []
        step = w.state.progress.step
        rt.maybe_fault(step)
        self.pending.append(StartedWave(wave, cur, total, mine, parts=parts))
        flat = None
        if self.slot is not None:
            assert self.runner is not None and self.pack is not None
            v, j = self.slot
            mids = [ids[offs[i]:offs[i + 1]] for i in complete.split(todo, counts, v)]
            cap = self._vw_cap(layout.vws[v])
            if cap is not None:  # more, smaller micro-batches for this virtual worker
                mids = [x[lo:hi] for x in mids
                        for lo, hi in micro_bounds(len(x), cap, rt.min_batch)]
            if j == 0:
                mine += dict(parts)[members[m.rank]]
            at_stage = heads if j == 0 else complete.parts(wp, layout, todo, counts,
                                                           len(sizes), j)
            self.pending[-1].cover = at_stage[m.rank]
            micros = [Micro(i, len(x), len(x) / total) for i, x in enumerate(mids)]
            cache: dict[int, Any] = {}

            def part(i: int, which: int) -> Any:
                if i not in cache:
                    cache[i] = rt.batch(mids[i], step)
                return cache[i][which]

            before = self.pack.live_buffers()
            stats = self.runner.run(
                schedule(ps.schedule, len(micros), layout.stages, j), micros, wave,
                (lambda i: part(i, 0)) if j == 0 else None,
                (lambda i: part(i, 1)) if j == layout.stages - 1 else None, m.abort)
            flat, self.pending[-1].deltas = self.pack.pack(before, rt.device)
            loss, loss_n = stats.loss_sum, sum(len(x) for x in mids)
            if stats.oom:
                rt.micro_cap = lowered_cap(
                    stats.oom, step, stats.oom, min_batch=rt.min_batch, device=rt.device,
                    what="the wave is discarded on every member and computed again")
                me[agree.OOM] = stats.oom
            if wp is not None:  # a wave started before a failure: what was kept of it
                try:
                    flat, loss, loss_n = complete.combine(
                        wp, m.rank, j, flat, loss, loss_n, backup=bk,
                        reduced=None if kw is None else kw.reduced,
                        own=None if kw is None else (kw.local, kw.loss, kw.loss_n))
                except LookupError as e:
                    raise GenerationBroken(str(e)) from e
            wv = self.pending[-1]
            spoiled = stats.oom > 0 or not bool(torch.isfinite(flat).all())
            wv.local = None if spoiled else flat.clone()  # a spoiled pack is never kept
            wv.loss, wv.loss_n = loss, loss_n
            if self.backups is not None:
                self.backups.send(wave, flat, wv.cover, loss, loss_n)
            me[agree.SAMPLES] = len(mine) if j == 0 else 0
            me[agree.BUSY], me[agree.WALL] = stats.busy_s, stats.wall_s
            me[agree.LOSS] = loss
            me[agree.LOSS_N] = loss_n if j == layout.stages - 1 else 0
            me[agree.STAGE0] = 1.0 if j == 0 else 0.0
            rt.note_speed(sum(len(x) for x in mids), stats.busy_s)
        me[agree.CAP] = rt.micro_cap or 0
        if self.is_head():  # the head's duties after this wave: every member learns them
            duties = m.claim_duties(wave + 1)
            me[agree.EVAL] = w.outputs.eval_s
            me[agree.SNAP] = 1.0 if duties.snapshot else 0.0
            me[agree.EXPORT] = 1.0 if duties.export else 0.0
        self._agreement().submit(wave, flat, rows)
        self.ccursor = cur.advance(len(job), total)

    def _agreement(self) -> Agreement:
        m = self.m
        if self.agree is None:
            assert m.plan is not None and m.group is not None
            sg = self.sgroup.pg if self.sgroup is not None else None
            gen = m.plan.generation
            self.agree = Agreement(sg, m.group.ctl, len(m.plan.members),
                                   lambda: m.broken(gen), clip=self._clip_part())
        return self.agree

    def _clip_part(self) -> tuple[Any, Callable[[torch.Tensor], torch.Tensor]] | None:
        """With ``Job.grad_clip``: the VW's group (this member's alone for one stage) and this
        member's stage's part of the total norm (:class:`trainer.pipeline.agree.Agreement`);
        else None."""
        if self.m.w.job.grad_clip is None or self.slot is None or self.pack is None:
            return None
        pack, (j, k) = self.pack, (self.slot[1], self.ps.stages)
        pg = self.vgroup.ctl if self.vgroup is not None else None

        def part(reduced: torch.Tensor) -> torch.Tensor:
            vec = torch.zeros(k, dtype=torch.float64)
            vec[j] = pack.grad_sqnorm(reduced)
            return vec

        return pg, part

    def _apply_through(self, count: int) -> bool:
        """Apply agreed waves in order until ``count`` waves are applied. Returns False when
        a member ran out of memory in the next one: every started wave was discarded
        (:meth:`_discard`), nothing applied."""
        state = self.m.w.state
        while state.progress.step < count:
            got = self._agreement().wait(state.progress.step)
            if float(got.rows[:, agree.OOM].max()) > 0:
                self._discard(got)
                return False
            self._commit(self.pending[0], got.pack, got.rows, got.norm)
            if self.backups is not None:
                self.backups.done(got.wave)
        return True

    def _vw_cap(self, ranks: tuple[int, ...] | list[int]) -> int | None:
        """The samples per pass of the virtual worker of ``ranks``: its members' least cap
        (None: none has one). The same on every member (the caps are agreed)."""
        plan = self.m.plan
        assert plan is not None
        caps = [self.caps[plan.members[r]] for r in ranks if plan.members[r] in self.caps]
        return min(caps) if caps else None

    def _discard(self, got: agree.Agreed) -> None:
        """A member ran out of memory in wave ``got.wave``: every member discards it and every
        later wave it started (the same ones everywhere: the waves a member starts before
        applying one are fixed by the staleness bound), after draining their reductions and
        backups; takes every member's new cap from the wave's rows; the data cursor goes
        back to the discarded wave's. Nothing is applied; the buffers are the committed ones."""
        m = self.m
        assert m.plan is not None
        rows = got.rows
        for r, mid in enumerate(m.plan.members):
            cap = int(rows[r, agree.CAP])
            if cap > 0:
                self.caps[mid] = cap
        waves = [wv.wave for wv in self.pending]
        for wave in waves[1:]:
            self._agreement().wait(wave)  # every member submitted it: its reductions end
        self._agreement().forget(waves[0])
        if self.backups is not None:
            for wave in waves:
                self.backups.done(wave)
            self.backups.redo(waves[0])
        self.ccursor = self.pending[0].cursor
        self.pending.clear()
        if self.pack is not None:
            self.pack.restore()
        who = [f"{mid} ({int(rows[r, agree.OOM])} samples)"
               for r, mid in enumerate(m.plan.members) if rows[r, agree.OOM] > 0]
        log.warning("out of memory in wave %d on %s: waves %d..%d discarded on every member "
                    "and computed again, virtual workers' caps %s", got.wave, ", ".join(who),
                    waves[0], waves[-1],
                    [self._vw_cap(vw) for vw in self.layout.vws] if self.layout else [])

    def _commit(self, wv: StartedWave, pack: torch.Tensor | None, rows: torch.Tensor | None,
                norm: float | None = None) -> None:
        """Apply wave ``wv`` (its reduced pack, its gradients clipped to ``Job.grad_clip``
        by the VW's total ``norm``) and commit it; ``rows``: its control rows when agreed
        here (None: rolled forward while forming, a quiet commit). Raises
        :class:`trainer.errors.GenerationBroken` when the job clips and the norm is missing."""
        m, w = self.m, self.m.w
        job = w.job
        if self.pack is not None and pack is not None:
            clip = None
            if job.grad_clip is not None:
                if norm is None:
                    raise GenerationBroken(f"wave {wv.wave}: no gradient norm to clip by")
                clip = clip_coefficient(norm, job.grad_clip)
            self.pending.pop(0)
            self.pack.apply(pack, job.optimizer, [p.deltas for p in self.pending if p.deltas],
                            clip=clip)
        else:
            self.pending.pop(0)
        ids = wv.ids if self.slot is not None and self.slot[1] == 0 else []
        wv.local = wv.reduced = wv.deltas = None
        self.history = [*self.history[-self.ps.staleness - 1:], wv]
        if rows is None:
            m.commit(Commit(wv.total, ids=ids, quiet=True))
            return
        assert m.plan is not None and self.index is not None
        loss = float(rows[:, agree.LOSS].sum()) / max(1.0, float(rows[:, agree.LOSS_N].sum()))
        newest = int(rows[:, agree.LATEST].max())
        if newest > m.plan.generation and self.stop_at is None:
            self.stop_at, self.newest = wsp.stop_wave(wv.wave, self.ps.staleness), newest
        me = rows[m.rank]
        m.commit(Commit(wv.total, loss, ids, {
            "batch": len(wv.ids), "compute_s": round(float(me[agree.BUSY]), 6),
            "wait_s": round(float(me[agree.WALL] - me[agree.BUSY]), 6),
            "slot": list(self.slot) if self.slot else None, "layers": [self.lo, self.hi],
            "resident": list(self.index.resident(job.optimizer, w.runtime.device)),
            **({"grad_norm": norm} if norm is not None else {})},
            duties=Duties(snapshot=float(rows[:, agree.SNAP].max()) > 0,
                          export=float(rows[:, agree.EXPORT].max()) > 0)))
