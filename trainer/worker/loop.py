"""The elastic training loop a user's job runs in (one process = one worker).

Design: a worker loads its job, builds its runtime (:class:`trainer.worker.runtime.Runtime`:
the device, the input feed; in the pipeline mode the model stays on the host until a member
holds a stage: :mod:`trainer.pipeline.placement`) and profiles a few steps first (hot join:
the ring never waits for a joiner's slow start), then connects, proves the token and joins;
each membership is a :class:`trainer.worker.member.Member` running the job's training mode
(:mod:`trainer.worker.modes`). What outlives a membership is split by job: the
configuration (:class:`trainer.worker.config.WorkerConfig`), the training state
(:class:`trainer.state.training.TrainingState`: parameters, buffers, optimiser, loss
scaler, progress, the batch planner's speed model, metrics), the runtime, and the outputs
(:class:`trainer.worker.outputs.Outputs`: metrics, sample records, the trained model,
snapshots). A membership's end becomes an exit code (:func:`trainer.worker.decision.
after_membership`): a member dropped while unresponsive joins again as a new member.

Rule for callers: one :class:`Worker` per process; :meth:`Worker.run` returns an exit code
and leaves a failure's message in :attr:`Worker.failure` (the command line prints it).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch

from trainer.collective.step import Stepper, lowered_cap, make_scaler
from trainer.errors import (BadState, ControlLost, ControlTimeout, CoordinatorUnreachable,
                            DeviceError, JobCodeError, JobError, JoinRefused, OutOfMemory,
                            SnapshotError)
from trainer.job import Job, load_job, resolve_mode
from trainer.protocol import messages as mb
from trainer.protocol.admission import derive_key
from trainer.state import codec
from trainer.state.training import TrainingState
from trainer.worker import client, devices, guard
from trainer.worker import decision as dn
from trainer.worker.config import WorkerConfig
from trainer.worker.decision import MemberOutcome
from trainer.worker.member import Member
from trainer.worker.modes import mode_class
from trainer.worker.modes.base import Unsettled
from trainer.worker.outputs import Outputs
from trainer.worker.runtime import Runtime

log = logging.getLogger(__name__)


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


def local_notice_s() -> float:
    """The seconds a SIGTERM leaves (``$SPOTRING_NOTICE_WINDOW_S``, which the local driver's
    notice window sets; else GCP's 30 s, the shortest cloud notice)."""
    try:
        return max(0.0, float(os.environ.get("SPOTRING_NOTICE_WINDOW_S", "30")))
    except ValueError:
        return 30.0


def _run_notice_hook(hook: Any, seconds_left: float) -> None:
    try:
        hook(seconds_left)
    except Exception:  # noqa: BLE001 - the user's hook: logged, never fatal
        log.exception("the job's on_notice(%s) raised; the drain goes on", seconds_left)


class Worker:
    """One elastic worker (see the module docstring).

    ``cfg`` what it was told; ``job`` the user's job; ``state`` the training state it holds
    and sends; ``runtime`` what it computes with; ``outputs`` what it writes; ``prior`` its
    profiled samples/s (told to the coordinator when it joins); ``notice`` why it leaves at
    the next step boundary (None: it stays); ``failure`` the job's failure, when it failed.
    """

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.job: Job = None  # type: ignore[assignment]  # loaded by run()
        self.state: TrainingState = None  # type: ignore[assignment]
        self.runtime: Runtime = None  # type: ignore[assignment]
        self.outputs = Outputs(cfg.job, metrics_file=cfg.metrics_file,
                               record_samples=cfg.record_samples, output=cfg.output,
                               snapshot_key=derive_key(cfg.token, b"snapshot manifest"))
        self.prior = 0.0
        self.notice: str | None = None
        self.failure: str | None = None
        self._notice_hooked = False  # the job's on_notice ran (once per worker)
        self.resumed = False  # --resume loaded a state its first membership brings
        self.unsettled: Unsettled | None = None  # a dropped membership's step in flight

    # -- entry -----------------------------------------------------------------------------

    def run(self) -> int:
        """Load, profile, join and train until finished, drained or refused. Returns exit code.

        Raises :class:`trainer.errors.JobError` (before any contact with the coordinator),
        :class:`trainer.errors.DeviceError` and :class:`trainer.errors.CoordinatorUnreachable`.
        """
        cfg = self.cfg
        device = devices.resolve(cfg.device)
        guard.install()  # the job's torch.distributed calls: a clear error naming ctx
        self.job = job = load_job(cfg.job, cfg.seed)
        job.mode, why = resolve_mode(job.mode, cfg.mode, job.precision)
        log.info("training mode %s (%s)", job.mode, why)
        mode = mode_class(job.mode)  # an unavailable mode fails here, before joining
        refused = devices.refusal(job.mode, device)
        if refused is not None:
            raise DeviceError(refused)
        try:
            self._prepare(device)
            self.prior = self._profile()
            if cfg.boot_idle:
                normal_priority()
            signal.signal(signal.SIGTERM, lambda *_: self.give_notice("SIGTERM",
                                                                      local_notice_s()))
            return self._join(mode)
        finally:
            self.outputs.close()
            if self.runtime is not None:
                self.runtime.close()

    def _join(self, mode: type) -> int:
        """Join, and join again as a new member while the ring drops this one."""
        cfg = self.cfg
        hello = mb.Hello(cfg.name, self.prior, self.state.fingerprint, self.runtime.device_name,
                         cfg.zone)
        while True:
            try:
                store = client.connect(cfg.host, cfg.port, cfg.token,
                                       budget_s=cfg.connect_budget_s,
                                       op_timeout_s=max(30.0, 3 * cfg.collective_timeout_s))
                member_id = client.join(store, hello)
            except JoinRefused as e:
                code, level = dn.refused_exit(e.verdict)
                log.log(level, "%s: %s", "the job is already over" if e.verdict.startswith(
                    "finished:") else "join refused by the coordinator", e.verdict)
                return code
            hb = client.Heartbeat(store, member_id, cfg.heartbeat_s,
                                  speed=self.runtime.speed).start()
            try:
                outcome = Member(self, store, member_id, hb, mode).live()
            except (ControlLost, ControlTimeout) as e:  # a store call failed
                hb.stop()
                raise CoordinatorUnreachable(
                    f"lost the coordinator {cfg.host}:{cfg.port}: "
                    f"{str(e).splitlines()[0]}; restart it and this worker") from e
            except BaseException:
                hb.stop()
                raise
            if outcome is MemberOutcome.REFUSED:
                hb.beat()  # show the coordinator this dropped member woke up
            hb.stop()
            store.close()
            code = dn.after_membership(outcome, rejoin=cfg.rejoin,
                                       noticed=self.notice is not None)
            if code is None:
                log.warning("dropped from the ring while unresponsive; joining as a new "
                            "member")
                continue
            return code

    def over(self) -> bool:
        """Is the job over at the committed progress (``epochs``, ``max_steps``, the run's
        ``--until-epochs``/``--until-steps``, whichever first)? Every member agrees: the
        progress is the same on all."""
        p = self.state.progress
        return self.job.ends_at(p.step, p.epoch, until_steps=self.cfg.until_steps,
                                until_epochs=self.cfg.until_epochs)

    def give_notice(self, reason: str, seconds_left: float | None = None) -> None:
        """Leave at the next step boundary (signal handlers and notice pollers call this).
        A revocation notice (``seconds_left`` given: the cloud's, or a local SIGTERM's) also
        runs the job's ``on_notice(seconds_left)`` once, on a thread of its own: the drain
        never waits for it, and what it raises is logged, never fatal."""
        if self.notice is None:
            self.notice = reason
            log.info("notice received (%s): leaving at the next step boundary", reason)
        hook = getattr(self.job, "on_notice", None)
        if seconds_left is not None and hook is not None and not self._notice_hooked:
            self._notice_hooked = True
            threading.Thread(target=_run_notice_hook, args=(hook, seconds_left),
                             name="spotring-on-notice", daemon=True).start()

    # -- setup -----------------------------------------------------------------------------

    def _prepare(self, device: torch.device) -> None:
        """The model on the device, the scaler, the input pipeline, the training state. In
        the pipeline mode the model stays on the host: a member puts only its stage's layers
        on the device once a generation has formed (:mod:`trainer.pipeline.placement`)."""
        cfg, job = self.cfg, self.job
        if job.mode != "pipeline":
            job.model.to(device)
        workers = cfg.loader_workers if cfg.loader_workers is not None else job.loader_workers
        self.runtime = Runtime(job, device, seed=cfg.seed, slowdown=cfg.slowdown,
                               loader_workers=workers, faults=cfg.faults)
        self.state = TrainingState(job.model, job.optimizer, make_scaler(job.precision, device),
                                   codec.fingerprint(job.model, job.optimizer, job.global_batch,
                                                     len(job), job.mode),
                                   scheduler=job.scheduler, extra=job.extra_state)
        self._check_state()
        if cfg.resume is not None:
            self._resume(cfg.resume)
        log.info("job %s on %s (%s, minimum local batch %d)", cfg.job, device, job.precision,
                 self.runtime.min_batch)

    def _check_state(self) -> None:
        """The job's scheduler and extra state must travel as tensors and plain data (no
        pickle): encode them once now. Raises :class:`trainer.errors.JobError` naming the
        field."""
        job, state = self.job, self.state
        parts = {"scheduler": state.scheduler, **{f"extra_state[{k!r}]": v
                                                  for k, v in state.extra.items()}}
        for name, obj in parts.items():
            if obj is None:
                continue
            try:
                codec.encode(obj.state_dict())
            except Exception as e:  # noqa: BLE001 - the user's object: one clear line
                raise JobError(f"job {self.cfg.job!r}: {name}.state_dict() must hold only "
                               f"tensors and plain data (numbers, strings, lists, dicts): "
                               f"{str(e).splitlines()[0]}") from e
        if job.order is not None:
            self.runtime.order(0)  # raises JobError naming Job.order when it is not one

    def _resume(self, path: Path) -> None:
        """``--resume CKPT``: the state this worker starts from (a spotring snapshot or the
        user's checkpoint). A first generation takes rank 0's; a joiner still receives the
        ring's. Raises :class:`trainer.errors.JobError` naming the flag and the cause."""
        from trainer.state import export

        try:
            kind, got = export.read_checkpoint(path)
            if kind == "snapshot":
                self.state.load(got)
                what = [f"the whole training state at step {self.state.progress.step}"]
            else:
                what = self.state.load_checkpoint(
                    export.checkpoint_parts(got, sorted(self.state.extra)),
                    dataset_size=len(self.job), global_batch=self.job.global_batch)
        except (SnapshotError, BadState) as e:
            raise JobError(f"--resume {path}: {e}") from e
        self.resumed = True
        log.info("resumed from %s: %s", path, ", ".join(what))

    def _profile(self) -> float:
        """A few forward/backward passes before joining; returns the measured samples/s.

        Raises :class:`trainer.errors.JobError` when the job's code raises: it is reported
        before the worker ever contacts the coordinator. Out of memory is not a job error:
        the pass is profiled again with half the samples, and the member's micro-batch cap
        starts there (:func:`trainer.collective.step.lowered_cap`; in the pipeline mode,
        whose profile runs the whole model a layer at a time, a stage's waves find it).
        The model's buffers are put back as they were: the passes run in train mode, and
        step 0's committed state is the model the user built, not one with a few profiling
        batches in its BatchNorm statistics.
        """
        before = {k: v.detach().clone() for k, v in self.job.model.named_buffers()}
        try:
            return self._profile_passes()
        finally:  # the passes ran in train mode: BatchNorm's statistics are the user's again
            with torch.no_grad():
                for k, v in self.job.model.named_buffers():
                    if k in before:
                        v.copy_(before[k])

    def _profile_passes(self) -> float:
        """:meth:`_profile`'s passes (they move the model's buffers; the caller restores
        them)."""
        from trainer.pipeline import profile as pipeline_profile

        job, rt = self.job, self.runtime
        b = max(rt.min_batch, min(len(job), job.global_batch // 2))
        ids = torch.arange(min(b, len(job)))
        times = []
        runs = 0
        while runs < max(1, self.cfg.profile_steps):
            t0 = time.perf_counter()
            moving = 0.0  # pipeline mode: seconds moving layers to the device and back
            try:
                batch = rt.batch(ids, 0)
                if job.mode == "pipeline":  # one layer on the device at a time
                    moving = pipeline_profile.profile_step(job, batch, rt.device)
                else:
                    Stepper.profile_step(job, batch, rt.device, self.state.scaler,
                                         rt.micro_cap)
            except OutOfMemory as e:
                try:
                    cap = lowered_cap(e.samples, 0, len(ids), min_batch=rt.min_batch,
                                      device=rt.device, what="profiled again")
                except JobCodeError as e2:
                    raise JobError(f"job {self.cfg.job!r}: {e2}") from e2
                if job.mode != "pipeline":  # a stage holds some layers: its waves tell
                    rt.micro_cap = cap
                ids = ids[:cap]
                times.clear()
                continue
            except JobCodeError as e:
                raise JobError(f"job {self.cfg.job!r}: {e}") from e
            runs += 1
            rt.slow(time.perf_counter() - t0 - moving, len(ids))
            times.append(time.perf_counter() - t0 - moving)
        job.model.zero_grad(set_to_none=True)
        best = min(times[1:] or times)
        rt.samples_per_s = len(ids) / best
        log.info("profiled %.1f samples/s (batch %d)", rt.samples_per_s, len(ids))
        return rt.samples_per_s
