"""One membership of a worker (one member id): wait, form, step, commit, leave. Written once,
for every training mode.

Design (torchft's ``Manager``: the protocol around a train step, not the step). A
:class:`Member` waits for a plan, decides what to do with it (:func:`trainer.worker.decision.
decide_on_plan`: pure) and executes that: it forms the generation's process group over the
coordinator's authenticated store (:func:`trainer.collective.groups.form_group`), lets its
mode (:mod:`trainer.worker.modes`: the ring, the pipeline, the hybrid) agree on the newest
state and build its machinery, reports the generation formed, and then asks the mode for
steps. The mode hands every update it applies to :meth:`Member.commit`, the one place where
training progress moves (:class:`trainer.state.progress.Progress`, advanced only on a
commit), the samples trained are recorded, the metrics line is written, the evaluation runs
at an epoch end, and the head takes its duties: the progress report the coordinator reads,
a durable snapshot when one is due, the trained model when the coordinator asked for it
(:class:`~trainer.worker.modes.base.Duties`). A behaviour added here (a hook after each
commit, a duty, state that travels) reaches every mode.

A failed or abandoned collective (:class:`trainer.errors.GenerationBroken`) discards the
step: the member reports ``broken/<n>`` and waits for ``n + 1``. Leaving with notice: the
member asks for a drain and keeps stepping until the generation that drops it; it then
leaves at the boundary (0 steps lost). A member the ring dropped (it hung, or missed a roll
call) is refused when it wakes and the worker joins again as a new member. An exception in
the job's own code ends the job as failed (reported once, with the step and the fix), not
as a revocation; so does state that no member holds and no snapshot restores.

Rule for callers: :meth:`Member.live` returns a :class:`~trainer.worker.decision.
MemberOutcome`; the worker maps it to an exit code. A member never outlives its heartbeat.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from trainer.collective import groups, sync
from trainer.errors import (ControlLost, ControlTimeout, Diverged, GenerationBroken, JobCodeError,
                            Malformed, SnapshotError, StateLost)
from trainer.job import StepContext
from trainer.protocol import messages as mb
from trainer.state import snapshot as snap
from trainer.worker import decision as dn
from trainer.worker.decision import MemberOutcome
from trainer.worker.modes.base import Commit, Duties, Unsettled, step_kept

if TYPE_CHECKING:
    from trainer.worker.client import Heartbeat
    from trainer.worker.loop import Worker
    from trainer.worker.modes.base import Mode

log = logging.getLogger(__name__)

HELD_EVERY_S = 1.0  # while the coordinator is away, the held digest at most this often


class Member:
    """One membership (one member id) of a worker (see the module docstring).

    What a mode reads: :attr:`w` (the worker: its job, state, runtime, outputs, config),
    :attr:`store`, :attr:`hb` (the heartbeat: the newest generation seen, export requests),
    :attr:`plan`, :attr:`rank`, :attr:`group` (this generation's process groups),
    :attr:`fresh` (this member holds no state yet) and :meth:`broken`.
    """

    def __init__(self, w: Worker, store: Any, member_id: int, hb: Heartbeat | None,
                 mode: type[Mode]) -> None:
        self.w, self.store, self.id, self.hb = w, store, member_id, hb
        self.plan: mb.Plan | None = None
        self.group: groups.Group | None = None
        self.rank = -1
        # a worker started from a checkpoint (--resume) holds a state: the first generation
        # takes it, not rank 0's freshly built one (once: a later membership starts fresh)
        self.fresh = not getattr(w, "resumed", False)
        if not self.fresh:
            w.resumed = False
        self.was_member = False
        self.seen = 0
        self.drain_sent = False
        self.export_seen = -1
        self.snapshot_seen = -1  # the coordinator's snapshot requests seen (SNAPSHOT_NOW)
        self.away_since: float | None = None  # the coordinator stopped answering this thread
        # (step, digest) of the committed state, taken on the training thread while the
        # coordinator is away: what this member proves to a restarted one (issue 30.3)
        self.held: tuple[int, str] | None = None
        self._held_at = float("-inf")
        if hb is not None:
            hb.report = self._report
        self.mode: Mode = mode(self)

    # -- a coordinator that goes away -------------------------------------------------------------

    def _report(self) -> mb.Report:
        """This member's account to a restarted coordinator (the heartbeat sends it)."""
        w, plan, held = self.w, self.plan, self.held
        step, digest = held if held is not None and not self.fresh else (
            w.state.progress.step, "")
        return mb.Report(self.id, w.cfg.name, plan.to_json() if plan is not None else "",
                         step, w.runtime.device_name, w.state.fingerprint,
                         w.prior, w.notice or "", self.group is not None, w.cfg.zone,
                         not self.fresh, digest)

    def note_held(self, *, stalled: bool) -> None:
        """While the coordinator is away, on the training thread at a commit (``stalled``
        False: at most every ``HELD_EVERY_S``) or while it waits for the coordinator
        (``stalled``: once per step): the digest of the newest committed state, which the
        report to a restarted coordinator carries (issue 30.3: only members whose digest
        agrees are adopted as holders). Taken here, never on the heartbeat thread, so it
        never catches an update half applied. Only where every member holds the whole state
        (the ring); otherwise, or with the coordinator answering, no digest is reported."""
        away = self.hb is not None and self.hb.lost_is_recent()
        if not away or self.fresh or not getattr(self.mode, "whole_state", False):
            if not away:
                self.held = None
            return
        step, now = self.w.state.progress.step, time.monotonic()
        if self.held is not None and (self.held[0] == step or (
                not stalled and now - self._held_at < HELD_EVERY_S)):
            return
        self.held, self._held_at = (step, self.mode.checksum()), now

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
        if self.group is None:  # no update in flight: the state is the last committed one
            self.note_held(stalled=True)
        time.sleep(0.2)

    def _answered(self) -> None:
        if self.away_since is not None:
            log.info("the coordinator answers again")
            self.away_since = None

    # -- signals to and from the coordinator -----------------------------------------------------

    def broken(self, generation: int) -> bool:
        """Is ``generation`` declared broken? The heartbeat thread's cached answer while it
        is fresh; a store round trip when it is stale (e.g. this process was frozen). While
        the coordinator is away the collectives alone judge: the ring trains on."""
        hb = self.hb
        assert hb is not None
        if (hb.lost_is_recent() is False
                and time.monotonic() - hb.polled_at > 3 * hb.interval_s):
            try:
                return self.store.add(mb.k_broken(generation), 0) > 0
            except (ControlLost, ControlTimeout):
                pass
        return hb.is_broken(generation)

    def abort(self) -> bool:
        """Is the current generation declared broken? (What a collective's wait asks.)"""
        return self.plan is None or self.broken(self.plan.generation)

    def _report_broken(self, generation: int, why: Exception) -> None:
        log.warning("generation %d broken: %s", generation, str(why).splitlines()[0])
        self.drop_group()
        try:
            self.store.add(mb.k_broken(generation), 1)
        except (ControlLost, ControlTimeout):
            pass  # a coordinator that is away learns it from the members' reports

    def drop_group(self, *, clean: bool = False) -> None:
        """The generation ended (``clean``: no collective in flight) or broke: the mode frees
        its machinery; the group is destroyed off this path, at once when clean
        (:func:`trainer.collective.groups.release`), else after the collective timeout
        (:func:`trainer.collective.groups.bury`)."""
        self.mode.drop()
        if self.group is not None:
            group, self.group = self.group, None
            group.abort()
            if clean:
                groups.release(group)
            else:
                groups.bury(group)

    def _ask_drain(self) -> None:
        if self.w.notice is not None and not self.drain_sent:
            try:
                self.store.set(mb.k_drain(self.id), self.w.notice)
                self.store.add(mb.DRAINS, 1)
                self.drain_sent = True
            except (ControlLost, ControlTimeout):
                pass  # asked again at the next step boundary

    def fail(self, message: str, exc: BaseException | None = None) -> MemberOutcome:
        """The job cannot go on (its code raised, its state is lost): tell the coordinator
        once, make the generation's other members stop waiting, and end as failed."""
        log.error("%s", message, exc_info=exc)
        self.store.set(mb.k_error(self.id), mb.JobFailure(self.w.state.progress.step,
                                                          message).to_json())
        self.store.add(mb.ERRORS, 1)
        if self.plan is not None:
            self.store.add(mb.k_broken(self.plan.generation), 1)  # the others stop waiting
        self.w.failure = message
        return MemberOutcome.FAILED

    # -- the membership --------------------------------------------------------------------------

    def live(self) -> MemberOutcome:
        """Run this membership until it ends; returns how."""
        problem = self.mode.problem()
        if problem is not None:
            return self.fail(f"job {self.w.cfg.job}: {problem}")
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
                    newest = self.mode.step()
                except GenerationBroken as e:
                    self._report_broken(plan.generation, e)
                    continue
                except JobCodeError as e:
                    return self.fail(f"job {self.w.cfg.job}: {e}", e.exc)
                except Diverged as e:
                    return self.fail(f"job {self.w.cfg.job}: {e}")
                if self.w.over():
                    try:
                        self._finish()
                    except JobCodeError as e:  # the job's evaluate, at the end
                        return self.fail(f"job {self.w.cfg.job}: {e}", e.exc)
                    return MemberOutcome.FINISHED
                if newest > plan.generation:
                    self.drop_group(clean=True)  # the old group is finished with
        except StateLost as e:  # raised while forming: the job cannot go on
            return self.fail(f"job {self.w.cfg.job}: the job is lost: {e}")
        finally:
            self.mode.close()

    def _view(self, current: int) -> dn.MemberView:
        return dn.MemberView(self.id, current, self.seen, self.was_member,
                             self.w.notice is not None, self.store.add(mb.LATEST, 0))

    def _wait_and_form(self) -> MemberOutcome | None:
        """Wait for a newer plan and act on it (:func:`trainer.worker.decision.
        decide_on_plan`). Returns an outcome when the membership ends, else None."""
        current = self.plan.generation if self.plan else 0
        view: dn.MemberView | None = None
        while True:
            try:
                if view is None:
                    view = self._view(current)
                action = dn.decide_on_plan(view)
                if isinstance(action, dn.ReadPlan):
                    view = self._read_plan(view, action.generation)
                    continue
                if isinstance(action, dn.ReadEarlier):
                    view = dataclasses.replace(view, earlier=self._read_plans(action))
                    continue
                if isinstance(action, dn.ReadFinished):
                    view = dataclasses.replace(view, finished=self.store.get(
                        mb.FINISHED).decode(errors="replace") if self.store.check(
                        [mb.FINISHED]) else "")
                    continue
                self._answered()
            except (ControlLost, ControlTimeout) as e:
                self._away(e)
                view = None
                continue
            if isinstance(action, dn.KeepWaiting):
                time.sleep(0.01)
                view = None
                continue
            if isinstance(action, dn.Skip):
                self.seen = action.generation
                if action.why:
                    log.log(action.level, "%s", action.why)
                return None
            if isinstance(action, dn.Leave):
                return self._leave(action)
            assert isinstance(action, dn.Form)
            self.seen = action.plan.generation
            self._enter(action.plan, action.rank)
            return None

    def _read_plan(self, view: dn.MemberView, generation: int) -> dn.MemberView:
        raw = self.store.get(mb.k_plan(generation))
        try:
            return dataclasses.replace(view, plan=mb.Plan.from_json(raw))
        except Malformed:  # only token holders write plans: a bug, not an attack
            return dataclasses.replace(view, unreadable=True)

    def _read_plans(self, span: dn.ReadEarlier) -> tuple[mb.Plan, ...]:
        """The plans of generations ``span.first .. span.last`` that can still be read."""
        out = []
        for gen in range(span.first, span.last + 1):
            try:
                out.append(mb.Plan.from_json(self.store.get(mb.k_plan(gen))))
            except (Malformed, RuntimeError):
                continue  # deleted long ago, or unreadable: it cannot name me
        return tuple(out)

    def _leave(self, action: dn.Leave) -> MemberOutcome:
        if action.ask_drain:
            self._ask_drain()
        if action.outcome is MemberOutcome.REFUSED:  # dropped: a step may be in flight
            self.w.unsettled = self.mode.unsettled()
        if action.outcome is MemberOutcome.FAILED:
            if self.w.failure is None:
                self.w.failure = action.failure
                log.log(action.level, "%s", action.why)
        elif action.why:
            log.log(action.level, "%s", action.why)
        return action.outcome

    def _enter(self, plan: mb.Plan, rank: int) -> None:
        self.plan = plan
        assert self.hb is not None
        self.hb.generation = plan.generation
        try:
            self._form(plan, rank)
        except (ControlLost, ControlTimeout) as e:  # forming needs the coordinator
            self._report_broken(plan.generation, GenerationBroken(f"coordinator: {e}"))
        except GenerationBroken as e:
            self._report_broken(plan.generation, e)

    def _form(self, plan: mb.Plan, rank: int) -> None:
        """Form ``plan`` as ``rank``: the group, the state agreed, the mode's machinery, the
        formed report (the coordinator publishes the next plan only after every member's)."""
        w, cfg = self.w, self.w.cfg
        gen = plan.generation
        t0 = time.perf_counter()
        self.store.set(mb.k_forming(gen, self.id), "")  # the coordinator's roll calls read it
        self.group = groups.form_group(self.store, gen, rank, len(plan.members),
                                       cfg.collective_timeout_s, lambda: self.broken(gen),
                                       backend=plan.backend,
                                       hostname=cfg.ring_host or self.store.local_address)
        self.rank = rank
        moved = self.mode.transfer_state()
        if w.unsettled is not None:  # this worker's last membership was dropped mid-step
            self.settle(w.unsettled, gen)
            w.unsettled = None
        self.fresh = False
        self.was_member = True
        lost = moved.lost + self.mode.prepare()
        self.export_seen = self.hb.export if self.hb is not None else -1
        self.snapshot_seen = self.hb.snapshot_now if self.hb is not None else -1
        if self.mode.is_head():
            w.outputs.start_snapshots(self.store)
        checksum = self.mode.checksum()
        w.state.progress = w.state.progress.lost(lost)
        report = mb.Formed(checksum, w.state.progress.step, lost, moved.source, moved.nbytes,
                           round((time.perf_counter() - t0) * 1000, 2))
        self.store.set(mb.k_formed(gen, self.id), report.to_json())
        self.store.add(mb.k_formed_count(gen), 1)
        log.info("formed generation %d as rank %d/%d%s", gen, rank, len(plan.members),
                 self.mode.describe() or f" ({plan.backend})", extra=dataclasses.asdict(report))

    def settle(self, u: Unsettled, gen: int) -> None:
        """Record the samples of ``u`` under the member that computed them if the ring kept
        its step: the rule a member that stays applies (:func:`~trainer.worker.modes.base.
        step_kept`), to the first generation formed after ``u``'s (this one, ``gen``, when
        none formed between). A hung member that wakes after its peers completed the step's
        reduction gives it up, dropped; without this its samples were trained and never
        recorded."""
        agreed = self._first_formed_after(u.generation, gen)
        if agreed is None:
            log.warning("the step %d this worker computed before it was dropped: whether the "
                        "ring kept it is no longer known (its generation %d is too old); its "
                        "%d samples are not recorded", u.step, u.generation, len(u.ids))
        elif step_kept(u.step, agreed):
            self.record_samples(u.step, u.epoch, u.ids, member=u.member)
            log.info("the step %d in flight when this worker was dropped completed on its "
                     "peers: its %d samples are recorded", u.step, len(u.ids))

    def _first_formed_after(self, generation: int, gen: int) -> int | None:
        """The step the first generation formed after ``generation`` agreed on: one between
        it and ``gen`` that every member reported formed, else ``gen`` (being formed here,
        its state just agreed). None: a generation between is no longer in the store."""
        for g in range(generation + 1, gen):
            raw_plan, raw_count = self.store.peek([mb.k_plan(g), mb.k_formed_count(g)])
            if raw_plan is None:
                return None
            try:
                plan = mb.Plan.from_json(raw_plan)
            except Malformed:
                return None
            if not plan.members or int(raw_count or b"0") < len(plan.members):
                continue  # it broke while forming: nothing trained in it
            raw = self.store.peek([mb.k_formed(g, plan.members[0])])[0]
            try:
                return mb.Formed.parse(raw).step if raw is not None else None
            except Malformed:
                return None
        return self.w.state.progress.step

    def resume(self, plan: mb.Plan) -> None:
        """Load the durable snapshot ``plan`` names (rank 0 of a generation with no holder of
        the state; it then sends it on like any state source). Raises
        :class:`trainer.errors.GenerationBroken` when it cannot be used."""
        manifest: snap.Manifest | None = None
        try:
            manifest = snap.Manifest.parse(plan.resume)
            tree = snap.fetch(self.store, manifest)
            sync.check(tree, step=manifest.step, job=plan.job)
            self.w.state.load(tree)
        except (ValueError, KeyError, SnapshotError) as e:
            if manifest is not None:  # the coordinator names the next older one
                try:
                    self.store.set(mb.k_resume_failed(manifest.name), str(e)[:300])
                except (ControlLost, ControlTimeout):
                    pass
            raise GenerationBroken(f"resuming from the snapshot failed: {e}") from e
        self.fresh = False
        log.warning("resumed from the snapshot of step %d (every member holding the state "
                    "was lost)", manifest.step)

    # -- a commit --------------------------------------------------------------------------------

    def claim_duties(self, step: int) -> Duties:
        """On the head: the duties due once ``step`` is committed (a snapshot whose interval
        passed; the trained model, when the coordinator asked for it since the last claim)."""
        export = self.hb is not None and self.hb.export > self.export_seen
        if export:
            assert self.hb is not None
            self.export_seen = self.hb.export
        # != not >: a restarted coordinator counts from 0 again (and asks at once)
        asked = self.hb is not None and self.hb.snapshot_now != self.snapshot_seen
        if asked:
            assert self.hb is not None
            self.snapshot_seen = self.hb.snapshot_now  # a notice would leave no holder
        due = self.w.outputs.snapshot_due(step)
        return Duties(snapshot=due or (asked and self.w.outputs.snapshotter is not None), export=export)

    def record_samples(self, step: int, epoch: int, ids: Any, member: int | None = None) -> None:
        """Record that ``member`` (default: this one) trained ``ids`` in ``step``."""
        out = self.w.outputs
        if out.samples_file is not None:
            ids = [int(i) for i in ids]
            if member is None or member == self.id:
                out.samples(step, epoch, self.id, ids)
            else:
                out.samples(step, epoch, member, ids, by=self.id)

    def commit(self, c: Commit) -> None:
        """An update applied on this member (see :class:`~trainer.worker.modes.base.Commit`):
        the progress moves, the samples are recorded; unless ``c.quiet``, the evaluation at
        an epoch end, the head's duties, the metrics line and the progress report.
        Raises :class:`trainer.errors.JobCodeError` (the job's ``evaluate``)."""
        w, job, plan = self.w, self.w.job, self.plan
        assert plan is not None
        state = w.state
        before = state.progress
        if c.ids:
            self.record_samples(before.step, before.epoch, c.ids)
        state.progress = before.advance(len(job), c.samples)
        p = state.progress
        epoch_end = p.epoch != before.epoch
        self._user_step(epoch_end, c.loss)
        self.note_held(stalled=False)
        if c.quiet:
            return
        if epoch_end:
            self.mode.epoch_ended(before.epoch)  # before the head's evaluation: none waits
        head = self.mode.is_head()
        duties = c.duties if c.duties is not None else (
            self.claim_duties(p.step) if head else Duties())
        evaluate = self.eval_due(epoch_end)
        if evaluate or duties:
            with self.mode.whole_model() as holder:
                if holder:
                    if evaluate:
                        w.outputs.evaluate(job, state)
                    if duties.snapshot:
                        w.outputs.snapshot(state)
                    if duties.export:
                        w.outputs.write_model(job.model, p.step, "on request")
        world = len(plan.members)
        w.outputs.step_record(head, {
            "t": time.time(), "step": p.step, "generation": plan.generation, "world": world,
            "samples": c.samples, "loss": c.loss, "member": plan.keys()[self.rank],
            "epoch": p.epoch, "lr": job.lr(), **c.record,
            **({"digest": state.checksum()} if w.cfg.record_digests else {})},
            epochs=job.epochs, metrics=state.metrics)
        if head:
            if job.on_step is not None:
                try:
                    job.on_step(self.context(epoch_end, c.loss))
                except Exception as e:  # noqa: BLE001 - the user's code: one clear error
                    raise JobCodeError("on_step", p.step, 0, e) from e
            if self.hb is not None:
                self.hb.stats = mb.ProgressReport(
                    plan.generation, p.step, p.epoch, p.samples_done, world, c.loss,
                    state.metrics, state.metrics_step).to_json()

    def eval_due(self, epoch_end: bool, step: int | None = None) -> bool:
        """Does the job's ``evaluate`` run after the step just committed (``step``: after the
        step that will commit as ``step``), at an epoch end or every ``eval_every_steps``? The
        same answer on every member."""
        job = self.w.job
        every = job.eval_every_steps
        step = self.w.state.progress.step if step is None else step
        return job.evaluate is not None and (epoch_end or bool(every and step % every == 0))

    def context(self, epoch_end: bool, loss: float) -> StepContext:
        """What the job's hooks are told after a commit (:class:`trainer.job.StepContext`)."""
        w, plan = self.w, self.plan
        assert plan is not None
        p = w.state.progress
        return StepContext(p.step, p.epoch, epoch_end, w.job.lr(), loss, self.rank,
                           len(plan.members), p.samples_done, w.state.run_id, w.job.model,
                           w.job.optimizer, dict(w.state.metrics))

    def _user_step(self, epoch_end: bool, loss: float) -> None:
        """After an update, on every member: the job's scheduler (once per committed step,
        or per epoch end), then its ``after_step`` (what it writes survives: the buffers
        were agreed before the optimiser step). Raises :class:`trainer.errors.JobCodeError`."""
        job, step = self.w.job, self.w.state.progress.step
        if job.scheduler is not None and (job.scheduler_every == "step" or epoch_end):
            try:
                job.scheduler.step()
            except Exception as e:  # noqa: BLE001 - the user's code: one clear error
                raise JobCodeError("scheduler.step()", step, 0, e) from e
        if job.after_step is not None:
            try:
                job.after_step(self.context(epoch_end, loss))
            except Exception as e:  # noqa: BLE001
                raise JobCodeError("after_step", step, 0, e) from e

    # -- the end ---------------------------------------------------------------------------------

    def _finish(self) -> None:
        w, job = self.w, self.w.job
        with self.mode.whole_model() as holder:
            if holder:
                if not w.state.metrics and job.evaluate is not None:
                    w.outputs.evaluate(job, w.state)
                failure = w.outputs.finish_model(job, w.state.progress.step)
                if failure is not None:
                    w.failure = failure
        done = mb.Done(self.mode.checksum(), w.state.progress.step, dict(w.state.metrics))
        self._report_done(done, publish=self.mode.is_head())

    def _report_done(self, done: mb.Done, *, publish: bool) -> None:
        """Tell the coordinator this member finished, through a coordinator that is
        restarting; ``publish``: this member's progress report carries the final metrics
        (a former rank 0's is older)."""
        hb = self.hb
        while True:  # the end must reach the coordinator, even one that is restarting
            try:
                if publish and hb is not None and hb.stats is not None:
                    last = mb.ProgressReport.parse(hb.stats)
                    hb.publish_stats(dataclasses.replace(
                        last, metrics=dict(self.w.state.metrics)).to_json())
                self.store.set(mb.k_done(self.id), done.to_json())
                self.store.add(mb.DONES, 1)
                break
            except (ControlLost, ControlTimeout) as e:
                self._away(e)
        log.info("finished at step %d", self.w.state.progress.step,
                 extra={"checksum": done.checksum})
