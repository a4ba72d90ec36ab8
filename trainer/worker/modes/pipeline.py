"""A member of a pipelined job (HetPipe virtual workers under Wave Synchronous Parallel).

Design. :class:`PipelineMember` is a :class:`trainer.worker.member.Member`: the same admission,
generations, roll calls, drains, heartbeats and reports; what differs is inside a
generation.

* **Forming.** After the generation's group forms, every member fills its row of a table
  (:mod:`trainer.pipeline.table`) and the table is all-reduced. From it, every member
  computes the same things: the newest wave agreed anywhere (survivors roll forward to it
  from the reduced packs they kept, so a failure loses only the waves not yet agreed), the
  layout (:func:`trainer.pipeline.partition.decide`: virtual workers, slots, boundaries),
  and the moves (:func:`~trainer.pipeline.partition.transfers`): a replacement receives its
  stage's layers from the same stage of another virtual worker, point to point, encoded by
  :mod:`trainer.state.codec` and checked. Layers nobody holds any more (a stage of the only
  virtual worker) come from the newest durable snapshot: every member rolls back to it;
  without one the job fails with that reason. Each stage's members then form their own
  group (``g<n>/s<j>/``) for the stage's reduction, and a last small reduction gives every
  member a checksum over all stages (equal everywhere when every stage's replicas are).
* **Waves.** A wave is one global batch: split into fixed-size micro-batches, given to the
  virtual workers by their rates (:func:`~trainer.pipeline.partition.split_micro`), each
  stage runs its schedule (:mod:`trainer.pipeline.runner`), packs its gradients and posts
  them to its stage group; :class:`trainer.pipeline.agree.Agreement` then joins the control
  reduction. Waves are applied in order, identically on every replica, once agreed; with the
  staleness bound D, wave ``w`` starts after waves ``< w - D`` are applied
  (:mod:`trainer.pipeline.wsp`). An epoch end is a barrier (every wave applied), then VW 0's
  stages send their layers to its stage 0 (the *head*), which evaluates; the head also
  takes the durable snapshots (it announces them in a wave's control row, so VW 0 gathers
  at the same wave) and writes the trained model.
* **Changes.** A newer generation seen in the control reduction of wave ``t`` stops every
  member after wave ``t + D``, every started wave applied: a join or a drain loses nothing.
  After a failure the next generation completes the waves started and not agreed anywhere
  from the packs the survivors kept (:mod:`trainer.pipeline.complete`): only the micro-batches
  no kept pack covers run again. When a VW may hold more than one wave's work unreduced
  (D > 0), each member also sends its packs to the same stage of the next VW as backups.

Rule for callers: as for :class:`trainer.worker.member.Member`; the job's model must be an
``nn.Sequential`` and ``Job.pipeline`` a :class:`trainer.pipeline.PipelineSettings`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from trainer.collective import groups
from trainer.data.sampler import CursorState, epoch_order
from trainer.errors import (BadState, ControlLost, ControlTimeout, GenerationBroken, LayoutError,
                            Malformed, SnapshotError, StateLost)
from trainer.pipeline import agree, complete, partition, placement, profile, wsp
from trainer.pipeline import table as tb
from trainer.pipeline.agree import Agreement
from trainer.pipeline.runner import Micro, StageRunner, transport
from trainer.pipeline.schedule import schedule
from trainer.pipeline.settings import PipelineSettings
from trainer.pipeline.stagestate import ModelIndex, StagePack, bundle, load
from trainer.protocol import messages as mb
from trainer.state import codec as st
from trainer.state import snapshot as snap
from trainer.worker.member import Member, MemberOutcome

log = logging.getLogger(__name__)

MOVE_TAG, GATHER_TAG, HANDOVER_TAG = 1 << 30, (1 << 30) | (1 << 24), (1 << 30) | (2 << 24)
BACKUP_TAG = (1 << 30) | (3 << 24)  # + wave % 64
_POLL = datetime.timedelta(milliseconds=1)
# (above every wave's tags)
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


class PipelineMember(Member):
    """One membership of a worker in a pipelined job (see the module docstring)."""

    def __init__(self, w: Any, store: Any, member_id: int, hb: Any) -> None:
        super().__init__(w, store, member_id, hb)
        job = w.job
        self.ps: PipelineSettings = job.pipeline
        self.setup_error: str | None = None
        self.index: ModelIndex | None = None
        try:
            if not isinstance(job.pipeline, PipelineSettings):
                raise LayoutError("Job.pipeline must be a trainer.pipeline.PipelineSettings")
            if job.precision == "fp16":
                raise LayoutError("precision fp16 is not supported by virtual workers; use "
                                  "bf16 or fp32")
            if self.ps.micro_batch < w.min_batch:
                raise LayoutError(f"micro_batch {self.ps.micro_batch} is below the minimum "
                                  f"local batch {w.min_batch}")
            self.index = ModelIndex(job.model, job.optimizer)
            self.measured = self._measure()
        except (LayoutError, ValueError) as e:
            self.setup_error = f"job {w.cfg.job}: {e}"
        self.memory = self._memory()
        self.lo = self.hi = 0  # the layers this member holds, current at w.step
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
        self.source = 0  # the rank this member last received state from
        self._orders: dict[int, torch.Tensor] = {}
        self.kept: dict[int, _Wave] = {}  # started, not agreed, kept through a failure
        self.completion: dict[int, complete.WavePlan] = {}
        self.history: list[_Wave] = []  # the newest waves applied (the dead's records)
        self.backups_in: dict[int, tuple[torch.Tensor, Any]] = {}  # posted receives
        self.backups_out: dict[int, tuple[torch.Tensor, Any]] = {}  # posted sends
        self.backup_kept: dict[int, tuple[torch.Tensor, float, int]] = {}
        self._recv_upto = 0
        self._snap_at = (-1, time.monotonic())

    # -- setup ------------------------------------------------------------------------------

    def _measure(self) -> tuple[list[float], list[float]]:
        job, w = self.w.job, self.w
        got = profile.costs(job.model)
        if got is None:
            log.warning("the model's layers were not timed before joining (build the job's "
                        "settings with trainer.pipeline.virtual_workers); timing them now")
            ids = torch.arange(min(len(job), self.ps.micro_batch))
            got = profile.measure(job.model, w.batch(ids)[0], device=w.device,
                                  precision=job.precision)
            job.model.zero_grad(set_to_none=True)
        seconds, act = got
        if self.ps.layer_seconds is not None:
            if len(self.ps.layer_seconds) != len(seconds):
                raise LayoutError(f"layer_seconds has {len(self.ps.layer_seconds)} entries; "
                                  f"the model has {len(seconds)} layers")
            seconds = list(self.ps.layer_seconds)
        return seconds, act

    def _memory(self) -> float:
        if self.ps is not None and getattr(self.ps, "memory_bytes", None):
            return float(self.ps.memory_bytes)
        if self.w.device.type == "cuda":
            return float(torch.cuda.get_device_properties(self.w.device).total_memory)
        return math.inf

    def live(self) -> MemberOutcome:
        if self.setup_error is not None:
            return self._fail(self.setup_error)
        try:
            return super().live()
        except StateLost as e:  # raised while forming: the job cannot go on
            return self._fail(f"job {self.w.cfg.job}: the job is lost: {e}")
        finally:
            if self.agree is not None:
                self.agree.stop()

    def _fail(self, message: str) -> MemberOutcome:
        log.error("%s", message)
        self.store.set(mb.k_error(self.id), mb.JobFailure(self.w.step, message).to_json())
        self.store.add(mb.ERRORS, 1)
        if self.plan is not None:
            self.store.add(mb.k_broken(self.plan.generation), 1)
        self.w.failure = message
        return MemberOutcome.FAILED

    def _drop_group(self) -> None:
        if self.agree is not None:
            self.agree.stop()
        if self.sgroup is not None:
            self.sgroup.abort()
            groups.bury(self.sgroup)
            self.sgroup = None
        self.runner = None
        super()._drop_group()

    # -- forming a generation ---------------------------------------------------------------

    def _settings(self, world: int) -> partition.LayoutSettings:
        job, ps = self.w.job, self.ps
        slots = OPTIMIZER_SLOTS.get(type(job.optimizer).__name__, 2)
        return partition.LayoutSettings(ps.stages, ps.micro_batch, ps.schedule, slots,
                                  max(1, -(-job.global_batch // ps.micro_batch)))

    def _form(self, plan: mb.Plan, rank: int) -> None:
        w, cfg = self.w, self.w.cfg
        gen, world = plan.generation, len(plan.members)
        t0 = time.perf_counter()
        self.store.set(mb.k_forming(gen, self.id), "")
        self.group = groups.form_group(self.store, gen, rank, world, cfg.collective_timeout_s,
                                     lambda: self._broken(gen), backend=plan.backend,
                                     hostname=cfg.ring_host or self.store.local_address)
        self.rank = rank
        abort = lambda: self._broken(gen)  # noqa: E731
        n_layers = len(self.index)
        if self.fresh and rank == 0 and plan.resume:
            self._place_whole(placement.HOST)  # then loaded whole
            self._resume(plan)  # the whole state: this member holds every layer
            self.lo, self.hi = 0, n_layers
        elif rank == 0 and plan.fresh_start and w.step == 0 and not self.index.released():
            self.lo, self.hi, self.fresh = 0, n_layers, False  # the freshly built model
        old = self.agree
        if old is not None:
            old.stop()
            old.join(2.0)
        started = w.step + len(self.pending)
        reach, agreed = self._kept(old)
        window = 2 * (self.ps.staleness + 1)  # own: D + 1 started; backups: see _backups_held
        dims = (self.ps.stages, n_layers, window, self._settings(world).max_micro)
        mine = tb.Row(w.prior, self.memory, self.lo, self.hi, w.step, reach, agreed, started,
                      self.fresh, self.slot, self.layout_gen, self.bounds, *self.measured,
                      kept=self._kept_waves(old), backup=self._backups_held(dims[3]))
        table = torch.zeros(world, tb.width(*dims), dtype=torch.float64)
        table[rank] = tb.encode(mine, *dims)
        groups.allreduce(self.group.ctl, table, abort)
        rows = tb.decode(table, *dims)
        target = tb.agreed_wave(rows)
        self._roll_forward(old, target)
        self.completion = {}
        end = max([target, *(r.started for r in rows if not r.fresh)])
        lost = end - target  # every started wave is computed again, unless completed
        self.agree = None
        costs = tb.costs(rows, self.index.param_bytes())
        layout = None if costs is None else partition.decide(
            [partition.Candidate(r, row.speed, row.memory, row.slot)
             for r, row in enumerate(rows)], costs, self._settings(world), tb.hint(rows))
        self.layout = layout
        nbytes, self.source = 0, 0
        if layout is None:
            self.slot, self.runner, self.pack = None, None, None
            log.warning("generation %d: no layout of %d stages fits these %d members' memory; "
                        "waiting for more members", gen, self.ps.stages, world)
        else:
            holdings = [tb.holding(r, row, target) for r, row in enumerate(rows)]
            moves, missing = partition.transfers(holdings, layout, target,
                                                 self.index.param_bytes())
            if missing:
                target, moves = self._from_snapshot(plan, layout, missing, abort)
                lost = max(0, started - target) if started else 0
                self.kept, self.history = {}, []  # every wave after the snapshot is undone
            nbytes = self._move(moves, target, plan, abort, MOVE_TAG)
            self._take_slot(plan, layout, abort)
            if not missing:
                self._record_for_the_dead(plan, target)
                lost = self._plan_completion(rows, layout, target, end)
            self._start_backups()
            if self._head():
                w.start_snapshots(self.store)
        checksum = self._checksum(abort)
        self.fresh = False
        self.was_member = True
        self.layout_gen = gen
        self.ccursor, self.stop_at, self.newest = w.cursor, None, gen
        report = mb.Formed(checksum, w.step, lost, self.source, nbytes,
                           round((time.perf_counter() - t0) * 1000, 2))
        self.store.set(mb.k_formed(gen, self.id), report.to_json())
        self.store.add(mb.k_formed_count(gen), 1)
        log.info("formed generation %d as rank %d/%d: slot %s, layers %d..%d", gen, rank,
                 world, self.slot, self.lo, self.hi - 1, extra=dataclasses.asdict(report))

    def _kept(self, old: Agreement | None) -> tuple[int, int]:
        """``(reach, agreed)``: how far this member can roll forward with the reduced packs it
        kept, and the newest wave count agreed here."""
        w = self.w
        if old is None:
            return w.step, w.step
        reach = w.step
        while reach < w.step + len(self.pending) and (
                self.hi <= self.lo or old.reduced.get(reach) is not None):
            reach += 1
        return reach, max(w.step, old.newest + 1)

    def _kept_waves(self, old: Agreement | None) -> tuple[complete.Kept, ...]:
        """What this member kept of each wave it started (wave ``step + i`` at ``i``)."""
        held = old is not None and self.hi > self.lo
        return tuple(complete.Kept(wv.cover, wv.local is not None,
                                   held and old.reduced.get(wv.wave) is not None)
                     for wv in self.pending)

    def _backups_held(self, micro: int) -> tuple[complete.Kept, ...]:
        """The backups received of waves ``step .. step + 2D + 1`` (slot ``i``: ``step + i``;
        a member applies agreed waves lazily, up to D + 1 behind what is agreed, and a VW
        starts at most D waves beyond that), each with the micro-batches its pack covers;
        kept in :attr:`backup_kept`."""
        w, out = self.w, []
        self.backup_kept = {}
        for wave in range(w.step, w.step + 2 * (self.ps.staleness + 1)):
            buf, work = self.backups_in.get(wave, (None, None))
            if buf is None or not _received(work):
                out.append(complete.Kept())
                continue
            n = buf.numel() - micro - 2
            flags = buf[n:n + micro].tolist()
            cover = tuple(m for m, f in enumerate(flags) if f > 0)
            self.backup_kept[wave] = (buf[:n], float(buf[n + micro]), int(buf[n + micro + 1]))
            out.append(complete.Kept(cover, True, False))
        self.backups_in = {}
        return tuple(out)

    def _backup_peers(self) -> tuple[int, int] | None:
        """``(from, to)``: the same stage of the previous and the next VW, when this member
        backs up its packs: at D > 0 a VW may hold up to D + 1 finished waves nobody
        reduced (their shares, (D + 1) / V of a wave, would be computed again besides the
        passes in flight, up to two waves in all), so each pack is also sent to the next VW
        as it is computed, and a kill loses at most the passes in flight and the dead VW's
        last finished pack if its backup had not arrived."""
        layout = self.layout
        if layout is None or self.slot is None or self.pack is None:
            return None
        n = len(layout.vws)
        if n < 2 or self.ps.staleness == 0 or self.ps.staleness + 2 >= 64:
            return None  # (the tags tell 64 waves apart)
        v, j = self.slot
        return layout.vws[(v - 1) % n][j], layout.vws[(v + 1) % n][j]

    def _start_backups(self) -> None:
        self.backups_in, self.backups_out = {}, {}
        self._recv_upto = self.w.step
        self._post_backups(self.w.step + self.ps.staleness + 2)

    def _post_backups(self, upto: int) -> None:
        """Post the receives of the previous VW's backups of the waves up to ``upto`` (a VW
        is at most D + 1 waves beyond what this member applied)."""
        peers = self._backup_peers()
        if peers is None:
            return
        n = self.pack.numel + self._settings(len(self.plan.members)).max_micro + 2
        for wave in range(self._recv_upto, upto):
            buf = torch.zeros(n, dtype=torch.float32, device=self.w.device)
            with transport(f"recv from rank {peers[0]}"):
                work = self.group.pg.recv([buf], peers[0], BACKUP_TAG + wave % 64)
            self.backups_in[wave] = (buf, work)
        self._recv_upto = max(self._recv_upto, upto)

    def _send_backup(self, wave: int, flat: torch.Tensor, cover: tuple[int, ...],
                     loss: float, loss_n: int) -> None:
        peers = self._backup_peers()
        if peers is None:
            return
        micro = self._settings(len(self.plan.members)).max_micro
        tail = torch.zeros(micro + 2, dtype=torch.float32, device=flat.device)
        for m in cover:
            tail[m] = 1.0
        tail[micro], tail[micro + 1] = loss, loss_n
        msg = torch.cat([flat, tail])
        with transport(f"send to rank {peers[1]}"):
            work = self.group.pg.send([msg], peers[1], BACKUP_TAG + wave % 64)
        self.backups_out[wave] = (msg, work)
        self._post_backups(wave + self.ps.staleness + 2)

    def _backups_done(self, wave: int) -> None:
        """Wave ``wave`` is applied: its backups (sent and received) are waited for and
        dropped (both were posted: every member computed the wave)."""
        posted = []
        peers = self._backup_peers()
        for got, peer in ((self.backups_out.pop(wave, None), peers[1] if peers else 0),
                          (self.backups_in.pop(wave, None), peers[0] if peers else 0)):
            if got is not None:
                posted.append((got[1], peer))
        if posted:
            groups.wait_posted(posted, lambda: self._broken(self.plan.generation))

    def _roll_forward(self, old: Agreement | None, target: int) -> None:
        """Apply the kept reduced packs up to ``target`` (the newest wave agreed anywhere);
        keep what this member computed of every later wave (its own pack, and its stage's
        reduced pack where that reduction completed) for :meth:`_plan_completion`. A member
        that cannot reach it stops holding its layers."""
        w = self.w
        while old is not None and w.step < target and self.pending:
            pack = old.reduced.get(w.step)
            if self.hi > self.lo and pack is None:
                break
            self._commit(self.pending[0], pack, None)
        if w.step != target and self.hi > self.lo:
            log.warning("layers %d..%d are behind (step %d, agreed %d): taking them from a "
                        "peer", self.lo, self.hi - 1, w.step, target)
            self.lo = self.hi = 0
        self.kept = {}
        self.backup_kept = {wave: b for wave, b in self.backup_kept.items()
                            if w.step == target <= wave}
        if w.step == target:
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
        w, job = self.w, self.w.job
        cur, sizes = w.cursor, []
        for _ in range(target, end):
            total = cur.step_total(len(job), job.global_batch, min_batch=w.min_batch)
            sizes.append(partition.micro_sizes(total, self.ps.micro_batch))
            cur = cur.advance(len(job), total)
        done = complete.plan(tb.holders(rows, target), layout, target, end, sizes)
        self.completion = {wp.wave: wp for wp in done.waves}
        if end > target:
            log.warning("waves %d..%d were started and not agreed: completed from the kept "
                        "packs, %d samples computed before are computed again, %d were in "
                        "flight (%s)", target, end - 1, done.lost_samples,
                        done.in_flight_samples, ", ".join(
                            f"wave {wp.wave}: {len(wp.recompute)} micro-batches again"
                            for wp in done.waves))
        return done.lost

    def _record_for_the_dead(self, plan: mb.Plan, target: int) -> None:
        """A stage-0 member that died may not have applied (nor recorded) the waves the
        survivors rolled forward through: each surviving stage-0 member records the dead
        ones' samples of the newest waves it applied (from ``target - D - 1``, the oldest the
        dead may have missed; a sample recorded twice there is the same wave's, the same
        record, not trained twice)."""
        alive = {*plan.members, *plan.drained}  # a drained member applied every wave
        for wv in self.history:
            if wv.wave < target - self.ps.staleness - 1 or not wv.ids:
                continue
            for mid, ids in wv.parts:
                if mid not in alive and ids:
                    self._record_ids(wv, ids, mid)

    def _from_snapshot(self, plan: mb.Plan, layout: partition.Layout, missing: tuple[int, ...],
                       abort: Any) -> tuple[int, tuple[partition.Transfer, ...]]:
        """Layers ``missing`` are held by nobody: every member rolls back to the newest
        durable snapshot (rank 0 loads it and sends it on). Raises :class:`StateLost` when
        there is none."""
        w = self.w
        found = torch.zeros(2, dtype=torch.float64)
        if self.rank == 0:
            try:
                raw = self.store.peek([mb.SNAPSHOT])[0]
                if raw:
                    manifest = snap.Manifest.parse(raw)
                    tree = snap.fetch(self.store, manifest)
                    self._place_whole(placement.HOST)  # then loaded whole
                    w.load(tree)
                    found[:] = torch.tensor([1.0, manifest.step])
            except (ValueError, KeyError, SnapshotError, BadState) as e:
                log.error("the durable snapshot cannot be used: %s", e)
        groups.allreduce(self.group.ctl, found, abort)
        if found[0] == 0:
            raise StateLost(
                f"layers {missing[0]}..{missing[-1]} are held by no member left (every "
                "replica of a stage was lost) and there is no durable snapshot; run more than "
                "one virtual worker or keep snapshots")
        step = int(found[1])
        log.warning("layers %d..%d were lost with their last holders: every member rolls "
                    "back to the snapshot of step %d", missing[0], missing[-1], step)
        self.lo, self.hi = (0, len(self.index)) if self.rank == 0 else (0, 0)
        holdings = [partition.Holding(r, 0, len(self.index) if r == 0 else 0,
                                      step if r == 0 else -1)
                    for r in range(len(plan.members))]
        moves, _ = partition.transfers(holdings, layout, step, self.index.param_bytes())
        return step, moves

    def _meta(self) -> dict[str, Any]:
        w = self.w
        return {"job": w.fingerprint, "step": w.step, "cursor": [w.cursor.epoch, w.cursor.cursor],
                "samples_done": w.samples_done, "metrics": dict(w.metrics)}

    def _move(self, moves: tuple[partition.Transfer, ...], step: int, plan: mb.Plan,
              abort: Any, base: int) -> int:
        """Run the moves this member is in: post every send, then receive and load (the
        shared state too, when forming: a joiner's step, cursor and metrics), then wait for
        the sends. Returns the bytes sent and received. Raises
        :class:`trainer.errors.GenerationBroken` (a peer failed, or sent a state that is not
        this job's at ``step``)."""
        pg, opt = self.group.ctl, self.w.job.optimizer
        posted, keep, nbytes = [], [], 0
        for i, t in enumerate(moves):
            if t.src == self.rank:
                payload = st.encode(bundle(self.index, opt, t.lo, t.hi, self._meta()))
                head = torch.tensor([payload.numel(), *_digest(payload)], dtype=torch.int64)
                with transport(f"send to rank {t.dst}"):
                    posted += [(pg.send([head], t.dst, base + 2 * i), t.dst),
                               (pg.send([payload], t.dst, base + 2 * i + 1), t.dst)]
                keep += [head, payload]
                nbytes += payload.numel()
        for i, t in enumerate(moves):
            if t.dst != self.rank:
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
                if _digest(data) != head[1:].tolist():
                    raise BadState("digest differs from the one announced")
                if base != GATHER_TAG:  # layers this member will hold: onto its device
                    self.index.place(placement.only(len(self.index), t.lo, t.hi,
                                                    placement.DEVICE), self.w.device, opt)
                meta = load(self.index, opt, st.decode(data), t.lo, t.hi)
                if meta.get("step") != step or (plan.job and meta.get("job") != plan.job):
                    raise BadState(f"state of step {meta.get('step')!r} of another job, "
                                      f"or not the agreed step {step}")
                if base == MOVE_TAG:  # a gather or a handover carries the sender's
                    self._load_meta(meta)  # metrics, older than the head's own
                self.source = t.src
                if t.hi > t.lo and base == MOVE_TAG:
                    log.info("received layers %d..%d from rank %d (slot %s)", t.lo, t.hi - 1,
                             t.src, self.layout.slot_of(t.src) if self.layout else None)
            except (BadState, KeyError, TypeError, ValueError) as e:
                raise GenerationBroken(f"stage state from rank {t.src} rejected: {e}") from e
        groups.wait_posted(posted, abort)
        return nbytes

    def _load_meta(self, meta: dict[str, Any]) -> None:
        w = self.w
        w.step = int(meta["step"])
        epoch, cursor = meta["cursor"]
        w.cursor = CursorState(int(epoch), int(cursor))
        w.samples_done = int(meta["samples_done"])
        w.metrics = {str(k): float(v) for k, v in (meta.get("metrics") or {}).items()}

    def _take_slot(self, plan: mb.Plan, layout: partition.Layout, abort: Any) -> None:
        """Hold this member's layers of ``layout`` (the moves brought the missing ones), form
        its stage group and build its runner and pack."""
        w, job = self.w, self.w.job
        self.slot = layout.slot_of(self.rank)
        self.bounds = layout.bounds
        self.lo, self.hi = layout.layers_of(self.rank)
        self._release()  # only this stage on the device, with its optimiser state
        self.runner = self.pack = None
        if self.slot is None:
            return
        v, j = self.slot
        k, n_vw = layout.stages, len(layout.vws)
        if n_vw > 1:
            self.sgroup = groups.form_group(self.store, plan.generation, v, n_vw,
                                          w.cfg.collective_timeout_s, abort, backend=plan.backend,
                                          hostname=w.cfg.ring_host or self.store.local_address,
                                          sub=f"s{j}/")
        row = layout.vws[v]
        self.runner = StageRunner(
            torch.nn.Sequential(*self.index.modules[self.lo:self.hi]), pg=self.group.pg,
            prev=row[j - 1] if j > 0 else None, next_=row[j + 1] if j < k - 1 else None,
            loss_fn=job.loss_fn, device=w.device, precision=job.precision,
            slowdown=w.cfg.slowdown, fixed_shapes=self.ps.fixed_shapes, step=lambda: w.step)
        self.pack = StagePack(self.index.params(self.lo, self.hi),
                              self.index.buffers(self.lo, self.hi))

    def _checksum(self, abort: Any) -> str:
        """A checksum of the whole model over every stage (VW 0's replicas), the same on every
        member when every stage's replicas are equal; else this member's own differs."""
        world = len(self.plan.members)
        t = torch.zeros(world, 2, dtype=torch.int64)
        mine = ""
        if self.slot is not None:
            mine = self.index.checksum(self.w.job.optimizer, self.lo, self.hi)
            t[self.rank] = torch.tensor([self.slot[1] + 1, int(mine[:15], 16)])
        groups.allreduce(self.group.ctl, t, abort)
        by_stage: dict[int, set[int]] = {}
        for j, c in t.tolist():
            if j > 0:
                by_stage.setdefault(j, set()).add(c)
        whole = hashlib.sha256(repr(sorted((j, sorted(c)) for j, c in by_stage.items()))
                               .encode()).hexdigest()[:16]
        if any(len(c) > 1 for c in by_stage.values()):
            return f"{whole}:{mine or 'spare'}"
        return whole

    # -- waves ----------------------------------------------------------------------------------

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            self._orders = {epoch: epoch_order(self.w.cfg.seed, epoch, len(self.w.job))}
        return self._orders[epoch]

    def _head(self) -> bool:
        return self.layout is not None and self.layout.vws[0][0] == self.rank

    def _step(self) -> int:
        """One wave (see the module docstring). Returns the newest generation seen, once every
        started wave is applied at the generation's stop point; else this generation."""
        w, job, plan = self.w, self.w.job, self.plan
        gen = plan.generation
        if self.layout is None:  # nothing fits: wait for the next generation
            time.sleep(0.05)
            return max(gen, self.hb.latest)
        wave = w.step + len(self.pending)
        self._apply_through(wsp.needed_before(wave, self.ps.staleness))
        stop = self.stop_at is not None and wave > self.stop_at
        if stop or self.ccursor.epoch >= job.epochs:
            self._apply_through(w.step + len(self.pending))
            if stop:
                self._handover()
            return self.newest if stop else gen
        epoch = self.ccursor.epoch
        self._compute(wave)
        if self.ccursor.epoch != epoch:  # an epoch end is a barrier: everything applied
            self._apply_through(w.step + len(self.pending))
        else:
            self._apply_through(wsp.needed_before(wave + 1, self.ps.staleness))
        if self.stop_at is not None and w.step > self.stop_at and not self.pending:
            self._handover()
            return self.newest
        return gen

    def _handover(self) -> None:
        """At a generation's stop point (every started wave applied): the stages whose every
        replica leaves with notice go to members that stay, so a drain loses nothing."""
        try:
            nxt = mb.Plan.from_json(self.store.get(mb.k_plan(self.newest)))
        except (ControlLost, ControlTimeout, Malformed) as e:
            raise GenerationBroken(f"reading generation {self.newest}: {e}") from e
        staying = [r for r, m in enumerate(self.plan.members) if m in set(nxt.members)]
        moves = partition.handover(self.layout, staying)
        if not moves:
            return
        gen = self.plan.generation
        self._move(moves, self.w.step, self.plan, lambda: self._broken(gen), HANDOVER_TAG)
        for t in moves:
            if t.dst == self.rank:
                lo, hi = (t.lo, t.hi) if self.hi <= self.lo else (
                    min(self.lo, t.lo), max(self.hi, t.hi))
                self.lo, self.hi = lo, hi
                log.info("took over layers %d..%d from rank %d, which leaves", t.lo, t.hi - 1,
                         t.src)

    def _compute(self, wave: int) -> None:
        w, job, layout, ps = self.w, self.w.job, self.layout, self.ps
        cur = self.ccursor
        total = cur.step_total(len(job), job.global_batch, min_batch=w.min_batch)
        ids = self._order(cur.epoch)[cur.cursor:cur.cursor + total]
        sizes = partition.micro_sizes(total, ps.micro_batch)
        wp = self.completion.pop(wave, None)  # a wave started before a failure
        kw = self.kept.pop(wave, None)
        bk = self.backup_kept.pop(wave, None)
        todo = list(range(len(sizes))) if wp is None else list(wp.recompute)
        counts = partition.split_micro(len(todo), layout.rates, layout.stages)
        offs = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        members = self.plan.members
        heads = complete.parts(wp, layout, todo, counts, len(sizes), 0)
        parts = tuple((members[r], [int(i) for m in p for i in ids[offs[m]:offs[m + 1]]])
                      for r, p in heads.items())
        world = len(self.plan.members)
        rows = torch.zeros(world, agree.ROW, dtype=torch.float64)
        me = rows[self.rank]
        me[agree.LATEST] = self.hb.latest
        mine: list[int] = []
        w.maybe_fault()
        self.pending.append(_Wave(wave, cur, total, mine, parts=parts))
        flat = None
        if self.slot is not None:
            v, j = self.slot
            mids = [ids[offs[m]:offs[m + 1]] for m in complete.split(todo, counts, v)]
            if j == 0:
                mine += dict(parts)[members[self.rank]]
            at_stage = heads if j == 0 else complete.parts(wp, layout, todo, counts,
                                                           len(sizes), j)
            self.pending[-1].cover = at_stage[self.rank]
            micros = [Micro(i, len(m), len(m) / total) for i, m in enumerate(mids)]
            cache: dict[int, Any] = {}

            def part(i: int, which: int) -> Any:
                if i not in cache:
                    cache[i] = w.batch(mids[i])
                return cache[i][which]

            before = self.pack.live_buffers()
            stats = self.runner.run(
                schedule(ps.schedule, len(micros), layout.stages, j), micros, wave,
                (lambda i: part(i, 0)) if j == 0 else None,
                (lambda i: part(i, 1)) if j == layout.stages - 1 else None,
                lambda: self._broken(self.plan.generation))
            flat, self.pending[-1].deltas = self.pack.pack(before, w.device)
            loss, loss_n = stats.loss_sum, sum(len(m) for m in mids)
            if wp is not None:
                flat, loss, loss_n = self._complete(wp, kw, bk, flat, loss, loss_n)
            wv = self.pending[-1]
            wv.local, wv.loss, wv.loss_n = flat.clone(), loss, loss_n
            self._send_backup(wave, flat, wv.cover, loss, loss_n)
            me[agree.SAMPLES] = len(mine) if j == 0 else 0
            me[agree.BUSY], me[agree.WALL] = stats.busy_s, stats.wall_s
            me[agree.LOSS] = loss
            me[agree.LOSS_N] = loss_n if j == layout.stages - 1 else 0
            me[agree.STAGE0] = 1.0 if j == 0 else 0.0
            w.note_speed(sum(len(m) for m in mids), stats.busy_s)
        if self._head():
            me[agree.EVAL] = w.eval_s
            me[agree.SNAP] = 1.0 if self._snapshot_due(wave + 1) else 0.0
        self.agree_or_start().submit(wave, flat, rows)
        self.ccursor = cur.advance(len(job), total)

    def _complete(self, wp: complete.WavePlan, kw: _Wave | None,
                  bk: tuple[torch.Tensor, float, int] | None, flat: torch.Tensor,
                  loss: float, loss_n: int) -> tuple[torch.Tensor, float, int]:
        """This member's pack of a wave completed after a failure: its recomputed part plus
        its kept contributions (its own, the backup it holds), or its stage's kept reduced
        pack, or zeros (see :mod:`trainer.pipeline.complete`)."""
        role, _, which = wp.role(self.rank, self.slot[1])
        if role == "zero":
            return torch.zeros_like(flat), 0.0, 0
        if role == "none":
            return flat, loss, loss_n
        own = (None, 0.0, 0) if kw is None else (kw.local, kw.loss, kw.loss_n)
        if role == "reduced":
            got = [(None if kw is None else kw.reduced, own[1], own[2])]
            flat, loss, loss_n = torch.zeros_like(flat), 0.0, 0
        else:
            got = [(bk or (None, 0.0, 0)) if backup else own for backup in which]
        for pack, extra, extra_n in got:
            if pack is None or pack.numel() != flat.numel():
                raise GenerationBroken(f"wave {wp.wave}: a kept pack the completion counts "
                                      "on is not here")
            flat, loss, loss_n = flat + pack.to(flat.device), loss + extra, loss_n + extra_n
        return flat, loss, loss_n

    def agree_or_start(self) -> Agreement:
        if self.agree is None:
            sg = self.sgroup.pg if self.sgroup is not None else None
            gen = self.plan.generation
            self.agree = Agreement(sg, self.group.ctl, len(self.plan.members),
                                   lambda: self._broken(gen))
        return self.agree

    def _apply_through(self, count: int) -> None:
        """Apply agreed waves in order until ``count`` waves are applied."""
        while self.w.step < count:
            got = self.agree_or_start().wait(self.w.step)
            self._commit(self.pending[0], got.pack, got.rows)
            self._backups_done(got.wave)

    def _commit(self, wv: _Wave, pack: torch.Tensor | None, rows: torch.Tensor | None) -> None:
        """Apply wave ``wv`` (its reduced pack; its control rows when agreed here)."""
        w, job = self.w, self.w.job
        self.pending.pop(0)
        if self.pack is not None and pack is not None:
            self.pack.apply(pack, job.optimizer, [p.deltas for p in self.pending if p.deltas])
        if wv.ids and self.slot is not None and self.slot[1] == 0:
            self._record_ids(wv, wv.ids, self.id)
        wv.local = wv.reduced = wv.deltas = None
        self.history = [*self.history[-self.ps.staleness - 1:], wv]
        w.step += 1
        epoch_before = w.cursor.epoch
        w.cursor = wv.cursor.advance(len(job), wv.total)
        w.samples_done += wv.total
        if rows is None:
            return
        loss = float(rows[:, agree.LOSS].sum()) / max(1.0, float(rows[:, agree.LOSS_N].sum()))
        newest = int(rows[:, agree.LATEST].max())
        gen = self.plan.generation
        if newest > gen and self.stop_at is None:
            self.stop_at, self.newest = wsp.stop_wave(wv.wave, self.ps.staleness), newest
        me = rows[self.rank]
        w.log_step(0 if self._head() else 1, {
            "t": time.time(), "step": w.step, "generation": gen,
            "world": len(self.plan.members), "batch": len(wv.ids),
            "compute_s": round(float(me[agree.BUSY]), 6),
            "wait_s": round(float(me[agree.WALL] - me[agree.BUSY]), 6), "samples": wv.total,
            "loss": loss, "member": self.plan.keys()[self.rank], "epoch": w.cursor.epoch,
            "slot": list(self.slot) if self.slot else None, "layers": [self.lo, self.hi],
            "resident": list(self.index.resident(job.optimizer, w.device))})
        if float(rows[:, agree.SNAP].max()) > 0:
            self._snapshot()
        if w.cursor.epoch != epoch_before and job.evaluate is not None:
            if self._gather():
                w.evaluate()
                self._release()
        if self._head():
            self.hb.stats = mb.ProgressReport(gen, w.step, w.cursor.epoch, w.samples_done,
                                        len(self.plan.members), loss, w.metrics).to_json()

    def _record_ids(self, wv: _Wave, ids: list[int], member: int) -> None:
        if self.w.cfg.record_samples is not None:
            self.w.append(self.w.cfg.record_samples, {
                "epoch": wv.cursor.epoch, "step": wv.wave, "member": member, "ids": ids,
                **({"by": self.id} if member != self.id else {})})

    # -- the whole model on the head: evaluation, snapshots, the trained model -------------------

    def _gather(self) -> bool:
        """VW 0's stages send their layers to the head; True on the head (it now holds the
        whole model and optimiser state until :meth:`_release`)."""
        layout = self.layout
        if layout is None or self.rank not in layout.vws[0]:
            return False
        moves = partition.gather(layout)
        if self._head():  # the whole model in one place, the others' layers received there
            self._place_whole(placement.gather_target(
                self.index.param_bytes(), self.lo, self.hi,
                self._settings(len(self.plan.members)).optimizer_slots, self.memory))
        if moves:
            self._move(moves, self.w.step, self.plan, lambda: self._broken(self.plan.generation),
                       GATHER_TAG)
        return self._head()

    def _release(self) -> None:
        """Keep only this member's layers: on its device, with their optimiser state; every
        other layer released (:mod:`trainer.pipeline.placement`)."""
        self.index.keep_only(self.w.job.optimizer, self.lo, self.hi)
        self.index.place(placement.decide(len(self.index), self.lo, self.hi), self.w.device,
                         self.w.job.optimizer)

    def _place_whole(self, where: str) -> None:
        """Every layer on ``where`` (the head gathering; a whole state about to be loaded)."""
        self.index.place(placement.decide(len(self.index), 0, 0, whole=where), self.w.device,
                         self.w.job.optimizer)

    def _snapshot_due(self, step: int) -> bool:
        """Is a snapshot due once ``step`` waves are applied (the head asks, and announces it
        in that wave's control row so that VW 0 gathers at the same wave)?"""
        s = self.w.snapshotter
        return s is not None and snap.due(step, time.monotonic(), self._snap_at[0],
                                          self._snap_at[1], s.every_steps, s.every_s)

    def _snapshot(self) -> None:
        w = self.w
        if self._gather():
            self._snap_at = (w.step, time.monotonic())  # tried: the next one is an interval on
            if w.snapshotter is not None:
                w.snapshotter.maybe(w.step, w.state, w.fingerprint, w.cursor.epoch,
                                    w.samples_done)
            self._release()

    def _finish(self) -> None:
        w = self.w
        if self._gather():
            if not w.metrics and w.job.evaluate is not None:
                w.evaluate()
            w.finish_model()
            self._release()
        done = mb.Done(self._checksum(lambda: self._broken(self.plan.generation)), w.step,
                       dict(w.metrics))
        self._report_done(done, publish=self._head())


def _digest(payload: torch.Tensor) -> list[int]:
    d = hashlib.sha256(payload.numpy().tobytes()).digest()
    return [int.from_bytes(d[i:i + 8], "big", signed=True) for i in range(0, 32, 8)]


def _received(work: Any) -> bool:
    """Did a posted receive complete, without error? (A gloo receive tells only when waited
    for: a short wait that runs out leaves it posted.)"""
    if work is None:
        return False
    try:
        work.wait(_POLL)
    except Exception:  # noqa: BLE001 - ran out, or failed (gloo: RuntimeError and kin)
        return False
    return True
