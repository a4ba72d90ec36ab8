"""One membership of a worker (one member id): wait for a generation, form it, step, finish.

Design: a :class:`Member` waits for a plan that names it, forms the generation's process group
over the coordinator's authenticated store (:func:`trainer.collective.groups.form_group`), agrees on the
newest state with its peers (:func:`trainer.collective.sync.sync_state`: whoever lacks it receives it,
checked, from the member holding it) and then steps (:class:`trainer.collective.step.Stepper`): read the
newest generation number the heartbeat saw, take this member's share of the global batch
(:mod:`trainer.data.batching` sizes, :mod:`trainer.data.sampler` ids), compute, reduce, commit. The
newest generation any member saw travels in the step's reduction, so every member switches
after the same step. A failed or abandoned reduction discards the step (the data cursor does
not move): the member reports ``broken/<n>`` and waits for ``n + 1``.

Leaving with notice: the member asks for a drain and keeps stepping until the generation that
drops it; it then leaves at the boundary (0 steps lost). A member the ring dropped (it hung, or
missed a roll call) is refused when it wakes and the worker joins again as a new member. An
exception in the job's own code ends the job as failed (reported once, with the step and the
fix), not as a revocation.

Rule for callers: :meth:`Member.live` returns an :class:`MemberOutcome`; the worker maps it to an
exit code. A member never outlives its heartbeat.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer.collective import groups, sync
from trainer.collective.step import EVAL_COL, LATEST_COL, Stepper
from trainer.data import batching
from trainer.data.sampler import CursorState, epoch_order, scale_sizes, split
from trainer.errors import (BadState, ControlLost, ControlTimeout, GenerationBroken, JobCodeError,
                            Malformed, SnapshotError)
from trainer.protocol import messages as mb
from trainer.state import snapshot as snap
from trainer.worker import client

if TYPE_CHECKING:
    from trainer.worker.loop import Worker

log = logging.getLogger(__name__)


class MemberOutcome(str, enum.Enum):
    """How one membership ended."""

    FINISHED = "finished"  # the job completed
    DRAINED = "drained"  # left with notice at a generation boundary
    REFUSED = "refused"  # dropped while unresponsive: join again as a new member
    LOST = "lost"  # the ring lost every member holding the state
    NOTICED = "noticed"  # a notice came before this worker ever joined a generation
    FAILED = "failed"  # the job's code raised (here or on another member)


@dataclass
class _Pending:
    step: int
    epoch: int
    ids: list[int] = field(default_factory=list)


class Member:
    """One membership (one member id) of a worker (see the module docstring)."""

    def __init__(self, w: Worker, store: Any, member_id: int, hb: client.Heartbeat) -> None:
        self.w, self.store, self.id, self.hb = w, store, member_id, hb
        self.plan: mb.Plan | None = None
        self.group: groups.Group | None = None
        self.stepper: Stepper | None = None
        self.rank = -1
        self.fresh = True
        self.was_member = False
        self.seen = 0
        self.drain_sent = False
        self.pending: _Pending | None = None
        self.busy_s = 0.0  # rank 0's head start in the next step (it evaluates first)
        self.export_seen = -1
        self.away_since: float | None = None  # the coordinator stopped answering this thread
        if hb is not None:
            hb.report = self._report

    # -- a coordinator that goes away -------------------------------------------------------------

    def _report(self) -> mb.Report:
        """This member's account to a restarted coordinator (the heartbeat sends it)."""
        w, plan = self.w, self.plan
        return mb.Report(self.id, w.cfg.name, plan.to_json() if plan is not None else "",
                         w.step, w.device_name, w.fingerprint, w.prior,
                         w.notice or "", self.group is not None, w.cfg.zone)

    def _away(self, e: Exception) -> None:
        """The coordinator did not answer: wait for it (training needs it only to change
        generation) up to ``--coordinator-grace``, then give up."""
        now = time.monotonic()
        if self.away_since is None:
            self.away_since = now
            log.warning("the coordinator does not answer (%s); waiting up to %.0fs for it",
                        str(e).splitlines()[0], self.w.cfg.coordinator_grace_s)
        if now - self.away_since > self.w.cfg.coordinator_grace_s:
            raise ControlLost(f"no answer from the coordinator for "
                              f"{now - self.away_since:.0f}s (--coordinator-grace)") from e
        time.sleep(0.2)

    def _answered(self) -> None:
        if self.away_since is not None:
            log.info("the coordinator answers again")
            self.away_since = None

    # -- signals to and from the coordinator -----------------------------------------------------

    def _broken(self, generation: int) -> bool:
        """Is ``generation`` declared broken? The heartbeat thread's cached answer while it
        is fresh; a store round trip when it is stale (e.g. this process was frozen). While
        the coordinator is away the collectives alone judge: the ring trains on."""
        if (self.hb.lost_is_recent() is False
                and time.monotonic() - self.hb.polled_at > 3 * self.hb.interval_s):
            try:
                return self.store.add(mb.k_broken(generation), 0) > 0
            except (ControlLost, ControlTimeout):
                pass
        return self.hb.is_broken(generation)

    def _report_broken(self, generation: int, why: Exception) -> None:
        log.warning("generation %d broken: %s", generation, str(why).splitlines()[0])
        self._drop_group()
        try:
            self.store.add(mb.k_broken(generation), 1)
        except (ControlLost, ControlTimeout):
            pass  # a coordinator that is away learns it from the members' reports

    def _drop_group(self) -> None:
        if self.stepper is not None:
            self.stepper.close()
            self.stepper = None
        if self.group is not None:
            self.group.abort()
            groups.bury(self.group)
            self.group = None

    def _ask_drain(self) -> None:
        if self.w.notice is not None and not self.drain_sent:
            try:
                self.store.set(mb.k_drain(self.id), self.w.notice)
                self.store.add(mb.DRAINS, 1)
                self.drain_sent = True
            except (ControlLost, ControlTimeout):
                pass  # asked again at the next step boundary

    def _report_job_error(self, e: JobCodeError) -> None:
        job = self.w.cfg.job
        message = f"job {job}: {e}"
        log.error("%s", message, exc_info=e.exc)
        self.store.set(mb.k_error(self.id), mb.JobFailure(e.step, message).to_json())
        self.store.add(mb.ERRORS, 1)
        if self.plan is not None:
            self.store.add(mb.k_broken(self.plan.generation), 1)  # the others stop waiting
        self.w.failure = message

    # -- the membership --------------------------------------------------------------------------

    def live(self) -> MemberOutcome:
        """Run this membership until it ends; returns how."""
        try:
            while True:
                if self.plan is None or self.group is None:
                    outcome = self._wait_and_form()
                    if outcome:
                        return outcome
                    continue
                self._ask_drain()
                plan = self.plan
                try:
                    newest = self._step()
                except GenerationBroken as e:
                    self._report_broken(plan.generation, e)
                    continue
                except JobCodeError as e:
                    self._report_job_error(e)
                    return MemberOutcome.FAILED
                if self.w.cursor.epoch >= self.w.job.epochs:  # type: ignore[union-attr]
                    self._finish()
                    return MemberOutcome.FINISHED
                if newest > plan.generation:
                    self._drop_group()  # the old group is finished with; kept until exit
        finally:
            if self.stepper is not None:
                self.stepper.close()

    def _wait_and_form(self) -> MemberOutcome | None:
        """Wait for a newer plan; form it if it names me. Returns an outcome or None."""
        current = self.plan.generation if self.plan else 0
        while True:
            try:
                latest = self.store.add(mb.LATEST, 0)
                if latest > current and latest > self.seen:
                    raw = self.store.get(mb.k_plan(latest))
                    self._answered()
                    break
                if self.store.check([mb.FINISHED]):
                    return self._ended()
                self._answered()
            except (ControlLost, ControlTimeout) as e:
                self._away(e)
                continue
            if not self.was_member and self.w.notice is not None:
                self._ask_drain()
                return MemberOutcome.NOTICED
            time.sleep(0.01)
        self.seen = latest
        try:
            plan = mb.Plan.from_json(raw)
        except Malformed as e:  # only token holders write plans: a bug, not an attack
            log.error("generation %d: plan unreadable (%s); waiting for the next", latest, e)
            return None
        rank = plan.rank_of(self.id)
        if rank is None:
            if self.id in plan.drained:
                log.info("drained at generation %d; leaving", plan.generation)
                return MemberOutcome.DRAINED
            if not plan.members and not plan.resume:
                log.error("the ring lost every member holding the state: %s", plan.reason)
                return MemberOutcome.LOST
            # an empty plan with a snapshot to resume is not the end: the coordinator waits
            # for members (a joiner that reads it before its admission is published waits
            # on; a member dropped from it joins again and resumes the snapshot)
            if self.was_member:
                if self._drained_between(current, plan.generation):
                    return MemberOutcome.DRAINED
                log.warning("refused: dropped from the ring at generation %d (%s)",
                            plan.generation, plan.reason)
                return MemberOutcome.REFUSED
            return None  # a generation formed before my turn: keep waiting
        self.plan = plan
        self.hb.generation = plan.generation
        try:
            self._form(plan, rank)
        except (ControlLost, ControlTimeout) as e:  # forming needs the coordinator
            self._report_broken(plan.generation, GenerationBroken(f"coordinator: {e}"))
        except GenerationBroken as e:
            self._report_broken(plan.generation, e)
        return None

    def _ended(self) -> MemberOutcome:
        """The job is over (``finished`` is set): how, for this member."""
        how = self.store.get(mb.FINISHED).decode(errors="replace")
        if how.startswith("failed"):
            if self.w.failure is None:
                self.w.failure = how.removeprefix("failed: ")
                log.error("the job failed: %s", self.w.failure)
            return MemberOutcome.FAILED
        if how == "lost":
            return MemberOutcome.LOST
        return MemberOutcome.FINISHED if self.was_member else MemberOutcome.NOTICED

    def _drained_between(self, current: int, latest: int) -> bool:
        """Was this member drained by a generation after ``current`` and before ``latest``?

        A member whose step broke reads only the newest plan; when a drain plan was
        published in between (a drain and a kill in the same step), the newest plan no
        longer names it at all, and without this look back a drained member would take
        itself for a dropped one and join again as a new member.
        """
        for gen in range(current + 1, latest):
            try:
                plan = mb.Plan.from_json(self.store.get(mb.k_plan(gen)))
            except (Malformed, RuntimeError):
                continue  # deleted long ago, or unreadable: it cannot name me
            if self.id in plan.drained:
                log.info("drained at generation %d; leaving", gen)
                return True
        return False

    def _form(self, plan: mb.Plan, rank: int) -> None:
        w, cfg = self.w, self.w.cfg
        gen = plan.generation
        t0 = time.perf_counter()
        self.store.set(mb.k_forming(gen, self.id), "")  # the coordinator's roll calls read it
        self.group = groups.form_group(self.store, gen, rank, len(plan.members),
                                     cfg.collective_timeout_s, lambda: self._broken(gen),
                                     backend=plan.backend,
                                     hostname=cfg.ring_host or self.store.local_address)
        self.rank = rank
        self.busy_s = 0.0  # a new generation: no evaluation is pending in it
        if plan.resume and self.fresh and rank == 0:
            self._resume(plan)
        try:
            state, src, nbytes, best = sync.sync_state(
                self.group.ctl, rank, len(plan.members), w.step, self.fresh, w.state,
                lambda: self._broken(gen), initial=plan.fresh_start)
            if state is not None:
                sync.check(state, step=best, job=plan.job)
        except BadState as e:  # a peer sent something that is not this job's state
            raise GenerationBroken(f"state from the source rejected: {e}") from e
        discarded = 0
        if state is not None:
            if self.pending and int(state["step"]) == self.pending.step + 1:
                self._record(self.pending)  # the step completed on a peer: it counts
                self.pending = None
            if self.fresh or int(state["step"]) != w.step:
                try:
                    w.load(state)  # members already at that step hold the same bits: skip
                except BadState as e:
                    raise GenerationBroken(f"state from the source rejected: {e}") from e
        if self.pending is not None:
            discarded = 1
            self.pending = None
        self.fresh = False
        self.was_member = True
        discarded += self._prepare_steps(plan, rank)
        self.export_seen = self.hb.export
        if rank == 0:
            w.start_snapshots(self.store)
        report = mb.Formed(w.checksum(), w.step, discarded, src, nbytes,
                           round((time.perf_counter() - t0) * 1000, 2))
        self.store.set(mb.k_formed(gen, self.id), report.to_json())
        self.store.add(mb.k_formed_count(gen), 1)
        log.info("formed generation %d as rank %d/%d (%s)", gen, rank, len(plan.members),
                 plan.backend, extra=dataclasses.asdict(report))

    def _prepare_steps(self, plan: mb.Plan, rank: int) -> int:
        """Make ready to step in the generation just formed, its state agreed (before the
        formed report): the batch sizes and the ring's :class:`Stepper`. Other training
        modes (:mod:`trainer.worker.modes`) override it with their own machinery. Returns the
        steps this member computed that no member kept (reported as lost; the ring's one
        pending step is counted above)."""
        w, job = self.w, self.w.job
        assert job is not None
        self._plan_sizes(plan)
        if self.stepper is not None:
            self.stepper.close()
        self.stepper = Stepper(job.model, job.optimizer, job.loss_fn, world=len(plan.members),
                               rank=rank, device=w.device, precision=job.precision,
                               scaler=w.scaler, bucket_mb=w.cfg.bucket_mb)
        return 0

    def _resume(self, plan: mb.Plan) -> None:
        """Rank 0 of a generation with no holder of the state loads the durable snapshot the
        plan names; it then sends it to the others like any state source."""
        try:
            manifest = snap.Manifest.parse(plan.resume)
            tree = snap.fetch(self.store, manifest)
            sync.check(tree, step=manifest.step, job=plan.job)
            self.w.load(tree)
        except (ValueError, KeyError, SnapshotError, BadState) as e:
            raise GenerationBroken(f"resuming from the snapshot failed: {e}") from e
        self.fresh = False
        log.warning("resumed from the snapshot of step %d (every member holding the state "
                    "was lost)", manifest.step)

    def _plan_sizes(self, plan: mb.Plan, timings: list[batching.StepTiming] | None = None
                    ) -> None:
        w = self.w
        keys = plan.keys()
        if timings:
            w.speed = batching.observe(w.speed, timings)
        priors = {k: v for k, v in plan.priors.items() if k in keys and v > 0}
        prev = w.sizes if sorted(w.sizes) == sorted(keys) else None
        bp = batching.plan_batches(w.speed, keys, w.job.global_batch,  # type: ignore
                                   priors=priors, previous=prev, min_batch=w.min_batch)
        w.sizes = dict(bp.sizes)
        me = keys[self.rank]
        if me in bp.drop and not self.drain_sent:
            w.give_notice("batch planner: " + "; ".join(n for n in bp.notes if me in n))

    # -- one step ---------------------------------------------------------------------------------

    def _sizes(self, keys: list[str], total: int) -> list[int]:
        """Every member's share of a step of ``total`` samples, in rank order."""
        w = self.w
        return scale_sizes([w.sizes.get(k, 0) for k in keys], total, min_batch=w.min_batch)

    def _step(self) -> int:
        """One step of the current generation. Returns the newest generation any member saw.

        Raises :class:`groups.GenerationBroken` (nothing applied) and :class:`JobCodeError`.
        """
        w, job, plan, group, stepper = self.w, self.w.job, self.plan, self.group, self.stepper
        assert job is not None and plan is not None and group is not None
        assert stepper is not None
        world, keys = len(plan.members), plan.keys()
        total = w.cursor.step_total(len(job), job.global_batch, min_batch=w.min_batch)
        sizes = self._sizes(keys, total)
        head_s = self.busy_s
        if head_s > 0:  # rank 0 evaluated before this step: it takes fewer samples
            fitted = batching.head_start(w.speed, dict(zip(keys, sizes)), {keys[0]: head_s},
                                         min_batch=w.min_batch)
            sizes = [fitted[k] for k in keys]
            self.busy_s = 0.0
        ids = split(w.order(), w.cursor, sizes)[self.rank]
        b = int(ids.numel())
        latest = self.hb.latest
        w.maybe_fault()
        self.pending = _Pending(w.step, w.cursor.epoch, ids.tolist())
        batch = w.batch(ids) if b > 0 else None
        w.feed.hint(self._next_ids(keys, total))
        gen = plan.generation
        res = stepper.step(group.pg, batch, b, total, step=w.step, latest=latest,
                           eval_s=w.eval_s, should_abort=lambda: self._broken(gen),
                           after_compute=w.slow, broken=lambda: self._broken(gen))
        # -- committed: every member applied the same update
        self._record(self.pending)
        self.pending = None
        w.step += 1
        epoch_before = w.cursor.epoch
        w.cursor = w.cursor.advance(len(job), total)
        w.samples_done += total
        rows = res.rows
        timings = [batching.StepTiming(keys[r], int(rows[r, 0]), float(rows[r, 1]))
                   for r in range(world) if rows[r, 0] > 0]
        newest = int(rows[:, LATEST_COL].max())
        w.note_speed(b, res.compute_s)
        self._plan_sizes(plan, timings)
        if w.cursor.epoch != epoch_before and job.evaluate is not None:
            # Rank 0 evaluates now, while the others start the next step: every member
            # re-splits that step so rank 0 starts it that much later (its last evaluation's
            # time, from the reduction: the same figure on every member) and all finish
            # together. The first evaluation of a rank 0 has no figure yet: no head start.
            self.busy_s = float(rows[0, EVAL_COL])
            if self.rank == 0:
                w.evaluate()
        w.log_step(self.rank, {
            "t": time.time(), "step": w.step, "generation": gen, "world": world, "batch": b,
            "compute_s": round(res.compute_s, 6), "wait_s": round(res.wait_s, 6),
            "samples": total, "loss": res.loss, "step_s": round(res.compute_s + res.wait_s, 6),
            "member": keys[self.rank], "epoch": w.cursor.epoch, "skipped": res.skipped,
            "head_start_s": round(head_s, 6) if self.rank == 0 else 0.0})
        if self.rank == 0:
            self._after_commit(gen, world, res.loss)
        return newest

    def _after_commit(self, gen: int, world: int, loss: float) -> None:
        """Rank 0, once a step is committed: the progress the coordinator reads, a durable
        snapshot when one is due, the trained model when the coordinator asked for it."""
        w = self.w
        self.hb.stats = mb.ProgressReport(gen, w.step, w.cursor.epoch, w.samples_done, world, loss,
                                    w.metrics).to_json()
        if w.snapshotter is not None:
            w.snapshotter.maybe(w.step, w.state, w.fingerprint, w.cursor.epoch, w.samples_done)
        if self.hb.export > self.export_seen:
            self.export_seen = self.hb.export
            w.write_output("on request")

    def _next_ids(self, keys: list[str], total: int) -> torch.Tensor:
        """The ids this member will probably take in the next step (for prefetching)."""
        w, job = self.w, self.w.job
        assert job is not None
        nxt = w.cursor.advance(len(job), total)
        if nxt.epoch >= job.epochs:
            return torch.empty(0, dtype=torch.long)
        total2 = nxt.step_total(len(job), job.global_batch, min_batch=w.min_batch)
        order = w.order() if nxt.epoch == w.cursor.epoch else epoch_order(
            w.cfg.seed, nxt.epoch, len(job))
        return split(order, CursorState(nxt.epoch, nxt.cursor), self._sizes(keys, total2))[
            self.rank]

    def _record(self, pending: _Pending | None) -> None:
        if pending is not None and self.w.cfg.record_samples is not None:
            self.w.append(self.w.cfg.record_samples, {
                "epoch": pending.epoch, "step": pending.step, "member": self.id,
                "ids": pending.ids})

    def _finish(self) -> None:
        w = self.w
        assert w.job is not None
        if self.rank == 0:
            if not w.metrics and w.job.evaluate is not None:
                w.evaluate()
            w.finish_model()
        self._report_done(mb.Done(w.checksum(), w.step, dict(w.metrics)),
                          publish=self.rank == 0)

    def _report_done(self, done: mb.Done, *, publish: bool) -> None:
        """Tell the coordinator this member finished, through a coordinator that is
        restarting; ``publish``: this member's progress report carries the final metrics
        (a former rank 0's is older)."""
        w = self.w
        while True:  # the end must reach the coordinator, even one that is restarting
            try:
                if publish and self.hb.stats is not None:
                    last = mb.ProgressReport.parse(self.hb.stats)
                    self.hb.publish_stats(
                        dataclasses.replace(last, metrics=dict(w.metrics)).to_json())
                self.store.set(mb.k_done(self.id), done.to_json())
                self.store.add(mb.DONES, 1)
                break
            except (ControlLost, ControlTimeout) as e:
                self._away(e)
        log.info("finished at step %d", w.step, extra={"checksum": done.checksum})
