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
  at the same wave; an epoch end is a barrier (every wave applied), and the evaluation
  gathers the same way.
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
* **Ends.** The data's end, ``Job.max_steps`` or the run's ``--until-steps``: no wave
  starts beyond the first of them.

Rule for callers: as :class:`~trainer.worker.modes.base.Mode`; the job's model must be an
``nn.Sequential`` and ``Job.pipeline`` a :class:`trainer.pipeline.PipelineSettings`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trainer.collective import groups
from trainer.collective.step import lowered_cap, micro_bounds
from trainer.data.sampler import CursorState
from trainer.errors import (BadState, ControlLost, ControlTimeout, GenerationBroken, LayoutError,
                            Malformed, SnapshotError, StateLost)
from trainer.pipeline import agree, complete, partition, placement, profile, wsp
from trainer.pipeline import table as tb
from trainer.pipeline.agree import Agreement
from trainer.pipeline.backups import Backups, backup_peers
from trainer.pipeline.moves import GATHER_TAG, HANDOVER_TAG, MOVE_TAG, Moved, run_moves
from trainer.pipeline.runner import Micro, StageRunner
from trainer.pipeline.schedule import schedule
from trainer.pipeline.settings import PipelineSettings
from trainer.pipeline.stagestate import ModelIndex, StagePack, whole_checksum
from trainer.protocol import messages as mb
from trainer.state import codec
from trainer.state import snapshot as snap
from trainer.worker.modes.base import PIPELINE_LACKS, Commit, Duties, Transferred, lacking

if TYPE_CHECKING:
    from trainer.worker.member import Member

log = logging.getLogger(__name__)

OPTIMIZER_SLOTS = {"SGD": 1, "Adagrad": 1, "RMSprop": 2, "Adadelta": 2}  # else 2 (Adam's)


@dataclass
class _Wave:
    """A wave this member started and has not applied."""

    wave: int
    cursor: CursorState
    total: int
    ids: list[int]  # the samples of this member's pack at stage 0 (recorded when applied)
    deltas: list[torch.Tensor] | None = None  # this member's own buffer changes
    cover: tuple[int, ...] = ()  # the micro-batches this member's pack covers
    local: torch.Tensor | None = None  # its pack before the reduction (kept for a failure)
    loss: float = 0.0  # the last stage's loss sum over its pack's samples, and how many
    loss_n: int = 0
    parts: tuple[tuple[int, list[int]], ...] = ()  # (member id, ids) of every stage-0 pack
    reduced: torch.Tensor | None = None  # the stage's reduced pack, when kept (not agreed)


@dataclass
class _Forming:
    """What :meth:`PipelineMode.transfer_state` leaves for :meth:`PipelineMode.prepare`."""

    rows: list[tb.Row]
    target: int
    end: int
    lost: int
    missing: bool


