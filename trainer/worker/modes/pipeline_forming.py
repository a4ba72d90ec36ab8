"""The pipeline mode's moves of layers: forming a generation, and the whole model on the head.

Design. :class:`PipelineForming` is the half of :class:`trainer.worker.modes.pipeline.
PipelineMode` that moves layers and the shared state between members (the other half, the
waves, is in :mod:`trainer.worker.modes.pipeline`; the mode's docstring tells the whole):

* **forming** (:meth:`~PipelineForming.transfer_state`, :meth:`~PipelineForming.prepare`):
  the table all-reduced, the roll forward to the newest wave agreed anywhere, the layout, the
  moves (a stage's layers with their per-parameter optimiser state, and the state's plain
  part: :meth:`trainer.state.training.TrainingState.meta`, the scheduler's state and the
  hyperparameters it sets included), the roll back to a durable snapshot when layers are
  held by nobody, this member's slot, stage group, runner and pack, and the checksum over
  every stage;
* **the whole model on the head** (:meth:`~PipelineForming.whole_model`): VW 0's stages
  gather on the head for an evaluation, a snapshot or the trained model: the committed
  state of the wave just applied (each stage's buffers without its own changes of the waves
  in flight).

The two halves share the attributes :class:`PipelineMode` sets in its ``__init__`` (declared
below) and the waves this member started (:class:`StartedWave`); the forming half calls the
wave half's :meth:`_commit` to roll forward.

Rule for callers: the skeleton calls these through :class:`PipelineMode` only; every member
of a generation calls the same moves in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainer.collective import groups
from trainer.data.sampler import CursorState
from trainer.errors import BadState, GenerationBroken, SnapshotError, StateLost
from trainer.pipeline import complete, partition, placement
from trainer.pipeline import table as tb
from trainer.pipeline.agree import Agreement
from trainer.pipeline.backups import Backups, backup_peers
from trainer.pipeline.moves import GATHER_TAG, MOVE_TAG, Moved, run_moves
from trainer.pipeline.runner import StageRunner
from trainer.pipeline.settings import PipelineSettings
from trainer.pipeline.stagestate import ModelIndex, StagePack, whole_checksum
from trainer.protocol import messages as mb
from trainer.state import codec
from trainer.state import snapshot as snap
from trainer.worker.modes.base import Transferred

if TYPE_CHECKING:
    from trainer.worker.member import Member

log = logging.getLogger(__name__)

OPTIMIZER_SLOTS = {"SGD": 1, "Adagrad": 1, "RMSprop": 2, "Adadelta": 2}  # else 2 (Adam's)


@dataclass
class StartedWave:
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
class Forming:
    """What :meth:`PipelineForming.transfer_state` leaves for :meth:`PipelineForming.prepare`."""

    rows: list[tb.Row]
    target: int
    end: int
    lost: int
    missing: bool


class PipelineForming:
    """The moves of :class:`trainer.worker.modes.pipeline.PipelineMode` (module docstring)."""

    # set by PipelineMode.__init__
    m: Member
    ps: PipelineSettings
    index: ModelIndex | None
    memory: float
    measured: tuple[list[float], list[float]]
    lo: int
    hi: int
    slot: tuple[int, int] | None
    bounds: tuple[int, ...] | None
    layout_gen: int
    layout: partition.Layout | None
    sgroup: groups.Group | None
    vgroup: groups.Group | None  # with grad_clip: this member's VW (its total norm)
    runner: StageRunner | None
    pack: StagePack | None
    agree: Agreement | None
    pending: list[StartedWave]
    ccursor: CursorState
    stop_at: int | None
    newest: int
    kept: dict[int, StartedWave]
    completion: dict[int, complete.WavePlan]
    history: list[StartedWave]
    backups: Backups | None
    backup_kept: dict[int, tuple[torch.Tensor, float, int]]
    _forming: Forming | None
    caps: dict[str, int]

    def _settings(self) -> partition.Settings:
        job, ps = self.m.w.job, self.ps
        slots = OPTIMIZER_SLOTS.get(type(job.optimizer).__name__, 2)
        return partition.Settings(ps.stages, ps.micro_batch, ps.schedule, slots,
                                  max(1, -(-job.global_batch // ps.micro_batch)),
                                  keep_within=ps.keep_within)

    def is_head(self) -> bool:
        return self.layout is not None and self.layout.vws[0][0] == self.m.rank

    def _commit(self, wv: StartedWave, pack: torch.Tensor | None,
                rows: torch.Tensor | None, norm: float | None = None) -> None:
        """The wave half's (:meth:`trainer.worker.modes.pipeline.PipelineMode._commit`)."""
        raise NotImplementedError

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
        self._forming = Forming(rows, target, end, lost, False)
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
            self._forming = Forming(rows, target, end, lost, True)
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
            self._commit(self.pending[0], pack, None, old.norms.get(progress()))
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
        meta = w.state.meta()  # the progress, and the scheduler with its hyperparameters
        moved = run_moves(m.group.ctl, m.rank, moves, index=self.index,
                          optimizer=w.job.optimizer, device=w.runtime.device,
                          meta=meta, step=step, job=m.plan.job, base=base,
                          abort=m.abort,
                          slot_of=self.layout.slot_of if self.layout is not None else None)
        if moved.meta is not None:  # the scheduler steps with every commit: it travels as
            try:  # the progress does (a joiner's would restart its warmup)
                w.state.load_meta(moved.meta)
            except (KeyError, TypeError, ValueError) as e:
                raise GenerationBroken(f"the shared state received: {e}") from e
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
        if w.job.grad_clip is not None and k > 1:  # the VW's total norm: a scalar per stage
            self.vgroup = groups.form_group(
                m.store, plan.generation, j, k, w.cfg.collective_timeout_s, m.abort,
                backend=plan.backend, hostname=w.cfg.ring_host or m.store.local_address,
                sub=f"v{v}/")
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

    # -- the whole model on the head: evaluation, snapshots, the trained model -------------------

    @contextmanager
    def whole_model(self) -> Iterator[bool]:
        """VW 0's stages send their layers to the head, which holds the whole model and
        optimiser state inside the context (yields True there) and only its own layers
        again after it. What is gathered is the committed state of the newest applied wave:
        each stage's buffers as committed with it, without this member's own changes of the
        waves in flight (D > 0), which its live buffers hold again after the context."""
        pack, layout = self.pack, self.layout
        sends = layout is not None and self.m.rank in layout.vws[0]
        with pack.committed_in_place() if pack is not None and sends else nullcontext():
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
