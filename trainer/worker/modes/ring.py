"""The ring mode: data parallel over every member, heterogeneity-aware local batches.

Design. Every member holds the whole model. :meth:`RingMode.transfer_state` agrees on the
newest state over the generation's group (:func:`trainer.collective.sync.sync_state`:
whoever lacks it receives it, checked, from the member holding it; rank 0 of a generation
that lost every holder loads the durable snapshot first). A step (:meth:`RingMode.step`):
read the newest generation number the heartbeat saw, take this member's share of the
global batch (:mod:`trainer.data.batching` sizes, :mod:`trainer.data.sampler` ids),
compute, reduce, commit (:class:`trainer.collective.step.Stepper`). The newest generation
any member saw travels in the step's reduction, so every member switches after the same
step. A step that broke is *pending*: when the state agreed in the next generation is the
step after it, it completed on a peer and its samples count; otherwise it is discarded
and reported lost. A member dropped with a step pending (hung while its peers completed it)
hands it to its worker (:meth:`RingMode.unsettled`), which settles it by the same rule when
it rejoins (:meth:`trainer.worker.member.Member.settle`).

After an epoch end rank 0 evaluates (the skeleton runs it) while the others start the next
step: every member re-splits that step so rank 0 starts it that much later (its last
evaluation's time, from the reduction: the same figure on every member) and all finish
together. On NCCL no member may hold a pending collective while rank 0 is busy (a collective
pending past the group's timeout ends the process): rank 0 claims its duties (evaluation,
snapshot, export) before the step's reduction and says so in its row; after that commit the
others wait for its canary on the generation's gloo group (whose timeout is the NCCL
backstop; the wait is abortable) instead of starting the next step.

Rule for callers: as :class:`~trainer.worker.modes.base.Mode`; the hybrid mode uses one for
its state transfer and, at staleness 0, for everything.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

from trainer.collective import groups, sync
from trainer.collective.step import BUSY_COL, EVAL_COL, LATEST_COL, Stepper
from trainer.data import batching
from trainer.data.sampler import CursorState, scale_sizes, split
from trainer.errors import BadState, Diverged, GenerationBroken
from trainer.state.training import PARTS, divergence_message
from trainer.worker.modes.base import Commit, Transferred, Unsettled, step_kept

if TYPE_CHECKING:
    from trainer.protocol.messages import Plan
    from trainer.worker.member import Member


class RingMode:
    """The ring (see the module docstring)."""

    whole_state = True  # every member holds the same whole state: its digest is comparable

    def __init__(self, member: Member) -> None:
        self.m = member
        self.stepper: Stepper | None = None
        self.pending: Unsettled | None = None  # the step in flight
        self.busy_s = 0.0  # rank 0's head start in the next step (it evaluates first)

    def problem(self) -> str | None:
        return None

    def is_head(self) -> bool:
        return self.m.rank == 0

    def whole_model(self) -> AbstractContextManager[bool]:
        return nullcontext(self.is_head())

    def describe(self) -> str:
        return ""

    def checksum(self) -> str:
        return self.m.w.state.checksum()

    # -- forming ---------------------------------------------------------------------------------

    def transfer_state(self) -> Transferred:
        m, state = self.m, self.m.w.state
        plan, rank, group = m.plan, m.rank, m.group
        assert plan is not None and group is not None
        gen = plan.generation
        self.busy_s = 0.0  # a new generation: no evaluation is pending in it
        if plan.resume and m.fresh and rank == 0:
            m.resume(plan)
        try:
            got, src, nbytes, best = sync.sync_state(
                group.ctl, rank, len(plan.members), state.progress.step, m.fresh,
                state.to_tree, lambda: m.broken(gen), initial=plan.fresh_start)
            if got is not None:
                sync.check(got, step=best, job=plan.job)
        except BadState as e:  # a peer sent something that is not this job's state
            raise GenerationBroken(f"state from the source rejected: {e}") from e
        lost = 0
        if got is not None:
            if self.pending and step_kept(self.pending.step, int(got["step"])):
                p = self.pending  # the step completed on a peer: it counts
                m.record_samples(p.step, p.epoch, p.ids)
                self.pending = None
            if m.fresh or int(got["step"]) != state.progress.step:
                try:
                    state.load(got)  # members already at that step hold the same bits: skip
                except BadState as e:
                    raise GenerationBroken(f"state from the source rejected: {e}") from e
        if self.pending is not None:
            lost = 1
            self.pending = None
        return Transferred(lost, src, nbytes)

    def prepare(self) -> int:
        """The batch sizes and this generation's :class:`Stepper`."""
        m, w = self.m, self.m.w
        job, plan = w.job, m.plan
        assert plan is not None
        self.plan_sizes(plan)
        if self.stepper is not None:
            self.stepper.close()  # frees the old buckets first: one copy of the gradients
            self.stepper = None
        self.stepper = Stepper(job.model, job.optimizer, job.loss_fn, world=len(plan.members),
                               rank=m.rank, device=w.runtime.device, precision=job.precision,
                               scaler=w.state.scaler, bucket_mb=w.cfg.bucket_mb,
                               forward_loss=job.forward_loss, grad_clip=job.grad_clip,
                               micro_batch=w.runtime.micro_cap, min_batch=w.runtime.min_batch)
        return 0

    def plan_sizes(self, plan: Plan, timings: list[batching.StepTiming] | None = None,
                   keys: list[str] | None = None) -> None:
        """Every member's local batch from the speed model (refined by ``timings``): over
        the plan's members (the sizes are replaced), or over ``keys`` (the hybrid mode's
        zone: their sizes are updated). A member the planner drops is given a notice when it
        is this one."""
        m, w = self.m, self.m.w
        state = w.state
        if timings:
            state.speed = batching.observe(state.speed, timings)
        whole = keys is None
        keys = plan.keys() if keys is None else keys
        priors = {k: v for k, v in plan.priors.items() if k in keys and v > 0}
        if whole:
            prev = state.sizes if sorted(state.sizes) == sorted(keys) else None
        else:
            sub = {k: state.sizes[k] for k in keys if k in state.sizes}
            prev = sub if len(sub) == len(keys) else None
        bp = batching.plan_batches(state.speed, keys, w.job.global_batch, priors=priors,
                                   previous=prev, min_batch=w.runtime.min_batch)
        if whole:
            state.sizes = dict(bp.sizes)
        else:
            state.sizes.update(bp.sizes)
        me = plan.keys()[m.rank]
        if me in bp.drop and not m.drain_sent:
            w.give_notice("batch planner: " + "; ".join(n for n in bp.notes if me in n))

    def drop(self) -> None:
        if self.stepper is not None:
            self.stepper.close()
            self.stepper = None

    def close(self) -> None:
        self.drop()

    def unsettled(self) -> Unsettled | None:
        return self.pending if self.pending is not None and self.pending.ids else None

    # -- one step --------------------------------------------------------------------------------

    def _sizes(self, keys: list[str], total: int) -> list[int]:
        """Every member's share of a step of ``total`` samples, in rank order."""
        w = self.m.w
        return scale_sizes([w.state.sizes.get(k, 0) for k in keys], total,
                           min_batch=w.runtime.min_batch)

    def step(self) -> int:
        """One step of the current generation. Returns the newest generation any member saw.

        Raises :class:`trainer.errors.GenerationBroken` (nothing applied) and
        :class:`trainer.errors.JobCodeError`.
        """
        m, w = self.m, self.m.w
        job, plan, group, stepper, rt = w.job, m.plan, m.group, self.stepper, w.runtime
        assert plan is not None and group is not None and stepper is not None
        assert m.hb is not None
        p = w.state.progress
        world, keys = len(plan.members), plan.keys()
        total = p.cursor.step_total(len(job), job.global_batch, min_batch=rt.min_batch)
        sizes = self._sizes(keys, total)
        head_s = self.busy_s
        if head_s > 0:  # rank 0 evaluated before this step: it takes fewer samples
            fitted = batching.head_start(w.state.speed, dict(zip(keys, sizes)),
                                         {keys[0]: head_s}, min_batch=rt.min_batch)
            sizes = [fitted[k] for k in keys]
            self.busy_s = 0.0
        ids = split(rt.order(p.epoch), p.cursor, sizes)[m.rank]
        b = int(ids.numel())
        latest = m.hb.latest
        rt.maybe_fault(p.step)
        self.pending = Unsettled(plan.generation, m.id, p.step, p.epoch, tuple(ids.tolist()))
        batch = rt.batch(ids, p.step) if b > 0 else None
        rt.feed.hint(self._next_ids(keys, total))
        gen = plan.generation
        duties, busy, export_seen = None, False, m.export_seen
        if m.rank == 0:  # its duties after this commit, claimed now: they travel in its row
            after = p.advance(len(job), total)
            duties = m.claim_duties(after.step)
            busy = bool(duties) or m.eval_due(after.epoch != p.epoch, after.step)
        try:
            res = stepper.step(group.pg, batch, b, total, step=p.step, latest=latest,
                               eval_s=w.outputs.eval_s, should_abort=lambda: m.broken(gen),
                               after_compute=rt.slow, broken=lambda: m.broken(gen),
                               watch=group.watch(), busy=busy)
        except GenerationBroken:
            m.export_seen = export_seen  # an export request claimed for this step stays due
            raise
        if res.discarded:  # a member ran out of memory: nothing applied; the same step again
            m.export_seen = export_seen  # (its duties stay due too)
            self.pending = None
            rt.micro_cap = stepper.micro_cap
            return int(res.rows[:, LATEST_COL].max())
        # -- committed: every member applied the same update
        self.pending = None
        rows = res.rows
        rt.note_speed(b, res.compute_s)
        self.plan_sizes(plan, [batching.StepTiming(keys[r], int(rows[r, 0]), float(rows[r, 1]))
                               for r in range(world) if rows[r, 0] > 0])
        m.commit(Commit(total, res.loss, ids.tolist(), {
            "batch": b, "compute_s": round(res.compute_s, 6), "wait_s": round(res.wait_s, 6),
            "step_s": round(res.compute_s + res.wait_s, 6), "skipped": res.skipped,
            "head_start_s": round(head_s, 6) if m.rank == 0 else 0.0,
            **({"grad_norm": res.grad_norm} if res.grad_norm is not None else {})},
            duties=duties))
        if group.is_nccl and world > 1 and rows[0, BUSY_COL] > 0:
            self._head_ready(group, gen)
        elif m.eval_due(w.state.progress.epoch != p.epoch):
            # rank 0 evaluated (in the commit) while the others start the next step: it
            # starts that step as much later as its last evaluation took, a figure from the
            # reduction (the same on every member); a first evaluation has none yet
            self.busy_s = float(rows[0, EVAL_COL])
        return int(rows[:, LATEST_COL].max())

    def epoch_ended(self, epoch: int) -> None:
        """Every member's digests compared at the epoch's end, before rank 0 evaluates (its
        ``evaluate`` is checked on its own: :meth:`trainer.worker.outputs.Outputs.evaluate`):
        compared after it, every member waited for the evaluation, and the head start the
        others give rank 0 was lost (a 2-worker digits ring fell from 0.88x DDP to 0.71x)."""
        self.compare_digests(f"after epoch {epoch}")

    def compare_digests(self, where: str) -> None:
        """Every member's digests of every part (:data:`trainer.state.training.PARTS`),
        compared over the generation's group. Raises :class:`trainer.errors.Diverged` (on
        every member alike) naming the parts that differ and the likely cause, and
        :class:`trainer.errors.GenerationBroken`."""
        m = self.m
        plan, group = m.plan, m.group
        assert plan is not None and group is not None
        digests = m.w.state.digests()
        table = torch.zeros(len(plan.members), len(PARTS), dtype=torch.float64)
        table[m.rank] = torch.tensor([float(int(d[:12], 16)) if d != "-" else 0.0
                                      for d in (digests[k] for k in PARTS)],
                                     dtype=torch.float64)  # 48 bits: exact in float64
        gen = plan.generation
        groups.allreduce(group.ctl, table, lambda: m.broken(gen))
        differ = [k for i, k in enumerate(PARTS) if len(set(table[:, i].tolist())) > 1]
        if differ:
            raise Diverged(divergence_message(differ, where))

    def _head_ready(self, group: Any, gen: int) -> None:
        """NCCL: every member posts a canary on the generation's gloo group after this
        commit, rank 0 only once its duties are done; the others wait for it there (no NCCL
        collective pending meanwhile; a rank 0 that dies is seen within tens of ms, one that
        hangs by the heartbeats). Raises :class:`GenerationBroken`."""
        m = self.m
        groups.wait(group.watch().canary(), lambda: m.broken(gen), "waiting for rank 0's duties")

    def _next_ids(self, keys: list[str], total: int) -> torch.Tensor:
        """The ids this member will probably take in the next step (for prefetching)."""
        w = self.m.w
        job, rt, p = w.job, w.runtime, w.state.progress
        nxt = p.cursor.advance(len(job), total)
        if nxt.epoch >= job.epochs:
            return torch.empty(0, dtype=torch.long)
        total2 = nxt.step_total(len(job), job.global_batch, min_batch=rt.min_batch)
        return split(rt.order(nxt.epoch), CursorState(nxt.epoch, nxt.cursor),
                     self._sizes(keys, total2))[self.m.rank]