class PipelineMode:
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
        self.runner: StageRunner | None = None
        self.pack: StagePack | None = None
        self.agree: Agreement | None = None
        self.pending: list[_Wave] = []
        self.ccursor = CursorState()
        self.stop_at: int | None = None
        self.newest = 0
        self.kept: dict[int, _Wave] = {}  # started, not agreed, kept through a failure
        self.completion: dict[int, complete.WavePlan] = {}
        self.history: list[_Wave] = []  # the newest waves applied (the dead's records)
        self.backups: Backups | None = None
        self.backup_kept: dict[int, tuple[torch.Tensor, float, int]] = {}
        self._forming: _Forming | None = None
        self.caps: dict[str, int] = {}  # every member's samples per pass (agreed; none: no cap)

    # -- setup ------------------------------------------------------------------------------

    def problem(self) -> str | None:
        return self._problem or lacking(self.m.w.job, PIPELINE_LACKS, "pipeline")

    def _settings(self) -> partition.Settings:
        job, ps = self.m.w.job, self.ps
        slots = OPTIMIZER_SLOTS.get(type(job.optimizer).__name__, 2)
        return partition.Settings(ps.stages, ps.micro_batch, ps.schedule, slots,
                                  max(1, -(-job.global_batch // ps.micro_batch)))

    def is_head(self) -> bool:
        return self.layout is not None and self.layout.vws[0][0] == self.m.rank

    def drop(self) -> None:
        if self.agree is not None:
            self.agree.stop()
        if self.sgroup is not None:
            self.sgroup.abort()
            groups.bury(self.sgroup)
            self.sgroup = None
        self.runner = None

    def close(self) -> None:
        if self.agree is not None:
            self.agree.stop()

    # -- forming a generation ---------------------------------------------------------------

    def transfer_state(self) -> Transferred:
        """The table, the roll forward to the agreed wave, the layout and the moves (module
        docstring). Raises :class:`trainer.errors.StateLost` (layers nobody holds, no
        snapshot) and :class:`trainer.errors.GenerationBroken`."""
        m, w = self.m, self.m.w
        plan, rank = m.plan, m.rank
        assert plan is not None and m.group is not None and self.index is not None
        gen, world = plan.generation, len(plan.members)
        n_layers = len(self.index)
        step = w.state.progress.step
        if m.fresh and rank == 0 and plan.resume:
            self._place_whole(placement.HOST)  # then loaded whole
            m.resume(plan)  # the whole state: this member holds every layer
            self.lo, self.hi = 0, n_layers
        elif rank == 0 and plan.fresh_start and step == 0 and not self.index.released():
            self.lo, self.hi = 0, n_layers  # the freshly built model
            m.fresh = False
        old = self.agree
        if old is not None:
            old.stop()
            old.join(2.0)
        step = w.state.progress.step
        started = step + len(self.pending)
        reach, agreed = self._kept(old)
        window = 2 * (self.ps.staleness + 1)  # own: D + 1 started; backups: see Backups.held
        dims = (self.ps.stages, n_layers, window, self._settings().max_micro)
        backup, self.backup_kept = (self.backups.held(step, window) if self.backups is not None
                                    else ((complete.Kept(),) * window, {}))
        self.backups = None
        mine = tb.Row(w.prior, self.memory, self.lo, self.hi, step, reach, agreed, started,
                      m.fresh, self.slot, self.layout_gen, self.bounds, *self.measured,
                      kept=self._kept_waves(old), backup=backup, cap=w.runtime.micro_cap or 0)
        table = torch.zeros(world, tb.width(*dims), dtype=torch.float64)
        table[rank] = tb.encode(mine, *dims)
        groups.allreduce(m.group.ctl, table, m.abort)
        rows = tb.decode(table, *dims)
        self.caps = {mid: row.cap for mid, row in zip(plan.members, rows, strict=True)
                     if row.cap > 0}
        target = tb.agreed_wave(rows)
        self._roll_forward(old, target)
        self.completion = {}
        end = max([target, *(r.started for r in rows if not r.fresh)])
        lost = end - target  # every started wave is computed again, unless completed
        self.agree = None
        costs = tb.costs(rows, self.index.param_bytes())
        layout = None if costs is None else partition.decide(
            [partition.Candidate(r, row.speed, row.memory, row.slot)
             for r, row in enumerate(rows)], costs, self._settings(), tb.hint(rows))
        self.layout = layout
        self._forming = _Forming(rows, target, end, lost, False)
        if layout is None:
            self.slot, self.runner, self.pack = None, None, None
            log.warning("generation %d: no layout of %d stages fits these %d members' memory; "
                        "waiting for more members", gen, self.ps.stages, world)
            return Transferred()  # the waves lost: prepare() counts them
        holdings = [tb.holding(r, row, target) for r, row in enumerate(rows)]
        moves, missing = partition.transfers(holdings, layout, target, self.index.param_bytes())
        if missing:
            target, moves = self._from_snapshot(layout, missing)
            lost = max(0, started - target) if started else 0
            self.kept, self.history = {}, []  # every wave after the snapshot is undone
            self._forming = _Forming(rows, target, end, lost, True)
        moved = self._move(moves, target, MOVE_TAG)
        return Transferred(0, moved.source or 0, moved.nbytes)

    def prepare(self) -> int:
        """This member's slot, stage group, runner and pack; the records of the dead; the
        waves to complete; the backups. Returns the waves of work lost."""
        m, w, f = self.m, self.m.w, self._forming
        plan = m.plan
        assert plan is not None and f is not None
        self._forming = None
        lost = f.lost
        if self.layout is not None:
            self._take_slot(self.layout)
            if not f.missing:
                for part in complete.records_for_the_dead(
                        [(wv.wave, wv.cursor.epoch, bool(wv.ids), wv.parts)
                         for wv in self.history],
                        {*plan.members, *plan.drained}, f.target, self.ps.staleness):
                    m.record_samples(part.wave, part.epoch, part.ids, part.member)
                lost = self._plan_completion(f.rows, self.layout, f.target, f.end)
            step = w.state.progress.step
            self.backups = Backups(
                m.group.pg if m.group is not None else None,
                (backup_peers(self.layout, self.slot, self.ps.staleness)
                 if self.pack is not None else None),
                numel=self.pack.numel if self.pack is not None else 0,
                max_micro=self._settings().max_micro, staleness=self.ps.staleness,
                device=w.runtime.device, start=step, abort=m.abort)
        self.layout_gen = plan.generation
        self.ccursor, self.stop_at, self.newest = w.state.progress.cursor, None, plan.generation
        return lost

    def epoch_ended(self, epoch: int) -> None:
        """Nothing: the stages' replicas are compared when a generation forms."""

    def describe(self) -> str:
        return f": slot {self.slot}, layers {self.lo}..{self.hi - 1}"

    def _kept(self, old: Agreement | None) -> tuple[int, int]:
        """``(reach, agreed)``: how far this member can roll forward with the reduced packs it
        kept, and the newest wave count agreed here."""
        step = self.m.w.state.progress.step
        if old is None:
            return step, step
        reach = step
        while reach < step + len(self.pending) and (
                self.hi <= self.lo or old.reduced.get(reach) is not None):
            reach += 1
        return reach, max(step, old.newest + 1)

    def _kept_waves(self, old: Agreement | None) -> tuple[complete.Kept, ...]:
        """What this member kept of each wave it started (wave ``step + i`` at ``i``)."""
        held = old is not None and self.hi > self.lo
        return tuple(complete.Kept(wv.cover, wv.local is not None,
                                   held and old.reduced.get(wv.wave) is not None)
                     for wv in self.pending)

    def _roll_forward(self, old: Agreement | None, target: int) -> None:
        """Apply the kept reduced packs up to ``target`` (the newest wave agreed anywhere);
        keep what this member computed of every later wave (its own pack, and its stage's
        reduced pack where that reduction completed) for :meth:`_plan_completion`. A member
        that cannot reach it stops holding its layers."""
        progress = lambda: self.m.w.state.progress.step  # noqa: E731
        while old is not None and progress() < target and self.pending:
            pack = old.reduced.get(progress())
            if self.hi > self.lo and pack is None:
                break
            self._commit(self.pending[0], pack, None)
        step = progress()
        if step != target and self.hi > self.lo:
            log.warning("layers %d..%d are behind (step %d, agreed %d): taking them from a "
                        "peer", self.lo, self.hi - 1, step, target)
            self.lo = self.hi = 0
        self.kept = {}
        self.backup_kept = {wave: b for wave, b in self.backup_kept.items()
                            if step == target <= wave}
        if step == target:
            for wv in self.pending:
                if old is not None and self.hi > self.lo:
                    wv.reduced = old.reduced.get(wv.wave)
                self.kept[wv.wave] = wv
        self.pending.clear()
        if self.pack is not None:
            self.pack.restore()

    def _plan_completion(self, rows: list[tb.Row], layout: partition.Layout, target: int,
                         end: int) -> int:
        """The waves ``target .. end - 1`` started before the failure and not agreed are
        completed in this generation from what the survivors kept
        (:func:`trainer.pipeline.complete.plan`). Returns the waves of work lost."""
        w = self.m.w
        job = w.job
        sizes = partition.wave_micro_sizes(w.state.progress.cursor, end - target, len(job),
                                           job.global_batch, w.runtime.min_batch,
                                           self.ps.micro_batch)
        done = complete.plan(tb.holders(rows, target), layout, target, end, sizes)
        self.completion = {wp.wave: wp for wp in done.waves}
        if end > target:
            log.warning("waves %d..%d were started and not agreed: %s", target, end - 1,
                        complete.describe(done))
        return done.lost

    def _from_snapshot(self, layout: partition.Layout, missing: tuple[int, ...]
                       ) -> tuple[int, tuple[partition.Transferred, ...]]:
        """Layers ``missing`` are held by nobody: every member rolls back to the newest
        durable snapshot (rank 0 loads it and sends it on). Raises
        :class:`trainer.errors.StateLost` when there is none."""
        m = self.m
        assert m.plan is not None and m.group is not None and self.index is not None
        found = torch.zeros(2, dtype=torch.float64)
        if m.rank == 0:
            try:
                raw = m.store.peek([mb.SNAPSHOT])[0]
                if raw:
                    manifest = snap.Manifest.parse(raw)
                    tree = snap.fetch(m.store, manifest)
                    self._place_whole(placement.HOST)  # then loaded whole
                    m.w.state.load(tree)
                    found[:] = torch.tensor([1.0, manifest.step])
            except (ValueError, KeyError, SnapshotError, BadState) as e:
                log.error("the durable snapshot cannot be used: %s", e)
        groups.allreduce(m.group.ctl, found, m.abort)
        if found[0] == 0:
            raise StateLost(
                f"layers {missing[0]}..{missing[-1]} are held by no member left (every "
                "replica of a stage was lost) and there is no durable snapshot; run more than "
                "one virtual worker or keep snapshots")
        step = int(found[1])
        log.warning("layers %d..%d were lost with their last holders: every member rolls "
                    "back to the snapshot of step %d", missing[0], missing[-1], step)
        self.lo, self.hi = (0, len(self.index)) if m.rank == 0 else (0, 0)
        holdings = [partition.Holding(r, 0, len(self.index) if r == 0 else 0,
                                      step if r == 0 else -1)
                    for r in range(len(m.plan.members))]
        moves, _ = partition.transfers(holdings, layout, step, self.index.param_bytes())
        return step, moves

    def _move(self, moves: tuple[partition.Transferred, ...], step: int, base: int) -> Moved:
        """Run the moves this member is in (:func:`trainer.pipeline.moves.run_moves`); a
        forming move also brings the shared state (a joiner's step, cursor and metrics)."""
        m, w = self.m, self.m.w
        assert m.group is not None and m.plan is not None and self.index is not None
        sch, opt = w.job.scheduler, w.job.optimizer
        meta = w.state.meta()
        if sch is not None:  # and the hyperparameters it sets (a stage's move carries only
            meta["scheduler"] = sch.state_dict()  # its layers' per-parameter state)
            meta["groups"] = [{k: list(v) if isinstance(v, tuple) else v
                               for k, v in g.items() if k != "params"
                               and isinstance(v, (int, float, tuple))}
                              for g in opt.param_groups]
        moved = run_moves(m.group.ctl, m.rank, moves, index=self.index,
                          optimizer=w.job.optimizer, device=w.runtime.device,
                          meta=meta, step=step, job=m.plan.job, base=base,
                          abort=m.abort,
                          slot_of=self.layout.slot_of if self.layout is not None else None)
        if moved.meta is not None:
            w.state.load_meta(moved.meta)
            if sch is not None:  # the scheduler steps with every commit: it travels as the
                try:  # progress does (a joiner's would restart its warmup)
                    sch.load_state_dict(moved.meta["scheduler"])
                    groups_ = moved.meta["groups"]
                    if len(groups_) != len(opt.param_groups):
                        raise ValueError(f"{len(groups_)} parameter groups, not "
                                         f"{len(opt.param_groups)}")
                    for g, got in zip(opt.param_groups, groups_, strict=True):
                        for k, v in got.items():
                            g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
                except (KeyError, TypeError, ValueError) as e:
                    raise GenerationBroken(f"the LR scheduler's state received: {e}") from e
        return moved

    def _take_slot(self, layout: partition.Layout) -> None:
        """Hold this member's layers of ``layout`` (the moves brought the missing ones), form
        its stage group and build its runner and pack."""
        m, w = self.m, self.m.w
        job, plan, rt = w.job, m.plan, w.runtime
        assert plan is not None and m.group is not None and self.index is not None
        self.slot = layout.slot_of(m.rank)
        self.bounds = layout.bounds
        self.lo, self.hi = layout.layers_of(m.rank)
        self._release()  # only this stage on the device, with its optimiser state
        self.runner = self.pack = None
        if self.slot is None:
            return
        v, j = self.slot
        k, n_vw = layout.stages, len(layout.vws)
        if n_vw > 1:
            self.sgroup = groups.form_group(
                m.store, plan.generation, v, n_vw, w.cfg.collective_timeout_s, m.abort,
                backend=plan.backend, hostname=w.cfg.ring_host or m.store.local_address,
                sub=f"s{j}/")
        row = layout.vws[v]
        self.runner = StageRunner(
            torch.nn.Sequential(*self.index.modules[self.lo:self.hi]), pg=m.group.pg,
            prev=row[j - 1] if j > 0 else None, next_=row[j + 1] if j < k - 1 else None,
            loss_fn=job.loss_fn, device=rt.device, precision=job.precision,
            slowdown=w.cfg.slowdown, fixed_shapes=self.ps.fixed_shapes,
            step=lambda: w.state.progress.step)
        self.pack = StagePack(self.index.params(self.lo, self.hi),
                              self.index.buffers(self.lo, self.hi))

    def checksum(self) -> str:
        """A checksum of the whole model over every stage (VW 0's replicas), the same on every
        member when every stage's replicas are equal; else this member's own differs."""
        m = self.m
        assert m.plan is not None and m.group is not None and self.index is not None
        t = torch.zeros(len(m.plan.members), 2, dtype=torch.int64)
        mine = ""
        if self.slot is not None:
            mine = self.index.checksum(m.w.job.optimizer, self.lo, self.hi)
            if m.w.job.scheduler is not None:  # the same on every member: in every digest
                mine = codec.checksum({"stage": mine,
                                       "scheduler": m.w.job.scheduler.state_dict()})
            t[m.rank] = torch.tensor([self.slot[1] + 1, int(mine[:15], 16)])
        groups.allreduce(m.group.ctl, t, m.abort)
        return whole_checksum(t.tolist(), mine)

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
        limit = w.job.step_limit(w.cfg.until_steps)
        if stop or self.ccursor.epoch >= w.job.epochs or (limit is not None and wave >= limit):
            if not self._apply_through(applied() + len(self.pending)):
                return gen
            if stop:
                self._handover()
            return self.newest if stop else gen
        epoch = self.ccursor.epoch
        self._compute(wave)
        if self.ccursor.epoch != epoch:  # an epoch end is a barrier: everything applied
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
        self.pending.append(_Wave(wave, cur, total, mine, parts=parts))
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
                                   lambda: m.broken(gen))
        return self.agree

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
            self._commit(self.pending[0], got.pack, got.rows)
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

    def _commit(self, wv: _Wave, pack: torch.Tensor | None, rows: torch.Tensor | None) -> None:
        """Apply wave ``wv`` (its reduced pack) and commit it; ``rows``: its control rows
        when agreed here (None: rolled forward while forming, a quiet commit)."""
        m, w = self.m, self.m.w
        job = w.job
        self.pending.pop(0)
        if self.pack is not None and pack is not None:
            self.pack.apply(pack, job.optimizer, [p.deltas for p in self.pending if p.deltas])
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
            "resident": list(self.index.resident(job.optimizer, w.runtime.device))},
            duties=Duties(snapshot=float(rows[:, agree.SNAP].max()) > 0,
                          export=float(rows[:, agree.EXPORT].max()) > 0)))

    # -- the whole model on the head: evaluation, snapshots, the trained model -------------------

    @contextmanager
    def whole_model(self) -> Iterator[bool]:
        """VW 0's stages send their layers to the head, which holds the whole model and
        optimiser state inside the context (yields True there) and only its own layers
        again after it."""
        here = self._gather()
        try:
            yield here
        finally:
            if here:
                self._release()

    def _gather(self) -> bool:
        m, layout = self.m, self.layout
        if layout is None or m.rank not in layout.vws[0] or self.index is None:
            return False
        moves = partition.gather(layout)
        if self.is_head():  # the whole model in one place, the others' layers received there
            self._place_whole(placement.gather_target(
                self.index.param_bytes(), self.lo, self.hi, self._settings().optimizer_slots,
                self.memory))
        if moves:
            self._move(moves, m.w.state.progress.step, GATHER_TAG)
        return self.is_head()
    def _release(self) -> None:
        """Keep only this member's layers (:meth:`trainer.pipeline.stagestate.ModelIndex.
        hold`)."""
        assert self.index is not None
        w = self.m.w
        self.index.hold(w.job.optimizer, self.lo, self.hi, w.runtime.device)

    def _place_whole(self, where: str) -> None:
        assert self.index is not None
        w = self.m.w
        self.index.place_whole(where, w.runtime.device, w.job.optimizer)
