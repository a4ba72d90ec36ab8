"""The elastic training loop a user's job runs in (one process = one worker).

Design: a worker loads its job, puts the model on its device (:mod:`trainer.worker.devices`; in the
pipeline mode only its stage's layers, once it has one: :mod:`trainer.pipeline.placement`) and
profiles a few steps first (hot join: the ring never waits for a joiner's slow start), then
connects, proves the token and joins; each membership is a :class:`trainer.worker.member.Member`
(wait, form, step: see there and :mod:`trainer.collective.step`). The worker holds what outlives a
membership: the job, the device, the input pipeline, the training state (parameters,
buffers, optimiser, loss scaler, step, data cursor, RNG, the batch planner's speed model) as
tensors and plain data (:meth:`Worker.state` / :meth:`Worker.load`), the metrics and the
trained model's way out (``--output`` and the job's ``on_finish``).

``slowdown`` F sleeps (F - 1) x batch x the running median of the measured compute seconds per
sample after each forward/backward, to emulate slower hardware without multiplying the host's
timing noise by F.

Rule for callers: one :class:`Worker` per process; :meth:`Worker.run` returns an exit code.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.collective import sync
from trainer.collective.reducer import DEFAULT_BUCKET_MB
from trainer.collective.step import make_scaler
from trainer.data import batching
from trainer.data.sampler import CursorState, epoch_order
from trainer.errors import (BadState, ControlLost, ControlTimeout, CoordinatorUnreachable,
                            JobCodeError, JobError, JoinRefused)
from trainer.job import Job, load_job, resolve_mode
from trainer.protocol import messages as mb
from trainer.state import codec as st
from trainer.state import snapshot as snap
from trainer.worker import client, devices
from trainer.worker.member import MemberOutcome
from trainer.worker.modes import member_class

log = logging.getLogger(__name__)

EXIT_OK, EXIT_JOB, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_LOST = 0, 2, 3, 4, 5
EXIT_CODES = {MemberOutcome.FINISHED: EXIT_OK, MemberOutcome.DRAINED: EXIT_OK, MemberOutcome.NOTICED: EXIT_OK,
              MemberOutcome.REFUSED: EXIT_REFUSED, MemberOutcome.LOST: EXIT_LOST, MemberOutcome.FAILED: EXIT_JOB}
FAULTS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}
SLOW_WINDOW = 15  # steps in the running median that --slowdown sleeps against
LOG_EVERY_S = 10.0  # progress lines at most this often (and at every epoch end)


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
    heartbeat_s: float = 0.1
    profile_steps: int = 3
    faults: tuple[tuple[str, int], ...] = ()  # (kill|stop|term|freeze, first step >= this)
    rejoin: bool = True
    boot_idle: bool = False  # the process started under SCHED_IDLE: restore after profiling
    ring_host: str | None = None  # where gloo listens (default: the address facing the
    # coordinator)
    device: str = "auto"
    bucket_mb: float = DEFAULT_BUCKET_MB
    output: Path | None = None  # where rank 0 writes the trained model (state_dict)
    loader_workers: int | None = None  # overrides the job's
    coordinator_grace_s: float = 600.0  # train on / wait this long for a lost coordinator
    zone: str = ""  # where this worker runs (cloud zone): the hybrid mode groups by it
    mode: str = ""  # the provisioner's training mode for the run (a Job.mode "auto" takes it)


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


class Worker:
    """One elastic worker (see the module docstring)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.job: Job | None = None
        self.device = torch.device("cpu")
        self.scaler: torch.amp.GradScaler | None = None
        self.feed: Any = None
        self.min_batch = 1
        self.notice: str | None = None
        self.failure: str | None = None
        self.step = 0
        self.cursor = CursorState()
        self.samples_done = 0
        self.speed = batching.SpeedModel()
        self.sizes: dict[str, int] = {}
        self.metrics: dict[str, float] = {}
        self.eval_s = 0.0  # how long this worker's last evaluation took
        self.fingerprint = ""
        self.prior = 0.0
        self.device_name = "cpu"
        self.snapshotter: snap.Snapshotter | None = None
        self._fired: set[tuple[str, int]] = set()
        self._order: tuple[int, torch.Tensor] | None = None
        self._samples_per_s = 0.0
        self._batch = 0
        self._per_sample: list[float] = []  # recent compute s/sample, for --slowdown
        self._files: dict[Path, Any] = {}
        self._last_log = 0.0
        self._log_epoch = -1

    # -- entry -----------------------------------------------------------------------------

    def run(self) -> int:
        """Load, profile, join and train until finished, drained or refused. Returns exit code.

        Raises :class:`trainer.errors.JobError` (before any contact with the coordinator),
        :class:`trainer.errors.DeviceError` and :class:`trainer.errors.CoordinatorUnreachable`.
        """
        cfg = self.cfg
        self.device = devices.resolve(cfg.device)
        self.job = load_job(cfg.job, cfg.seed)
        job = self.job
        job.mode, why = resolve_mode(job.mode, cfg.mode, job.precision)
        log.info("training mode %s (%s)", job.mode, why)
        self._prepare()
        prior = self._profile()
        if cfg.boot_idle:
            normal_priority()
        signal.signal(signal.SIGTERM, lambda *_: self.give_notice("SIGTERM"))
        self.fingerprint = st.fingerprint(job.model, job.optimizer, job.global_batch, len(job),
                                          job.mode)
        self.prior, self.device_name = prior, devices.describe(self.device)
        member_class(job.mode)  # an unavailable mode fails here, before joining
        hello = mb.Hello(cfg.name, prior, self.fingerprint, self.device_name, cfg.zone)
        try:
            while True:
                try:
                    store = client.connect(cfg.host, cfg.port, cfg.token,
                                           budget_s=cfg.connect_budget_s,
                                           op_timeout_s=max(30.0, 3 * cfg.collective_timeout_s))
                    member_id = client.join(store, hello)
                except JoinRefused as e:
                    ended = mb.verdict_outcome(e.verdict)
                    if ended is not None:
                        # a job that ended lost or failed never exits 0, even for a late joiner
                        code = {mb.JobOutcome.LOST: EXIT_LOST, mb.JobOutcome.FAILED: EXIT_JOB}.get(
                            ended, EXIT_OK)
                        log.log(logging.INFO if code == EXIT_OK else logging.ERROR,
                                "the job is already over: %s", e.verdict)
                        return code
                    log.error("join refused by the coordinator: %s", e.verdict)
                    return EXIT_REFUSED
                hb = client.Heartbeat(store, member_id, cfg.heartbeat_s,
                                      speed=lambda: mb.Speed(self._samples_per_s,
                                                             self._batch)).start()
                try:
                    outcome = member_class(job.mode)(self, store, member_id, hb).live()
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
                if outcome is MemberOutcome.REFUSED and cfg.rejoin and self.notice is None:
                    log.warning("dropped from the ring while unresponsive; joining as a new "
                                "member")
                    continue
                if outcome is MemberOutcome.FAILED and self.failure:
                    print(f"error: {self.failure}", flush=True)
                return EXIT_CODES[outcome]
        finally:
            if self.snapshotter is not None:
                self.snapshotter.wait()
            if self.feed is not None:
                self.feed.close()

    def start_snapshots(self, store: Any) -> None:
        """As rank 0: take durable snapshots when the coordinator keeps them (it announces
        how often); one :class:`trainer.state.snapshot.Snapshotter` for the worker's life."""
        if self.snapshotter is not None:
            return
        try:
            raw = store.peek([mb.SNAPSHOT_CONFIG])[0]
        except (ControlLost, ControlTimeout):
            return
        if not raw:
            return
        try:
            cfg = json.loads(raw)
            every_s, every_steps = float(cfg["every_s"]), int(cfg["every_steps"])
        except (ValueError, KeyError, TypeError):
            log.warning("snapshot settings from the coordinator unreadable: none taken")
            return
        self.snapshotter = snap.Snapshotter(store.clone, every_steps, every_s)
        log.info("durable snapshots every %s", f"{every_steps} steps or {every_s:.0f}s"
                 if every_steps else f"{every_s:.0f}s")

    def give_notice(self, reason: str) -> None:
        """Leave at the next step boundary (signal handlers and notice pollers call this)."""
        if self.notice is None:
            self.notice = reason
            log.info("notice received (%s): leaving at the next step boundary", reason)

    # -- setup -----------------------------------------------------------------------------

    def _prepare(self) -> None:
        """The model on the device, the scaler, the input pipeline, the minimum batch. In the
        pipeline mode the model stays on the host: a member puts only its stage's layers on
        the device once a generation has formed (:mod:`trainer.pipeline.placement`)."""
        job = self.job
        assert job is not None
        if job.mode != "pipeline":
            job.model.to(self.device)
        self.scaler = make_scaler(job.precision, self.device)
        self.min_batch = job.min_batch
        self.feed = _make_feed(job, self.device, self._loader_workers())
        log.info("job %s on %s (%s, minimum local batch %d)", self.cfg.job, self.device,
                 job.precision, self.min_batch)

    def _profile(self) -> float:
        """A few forward/backward passes before joining; returns the measured samples/s.

        Raises :class:`trainer.errors.JobError` when the job's code raises: it is reported
        before the worker ever contacts the coordinator.
        """
        job = self.job
        assert job is not None
        b = max(self.min_batch, min(len(job), job.global_batch // 2))
        ids = torch.arange(min(b, len(job)))
        times = []
        from trainer.collective.step import Stepper
        from trainer.pipeline import profile as pipeline_profile

        for _ in range(max(1, self.cfg.profile_steps)):
            t0 = time.perf_counter()
            moving = 0.0  # pipeline mode: seconds moving layers to the device and back
            try:
                batch = self.batch(ids)
                if job.mode == "pipeline":  # one layer on the device at a time
                    moving = pipeline_profile.profile_step(job, batch, self.device)
                else:
                    Stepper.profile_step(job, batch, self.device, self.scaler)
            except JobCodeError as e:
                raise JobError(f"job {self.cfg.job!r}: {e}") from e
            self.slow(time.perf_counter() - t0 - moving, len(ids))
            times.append(time.perf_counter() - t0 - moving)
        job.model.zero_grad(set_to_none=True)
        best = min(times[1:] or times)
        self._samples_per_s = len(ids) / best
        log.info("profiled %.1f samples/s (batch %d)", self._samples_per_s, len(ids))
        return self._samples_per_s

    def slow(self, compute_s: float, batch: int) -> None:
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

    def batch(self, ids: torch.Tensor) -> Any:
        """The collated batch of ``ids`` on the device. A dead loader process gets one new
        pipeline; the dataset's own exceptions (and a second failure) are the job's error.
        Raises :class:`trainer.errors.JobCodeError`."""
        from trainer.errors import FeedError

        for attempt in (1, 2):
            try:
                return self.feed.batch(ids)
            except FeedError as e:
                if attempt == 2:
                    raise JobCodeError("input pipeline", self.step, len(ids), e) from e
                log.warning("input pipeline failed (%s); starting a new one", e)
                self.feed.close()
                assert self.job is not None
                self.feed = _make_feed(self.job, self.device, self._loader_workers())
            except Exception as e:  # noqa: BLE001 - the dataset's own code
                raise JobCodeError("dataset", self.step, len(ids), e) from e
        raise AssertionError("unreachable")

    def _loader_workers(self) -> int | None:
        assert self.job is not None
        return (self.cfg.loader_workers if self.cfg.loader_workers is not None
                else self.job.loader_workers)

    def note_speed(self, batch: int, compute_s: float) -> None:
        """This worker's last local batch and samples/s (the heartbeat reports them)."""
        self._batch = batch
        if compute_s > 0 and batch:
            self._samples_per_s = batch / compute_s

    # -- the training state ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The whole training state as tensors and plain data (:mod:`trainer.state.codec`)."""
        job = self.job
        assert job is not None
        return {
            "job": self.fingerprint,
            "model": job.model.state_dict(),
            "optimizer": job.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "step": self.step,
            "cursor": [self.cursor.epoch, self.cursor.cursor],
            "samples_done": self.samples_done,
            "rng": sync.rng_state(),
            "speed": batching.speed_to_plain(self.speed),
            "sizes": dict(self.sizes),
            "metrics": dict(self.metrics),
        }

    def load(self, state: dict[str, Any]) -> None:
        """Load a state received from a peer, after checking it fits this job's model and
        optimiser (names, shapes, dtypes). Raises :class:`trainer.errors.BadState`."""
        job = self.job
        assert job is not None
        st.check_like(state.get("model"), job.model.state_dict(), "the model state received")
        try:
            job.model.load_state_dict(state["model"])
            job.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            self.step = int(state["step"])
            epoch, cursor = state["cursor"]
            self.cursor = CursorState(int(epoch), int(cursor))
            self.samples_done = int(state["samples_done"])
            sync.set_rng_state(state["rng"])
            self.speed = batching.speed_from_plain(state["speed"])
            self.sizes = {str(k): int(v) for k, v in state["sizes"].items()}
            self.metrics = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise BadState(f"the state received does not fit this job: {e}") from e

    def checksum(self) -> str:
        """Checksum of the parameters, buffers and optimiser state: equal on every member."""
        assert self.job is not None
        return sync.checksum(self.job.model, self.job.optimizer.state_dict())

    # -- evaluation and the trained model ---------------------------------------------------

    def evaluate(self) -> None:
        """Run the job's ``evaluate`` (rank 0): every metric it returns, and how long it took
        (the head start the others give rank 0 after the next epoch end). Leaves training
        mode on. A metric that is not a number is logged and left out."""
        job = self.job
        assert job is not None and job.evaluate is not None
        t0 = time.perf_counter()
        try:
            got = job.evaluate(job.model) or {}
        except Exception as e:  # noqa: BLE001 - the user's code: one clear error
            raise JobCodeError("evaluate", self.step, 0, e) from e
        job.model.train()
        self.eval_s = time.perf_counter() - t0
        metrics: dict[str, float] = {}
        for k, v in dict(got).items():
            try:
                metrics[str(k)] = float(v)
            except (TypeError, ValueError):
                log.warning("evaluate returned %r=%r, not a number: not reported", k, v)
        self.metrics = metrics

    def write_output(self, why: str) -> None:
        """Write the trained model to ``--output`` (rank 0): a ``state_dict`` of CPU tensors,
        written whole (a temporary file renamed over it), that plain ``torch.load`` reads."""
        path = self.cfg.output
        if path is None:
            if why == "on request":
                log.warning("the trained model was requested, but this worker has no --output")
            return
        assert self.job is not None
        sd = {k: v.detach().to("cpu") for k, v in self.job.model.state_dict().items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(sd, tmp)
        os.replace(tmp, path)
        log.info("trained model written to %s (%s, step %d)", path, why, self.step)

    def finish_model(self) -> None:
        """The end of the job on rank 0: the trained model to ``--output`` and the job's
        ``on_finish`` hook."""
        assert self.job is not None
        self.write_output("at the end")
        if self.job.on_finish is not None:
            try:
                self.job.on_finish(self.job.model)
            except Exception as e:  # noqa: BLE001 - the user's code: one clear error
                log.error("the job's on_finish raised %s: %s", type(e).__name__, e)
                self.failure = f"job {self.cfg.job}: on_finish raised {type(e).__name__}: {e}"

    # -- helpers for the member --------------------------------------------------------------

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

    def log_step(self, rank: int, record: dict[str, Any]) -> None:
        """One committed step: the metrics file line, and a progress line (rank 0) at most
        every ``LOG_EVERY_S`` and at each epoch end."""
        self.append(self.cfg.metrics_file, record)
        if rank != 0:
            return
        now = time.monotonic()
        epoch = int(record["epoch"])
        if now - self._last_log >= LOG_EVERY_S or epoch != self._log_epoch:
            self._last_log, self._log_epoch = now, epoch
            shown = " ".join(f"{k} {v:.4g}" for k, v in sorted(self.metrics.items())
                             if math.isfinite(v))
            log.info("step %d epoch %d/%d loss %.4g world %d%s", record["step"], epoch,
                     self.job.epochs if self.job else 0, record["loss"], record["world"],
                     f" {shown}" if shown else "")

    def append(self, path: Path | None, record: dict[str, Any]) -> None:
        """Append one JSON line to ``path`` (kept open, flushed per line)."""
        if path is not None:
            f = self._files.get(path)
            if f is None:
                f = self._files[path] = path.open("a", buffering=1)
            f.write(json.dumps(record) + "\n")


def _make_feed(job: Job, device: torch.device, workers: int | None) -> Any:
    from trainer.data.feed import Feed

    return Feed(job.train_set, device=device, collate_fn=job.collate_fn, workers=workers)
