"""The elastic training loop a user's job runs in (one process = one worker).

Design: a worker loads and profiles its job first (hot join: the ring never waits for a
joiner's slow start), then connects, proves the token and waits for a generation that names
it. Inside a generation every step is::

    read gen/latest -> forward/backward on my share -> ONE all-reduce of
    [grads * b_i/B | my row of (b_i, compute_s, latest seen, loss * b_i)] -> commit

The gradients live in one flat buffer (``p.grad`` are views into it), so the reduction is a
single collective; the rows of the other members arrive in the same call, which gives every
member the same timings (for :mod:`trainer.batching`) and the same "newest generation seen"
(so all switch after the same step). The commit rule: the optimiser steps only after the
all-reduce returned on this member; a failed or abandoned reduction discards the step (the
data cursor does not move) and the worker reports ``broken/<n>`` and waits for ``n + 1``.
When the new group forms, :func:`trainer.sync.sync_state` sends the newest state to whoever
lacks it and every member reports the checksum of its parameters.

Leaving with notice (SIGTERM, a cloud notice, the coordinator's drain): the worker asks for a
drain and keeps stepping until the generation that drops it; it then leaves at the boundary
(0 steps lost). A worker the ring dropped (it hung, or missed a roll call) is refused when it
wakes and joins again as a new member. ``slowdown`` F sleeps (F - 1) x batch x the running median
of the measured compute seconds per sample after each forward/backward, to emulate slower
hardware without multiplying the host's timing noise by F.

Rule for callers: one :class:`Worker` per process; :meth:`Worker.run` returns an exit code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer import batching, client, ring, sync
from trainer import membership as mb
from trainer import state as st
from trainer.store_client import ControlLost, ControlTimeout
from trainer.job import Job, load_job
from trainer.sampler import CursorState, epoch_order, scale_sizes, split

log = logging.getLogger(__name__)

EXIT_OK, EXIT_JOB, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_LOST = 0, 2, 3, 4, 5
ROW = 5  # per-member row in the reduction: batch, compute_s, latest generation seen, loss*b,
EVAL_COL = 4  # and the seconds of its last evaluation (rank 0's: the next head start)
FAULTS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}


@dataclass(frozen=True)
class WorkerConfig:
    """What ``python -m trainer worker`` passes in (see docs/trainer.md)."""

    host: str
    port: int
    token: bytes
    job: str
    name: str
    seed: int = 0
    slowdown: float = 1.0
    metrics_file: Path | None = None
    record_samples: Path | None = None
    collective_timeout_s: float = 10.0
    connect_budget_s: float = 60.0
    heartbeat_s: float = 0.05
    profile_steps: int = 3
    faults: tuple[tuple[str, int], ...] = ()  # (kill|stop|term|freeze, first step >= this)
    rejoin: bool = True
    boot_idle: bool = False  # the process started under SCHED_IDLE: restore after profiling
    ring_host: str | None = None  # where gloo listens (default: the address facing the
    # coordinator)


def normal_priority() -> None:
    """Put every thread of this process back on SCHED_OTHER (after a ``--boot-idle`` boot).

    Linux scheduling policy is per thread and threads inherit their creator's, so each
    thread listed in /proc/self/task is switched (a thread gone meanwhile is skipped).
    """
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:
            pass
    log.info("boot done: back to normal CPU priority")


SLOW_WINDOW = 15  # steps in the running median that --slowdown sleeps against

@dataclass
class _Pending:
    step: int
    epoch: int
    ids: list[int] = field(default_factory=list)


class Worker:
    """One elastic worker (see the module docstring)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.job: Job | None = None
        self.notice: str | None = None
        self.step = 0
        self.cursor = CursorState()
        self.samples_done = 0
        self.speed = batching.SpeedModel()
        self.sizes: dict[str, int] = {}
        self.accuracy: float | None = None
        self._fired: set[tuple[str, int]] = set()
        self._order: tuple[int, torch.Tensor] | None = None
        self._samples_per_s = 0.0
        self._batch = 0
        self._per_sample: list[float] = []  # recent compute s/sample, for --slowdown
        self._eval_s = 0.0  # how long this worker's last evaluation took
        self._files: dict[Path, Any] = {}
        self.fingerprint = ""

    # -- entry ---------------------------------------------------------------------------

    def run(self) -> int:
        """Load, profile, join and train until finished, drained or refused. Returns exit code.

        Raises :class:`trainer.job.JobError` (before any contact with the coordinator) and
        :class:`trainer.client.CoordinatorUnreachable`.
        """
        cfg = self.cfg
        self.job = load_job(cfg.job, cfg.seed)
        prior = self._profile()
        if cfg.boot_idle:
            normal_priority()
        signal.signal(signal.SIGTERM, lambda *_: self.give_notice("SIGTERM"))
        job = self.job
        self.fingerprint = st.fingerprint(job.model, job.optimizer, job.global_batch, len(job))
        hello = mb.Hello(cfg.name, prior, self.fingerprint)
        while True:
            try:
                store = client.connect(cfg.host, cfg.port, cfg.token,
                                       budget_s=cfg.connect_budget_s,
                                       op_timeout_s=max(30.0, 3 * cfg.collective_timeout_s))
                member_id = client.join(store, hello)
            except client.JoinRefused as e:
                if e.verdict.startswith("finished"):
                    log.info("job already finished; nothing to do")
                    return EXIT_OK
                log.error("join refused by the coordinator: %s", e.verdict)
                return EXIT_REFUSED
            hb = client.Heartbeat(store, member_id, cfg.heartbeat_s,
                                  speed=lambda: mb.Speed(self._samples_per_s,
                                                         self._batch)).start()
            try:
                outcome = _Member(self, store, member_id, hb).live()
            except (ControlLost, ControlTimeout) as e:  # a store call failed: coordinator gone
                hb.stop()
                raise client.CoordinatorUnreachable(
                    f"lost the coordinator {cfg.host}:{cfg.port}: {str(e).splitlines()[0]}; "
                    "restart it and this worker") from e
            except BaseException:
                hb.stop()
                raise
            if outcome == "refused":
                hb.beat()  # show the coordinator this dropped member woke up
            hb.stop()
            store.close()
            if outcome == "refused" and cfg.rejoin and self.notice is None:
                log.warning("dropped from the ring while unresponsive; joining as a new member")
                continue
            return {"finished": EXIT_OK, "drained": EXIT_OK, "refused": EXIT_REFUSED,
                    "lost": EXIT_LOST, "noticed": EXIT_OK}[outcome]

    def give_notice(self, reason: str) -> None:
        """Leave at the next step boundary (signal handlers and notice pollers call this)."""
        if self.notice is None:
            self.notice = reason
            log.info("notice received (%s): leaving at the next step boundary", reason)

    # -- helpers shared with _Member ---------------------------------------------------------

    def _profile(self) -> float:
        """A few forward/backward passes before joining; returns the measured samples/s."""
        job = self.job
        assert job is not None
        b = max(1, min(len(job), job.global_batch // 2))
        ids = torch.arange(b)
        times = []
        for _ in range(max(1, self.cfg.profile_steps)):
            t0 = time.perf_counter()
            x, y = job.batch(ids)
            job.model.zero_grad(set_to_none=True)
            job.loss_fn(job.model(x), y).backward()
            self._slow(time.perf_counter() - t0, b)
            times.append(time.perf_counter() - t0)
        job.model.zero_grad(set_to_none=True)
        best = min(times[1:] or times)
        self._samples_per_s = b / best
        log.info("profiled %.1f samples/s (batch %d)", self._samples_per_s, b)
        return self._samples_per_s

    def _slow(self, compute_s: float, batch: int) -> None:
        """Emulate F-times-slower hardware: sleep (F - 1) x batch x median s/sample.

        The median runs over this worker's last ``SLOW_WINDOW`` measured compute times per
        sample, so the emulated part of a step is steady: sleeping (F - 1) x *this* step's
        compute would multiply the host's scheduling noise by F. At a steady batch the step
        then takes F x the base compute, the definition of the slowdown.
        """
        if self.cfg.slowdown <= 1.0 or batch <= 0:
            return
        self._per_sample.append(compute_s / batch)
        del self._per_sample[:-SLOW_WINDOW]
        per_sample = statistics.median(self._per_sample)
        time.sleep((self.cfg.slowdown - 1.0) * batch * per_sample)

    def state(self) -> dict[str, Any]:
        """The whole training state as tensors and plain data (:mod:`trainer.state`)."""
        job = self.job
        assert job is not None
        return {
            "job": self.fingerprint,
            "model": job.model.state_dict(),
            "optimizer": job.optimizer.state_dict(),
            "step": self.step,
            "cursor": [self.cursor.epoch, self.cursor.cursor],
            "samples_done": self.samples_done,
            "rng": sync.rng_state(),
            "speed": batching.speed_to_plain(self.speed),
            "sizes": dict(self.sizes),
            "accuracy": self.accuracy,
        }

    def load(self, state: dict[str, Any]) -> None:
        """Load a state received from a peer, after checking it fits this job's model and
        optimiser (names, shapes, dtypes). Raises :class:`trainer.state.BadState`."""
        job = self.job
        assert job is not None
        st.check_like(state.get("model"), job.model.state_dict(), "the model state received")
        try:
            job.model.load_state_dict(state["model"])
            job.optimizer.load_state_dict(state["optimizer"])
            self.step = int(state["step"])
            epoch, cursor = state["cursor"]
            self.cursor = CursorState(int(epoch), int(cursor))
            self.samples_done = int(state["samples_done"])
            sync.set_rng_state(state["rng"])
            self.speed = batching.speed_from_plain(state["speed"])
            self.sizes = {str(k): int(v) for k, v in state["sizes"].items()}
            acc = state["accuracy"]
            self.accuracy = None if acc is None else float(acc)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise st.BadState(f"the state received does not fit this job: {e}") from e

    def checksum(self) -> str:
        """Checksum of the parameters, buffers and optimiser state: equal on every member."""
        assert self.job is not None
        return sync.checksum(self.job.model, self.job.optimizer.state_dict())

    def evaluate(self) -> None:
        """Run the job's ``evaluate`` (rank 0): the accuracy, and how long it took (the
        head start the others give rank 0 after the next epoch end). Leaves training mode on."""
        job = self.job
        assert job is not None and job.evaluate is not None
        t0 = time.perf_counter()
        self.accuracy = float(job.evaluate(job.model).get("accuracy", float("nan")))
        job.model.train()
        self._eval_s = time.perf_counter() - t0

    def order(self) -> torch.Tensor:
        job = self.job
        assert job is not None
        if self._order is None or self._order[0] != self.cursor.epoch:
            self._order = (self.cursor.epoch, epoch_order(self.cfg.seed, self.cursor.epoch,
                                                          len(job)))
        return self._order[1]

    def maybe_fault(self) -> None:
        for action, at in self.cfg.faults:
            if at <= self.step and (action, at) not in self._fired:
                self._fired.add((action, at))
                log.warning("fault injector: %s at step %d", action, at)
                if action == "freeze":  # a wedged main thread; the heartbeat thread goes on
                    threading.Event().wait()
                os.kill(os.getpid(), FAULTS[action])

    def append(self, path: Path | None, record: dict[str, Any]) -> None:
        """Append one JSON line to ``path`` (kept open, flushed per line)."""
        if path is not None:
            f = self._files.get(path)
            if f is None:
                f = self._files[path] = path.open("a", buffering=1)
            f.write(json.dumps(record) + "\n")


class _Member:
    """One membership (one member id) of a worker: wait, form, step, until it ends."""

    def __init__(self, w: Worker, store: Any, member_id: int, hb: client.Heartbeat) -> None:
        self.w, self.store, self.id, self.hb = w, store, member_id, hb
        self.plan: mb.Plan | None = None
        self.pg: Any = None
        self.rank = -1
        self.fresh = True
        self.was_member = False
        self.seen = 0
        self.drain_sent = False
        self.pending: _Pending | None = None
        self.buf: torch.Tensor | None = None
        self.nparams = 0
        self.grads: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (param, its view)
        self.busy_s = 0.0  # rank 0's head start in the next step (it evaluates first)

    def _broken(self, generation: int) -> bool:
        """Is ``generation`` declared broken? The heartbeat thread's cached answer while it
        is fresh; a store round trip when it is stale (e.g. this process was frozen)."""
        if time.monotonic() - self.hb.polled_at > 3 * self.hb.interval_s:
            return self.store.add(mb.k_broken(generation), 0) > 0
        return self.hb.is_broken(generation)

    def _report_broken(self, generation: int, why: Exception) -> None:
        log.warning("generation %d broken: %s", generation, str(why).splitlines()[0])
        ring.bury(self.pg)
        self.pg = None
        self.store.add(mb.k_broken(generation), 1)

    def _ask_drain(self) -> None:
        if self.w.notice is not None and not self.drain_sent:
            self.drain_sent = True
            self.store.set(mb.k_drain(self.id), self.w.notice)
            self.store.add(mb.DRAINS, 1)

    def live(self) -> str:
        """Run this membership; returns finished | drained | refused | lost | noticed."""
        while True:
            if self.plan is None or self.pg is None:
                outcome = self._wait_and_form()
                if outcome:
                    return outcome
                continue
            self._ask_drain()
            plan = self.plan
            try:
                newest = self._step()
            except ring.RingBroken as e:
                self._report_broken(plan.generation, e)
                continue
            if self.w.cursor.epoch >= self.w.job.epochs:  # type: ignore[union-attr]
                self._finish()
                return "finished"
            if newest > plan.generation:
                ring.bury(self.pg)  # the old group is finished with; keep it until exit
                self.pg = None

    # -- generations ---------------------------------------------------------------------

    def _wait_and_form(self) -> str | None:
        """Wait for a newer plan; form it if it names me. Returns an outcome or None."""
        current = self.plan.generation if self.plan else 0
        while True:
            latest = self.store.add(mb.LATEST, 0)
            if latest > current and latest > self.seen:
                break
            if self.store.check([mb.FINISHED]):
                return "finished" if self.was_member else "noticed"
            if not self.was_member and self.w.notice is not None:
                self._ask_drain()
                return "noticed"
            time.sleep(0.01)
        self.seen = latest
        try:
            plan = mb.Plan.from_json(self.store.get(mb.k_plan(latest)))
        except mb.Malformed as e:  # only token holders write plans: a bug, not an attack
            log.error("generation %d: plan unreadable (%s); waiting for the next", latest, e)
            return None
        rank = plan.rank_of(self.id)
        if rank is None:
            if self.id in plan.drained:
                log.info("drained at generation %d; leaving", plan.generation)
                return "drained"
            if not plan.members:
                log.error("the ring lost every member holding the state: %s", plan.reason)
                return "lost"
            if self.was_member:
                if self._drained_between(current, plan.generation):
                    return "drained"
                log.warning("refused: dropped from the ring at generation %d (%s)",
                            plan.generation, plan.reason)
                return "refused"
            return None  # a generation formed before my turn: keep waiting
        self.plan = plan
        self.hb.generation = plan.generation
        try:
            self._form(plan, rank)
        except ring.RingBroken as e:
            self._report_broken(plan.generation, e)
        return None

    def _drained_between(self, current: int, latest: int) -> bool:
        """Was this member drained by a generation after ``current`` and before ``latest``?

        A member whose step broke reads only the newest plan; when a drain plan was
        published in between (a drain and a kill in the same step), the newest plan no
        longer names it at all, and without this look back a drained member would take
        itself for a dropped one and join again as a new member.
        """
        for gen in range(current + 1, latest):
            if self.id in mb.Plan.from_json(self.store.get(mb.k_plan(gen))).drained:
                log.info("drained at generation %d; leaving", gen)
                return True
        return False

    def _form(self, plan: mb.Plan, rank: int) -> None:
        w, cfg = self.w, self.w.cfg
        gen = plan.generation
        t0 = time.perf_counter()
        self.store.set(mb.k_forming(gen, self.id), "")  # the coordinator's roll calls read it
        group = ring.form_group(self.store, gen, rank, len(plan.members),
                                cfg.collective_timeout_s, lambda: self._broken(gen),
                                hostname=cfg.ring_host or self.store.local_address)
        ring.bury(group.store)  # kept with the group until exit
        self.pg = group.pg
        self.rank = rank
        self.busy_s = 0.0  # a new generation: no evaluation is pending in it
        try:
            state, src, nbytes, best = sync.sync_state(
                self.pg, rank, len(plan.members), w.step, self.fresh, w.state,
                lambda: self._broken(gen), initial=gen == 1)
            if state is not None:
                sync.check(state, step=best, job=plan.job)
        except st.BadState as e:  # a peer sent something that is not this job's state
            raise ring.RingBroken(f"state from the source rejected: {e}") from e
        discarded = 0
        if state is not None:
            if self.pending and int(state["step"]) == self.pending.step + 1:
                self._record(self.pending)  # the step completed on a peer: it counts
                self.pending = None
            if self.fresh or int(state["step"]) != w.step:
                w.load(state)  # members already at that step hold the same bits: skip
        if self.pending is not None:
            discarded = 1
            self.pending = None
        self.fresh = False
        self.was_member = True
        self._plan_sizes(plan)
        self._setup_buffer(len(plan.members))
        report = mb.Formed(w.checksum(), w.step, discarded, src, nbytes,
                           round((time.perf_counter() - t0) * 1000, 2))
        self.store.set(mb.k_formed(gen, self.id), report.to_json())
        self.store.add(mb.k_formed_count(gen), 1)
        log.info("formed generation %d as rank %d/%d", gen, rank, len(plan.members),
                 extra=dataclasses.asdict(report))

    def _plan_sizes(self, plan: mb.Plan, timings: list[batching.StepTiming] | None = None
                    ) -> None:
        w = self.w
        keys = plan.keys()
        if timings:
            w.speed = batching.observe(w.speed, timings)
        priors = {k: v for k, v in plan.priors.items() if k in keys and v > 0}
        prev = w.sizes if sorted(w.sizes) == sorted(keys) else None
        bp = batching.plan_batches(w.speed, keys, w.job.global_batch,  # type: ignore
                                   priors=priors, previous=prev)
        w.sizes = dict(bp.sizes)
        me = keys[self.rank]
        if me in bp.drop and not self.drain_sent:
            w.give_notice("batch planner: " + "; ".join(n for n in bp.notes if me in n))

    def _setup_buffer(self, world: int) -> None:
        params = [p for p in self.w.job.model.parameters() if p.requires_grad]  # type: ignore
        self.nparams = sum(p.numel() for p in params)
        self.buf = torch.zeros(self.nparams + world * ROW, dtype=torch.float32)
        self.grads = []
        o = 0
        for p in params:
            view = self.buf[o : o + p.numel()].view_as(p)
            p.grad = view
            self.grads.append((p, view))
            o += p.numel()

    # -- one step -----------------------------------------------------------------------

    def _step(self) -> int:
        """One step of the current generation. Returns the newest generation any member saw.

        Raises :class:`ring.RingBroken` when the reduction fails (nothing is applied).
        """
        w, job, plan, buf = self.w, self.w.job, self.plan, self.buf
        assert job is not None and plan is not None and buf is not None
        world = len(plan.members)
        keys = plan.keys()
        total = w.cursor.step_total(len(job), job.global_batch)
        sizes = [w.sizes.get(k, 0) for k in keys]
        sizes = scale_sizes(sizes, total)
        head_s = self.busy_s
        if head_s > 0:  # rank 0 evaluated before this step: it takes fewer samples
            fitted = batching.head_start(w.speed, dict(zip(keys, sizes)), {keys[0]: head_s})
            sizes = [fitted[k] for k in keys]
            self.busy_s = 0.0
        ids = split(w.order(), w.cursor, sizes)[self.rank]
        b = int(ids.numel())
        latest = self.hb.latest
        w.maybe_fault()
        self.pending = _Pending(w.step, w.cursor.epoch, ids.tolist())
        t0 = time.perf_counter()
        buf.zero_()
        loss_v = 0.0
        if not job.model.training:  # evaluate() may leave it in eval mode
            job.model.train()
        if b > 0:
            x, y = job.batch(ids)
            loss = job.loss_fn(job.model(x), y)
            loss.backward()
            loss_v = float(loss.detach())
            for p, view in self.grads:  # autograd accumulates in place; copy if it did not
                g = p.grad
                if g is not view:
                    if g is not None and g.data_ptr() != view.data_ptr():
                        view.copy_(g)
                    p.grad = view
            buf[: self.nparams].mul_(b / total)
        w._slow(time.perf_counter() - t0, b)
        compute_s = time.perf_counter() - t0
        rows = buf[self.nparams :].view(world, ROW)
        rows[self.rank] = torch.tensor([b, compute_s, latest, loss_v * b, w._eval_s])
        t1 = time.perf_counter()
        ring.allreduce(self.pg, buf, lambda: self._broken(plan.generation))
        wait_s = time.perf_counter() - t1
        if self._broken(plan.generation):
            # A late completion: this member was frozen while the others gave up on the
            # step, then its reduction completed on their abandoned work. Not committed.
            raise ring.RingBroken("the reduction completed after the generation was broken")
        # -- commit: the reduction returned and the generation stands: apply the update
        job.optimizer.step()
        self._record(self.pending)
        self.pending = None
        w.step += 1
        epoch_before = w.cursor.epoch
        w.cursor = w.cursor.advance(len(job), total)
        w.samples_done += total
        timings = [batching.StepTiming(keys[r], int(rows[r, 0]), float(rows[r, 1]))
                   for r in range(world) if rows[r, 0] > 0]
        loss_all = float(rows[:, 3].sum()) / total
        newest = int(rows[:, 2].max())
        step_s = time.perf_counter() - t0
        w._batch = b
        w._samples_per_s = b / compute_s if compute_s > 0 and b else w._samples_per_s
        self._plan_sizes(plan, timings)
        if w.cursor.epoch != epoch_before and job.evaluate is not None:
            # Rank 0 evaluates now, while the others start the next step: every member
            # re-splits that step so rank 0 starts it that much later (its last evaluation's
            # time, from the reduction: the same figure on every member) and all finish
            # together. The first evaluation of a rank 0 has no figure yet: no head start.
            self.busy_s = float(rows[0, EVAL_COL])
            if self.rank == 0:
                w.evaluate()
        w.append(w.cfg.metrics_file, {
            "t": time.time(), "step": w.step, "generation": plan.generation, "world": world,
            "batch": b, "compute_s": round(compute_s, 6), "wait_s": round(wait_s, 6),
            "samples": total, "loss": loss_all, "step_s": round(step_s, 6),
            "member": keys[self.rank], "epoch": w.cursor.epoch,
            "head_start_s": round(head_s, 6) if self.rank == 0 else 0.0})  # rank 0's only
        if self.rank == 0:
            metrics = {"accuracy": w.accuracy} if w.accuracy is not None else {}
            self.hb.stats = mb.Progress(plan.generation, w.step, w.cursor.epoch,
                                        w.samples_done, world, loss_all, metrics).to_json()
        return newest

    def _record(self, pending: _Pending | None) -> None:
        if pending is not None and self.w.cfg.record_samples is not None:
            self.w.append(self.w.cfg.record_samples, {
                "epoch": pending.epoch, "step": pending.step, "member": self.id,
                "ids": pending.ids})

    def _finish(self) -> None:
        w = self.w
        assert w.job is not None
        if w.accuracy is None and self.rank == 0 and w.job.evaluate is not None:
            w.evaluate()
        done = mb.Done(w.checksum(), w.step,
                       {"accuracy": w.accuracy} if w.accuracy is not None else {})
        if self.rank == 0 and self.hb.stats is not None:  # a former rank 0's is older
            self.hb.publish_stats(self.hb.stats)
        self.store.set(mb.k_done(self.id), done.to_json())
        self.store.add(mb.DONES, 1)
        log.info("finished at step %d", w.step, extra={"checksum": done.checksum})
