"""One run on this machine, from its first check to its report: the lifecycle the embedded
local cloud and AWS/GCP share.

Design: :class:`RunSession` is written once; an :class:`Environment` supplies only what
differs (:class:`~provisioner.daemon.run.local.LocalEnvironment`: the market replayed from a
trace or the built-in generator, worker processes, a work directory;
:class:`~provisioner.daemon.run.cloud.CloudEnvironment`: a cloud driver and price source, a
state file, real time). The order of a run:

1. ``env.check()``: every input that needs no lock (the market, the driver, the token, the
   folders writable). Nothing changes.
2. The run's lock (:class:`~provisioner.daemon.run.lock.RunLock` on ``env.target.lock``),
   recorded in a :class:`~provisioner.daemon.run.lock.Created` journal.
3. The run found there, read read-only (:class:`Found`), and the start decided
   (``env.decide``: fresh, continue, next, finish: :mod:`provisioner.daemon.run.workdir`); a
   new run's job is built once here, one batch through the model, and its limits checked
   (``env.build_job``: :mod:`provisioner.daemon.run.jobcheck`).
4. The metrics port bound; the coordinator bound (``env.coordinator``: a continued run's
   own address and token). A failure in 2-4 undoes what the start created: one line, exit 2.
5. Commit: ``env.commit`` (a finished run archived, folders made), the state opened, the
   run's meta written (:data:`RUN_META`), its registry entry.
6. The daemon built (``env.parts``: driver, price feed, launch environment, by
   :func:`provisioner.daemon.wiring.build_daemon`) and started: a continued run's fleet is
   adopted.
7. Watch, every :data:`WATCH_S`: the verdict (:func:`provisioner.daemon.outcome.verdict`)
   over the ring's stats as the state recorded them (so the job's end is on disk before the
   daemon acts on it), a stop request (SIGINT/SIGTERM), the limits; the environment's
   tick (the local market's job-time outages); the observer's ``watch`` (the dashboard).
8. The end, recorded FIRST (``stopped`` false), then the daemon stopped (the fleet kept or
   terminated: a job that is over is always terminated), the coordinator stopped, the
   registry entry removed, the end marked ``stopped``, the report written; returned as a
   :class:`RunResult`. A daemon killed anywhere in 8 leaves a run its next start only
   finishes stopping (``StartKind.FINISH``: the rest of the fleet ended, the report written,
   nothing launched, no ring started): a run ends once.

The session never prints: lines a person should read (the metrics URL, a run archived) go to
the :class:`Observer` the command gives, and the end is data.

Rule for callers: one session per process, run from the main thread (it installs the
SIGINT/SIGTERM handlers for the run's life and puts the former ones back).
"""

from __future__ import annotations

import dataclasses

import json
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from provisioner.daemon.loop.scheduler import Daemon
from provisioner.daemon.outcome import (Ledger, Verdict, advance, end_record, recorded,
                                        verdict)
from provisioner.daemon.ports import MetricsSink, PriceFeed, RingCoordinator
from provisioner.daemon.run import registry
from provisioner.daemon.run.lock import Created, RunLock, private_files
from provisioner.daemon.run.options import RunOptions
from provisioner.daemon.run.target import Target
from provisioner.daemon.run.workdir import RunIdentity, Start, StartKind
from provisioner.daemon.state import DiskFull, EventKind, State, is_disk_full
from provisioner.daemon.view.metrics import Metrics
from provisioner.daemon.view.status import Status
from provisioner.daemon.wiring import build_daemon
from provisioner.drivers.base import CloudDriver

log = logging.getLogger(__name__)

#: How often the session looks at the run (the verdict, the environment's tick, the
#: dashboard): four times a second reads smoothly and costs nothing next to the ring.
WATCH_S = 0.25
#: Real seconds the ring gets to report the job done once it reached --until-epochs (the job
#: ends there by itself: its last step, its evaluate, its on_finish) before the run is cut.
LIMIT_GRACE_S = 30.0
#: How often the end of a run is tried again while the disk is full.
DISK_RETRY_S = 1.0
#: The state meta a start reads from the run found there (read-only, before the lock's run).
FOUND_KEYS = ("run", "coordinator", "clock", "finished", "started_at", "ring", "code")


@dataclass(frozen=True)
class Found:
    """What a start reads of the run found at its place (nothing when there is none)."""

    has_state: bool = False
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> "Found":
        """The run in the state at ``path``, read read-only (see
        :meth:`provisioner.daemon.state.State.read_only`)."""
        if not path.exists():
            return cls()
        st = State.read_only(path)
        try:
            return cls(True, {k: st.get_meta(k) for k in FOUND_KEYS})
        finally:
            st.close()

    @property
    def run(self) -> dict[str, Any]:
        """The ``run`` meta; a state older than it that says ``finished`` reads as done."""
        run = self.meta.get("run")
        if run:
            return dict(run)
        return {"ended": {"outcome": "done"}} if self.meta.get("finished") else {}

    def get(self, key: str) -> Any:
        return self.meta.get(key)


def _job_error(state: State) -> str | None:
    """The job error a worker reported (the daemon's ``job-error`` event), or None."""
    found = state.events(limit=1, kinds=[EventKind.JOB_ERROR])
    return found[-1].detail if found else None


@dataclass(frozen=True)
class Parts:
    """The edges a daemon is built over (:func:`provisioner.daemon.wiring.build_daemon`)."""

    driver: CloudDriver
    source: PriceFeed
    launch_env: Mapping[str, str]
    logs: Any = None  # a cloud's shipped worker logs (provisioner.drivers.shiplog), or None


class Environment(Protocol):
    """What differs between a local and a cloud run (see the module docstring)."""

    target: Target  # the run's files: state, lock, log
    report_dir: Path  # --report, else the target's default
    speed: float  # simulated seconds per real second (1.0 on a cloud)
    default_on_exit: str  # the fleet at exit when --on-exit is not given

    def check(self) -> list[str]:
        """Every input that needs no lock (a local run builds its job here). Returns lines
        for the person; raises UserError; changes nothing."""

    def build_job(self) -> list[str]:
        """Build the job once here, before anything is launched (a new run only). Returns
        lines for the person; raises UserError naming --job and the cause."""

    def decide(self, found: Found) -> Start:
        """Fresh, continue or next for the run found. Raises UserError naming the fix."""

    def coordinator(self, start: Start, found: Found, run_id: str,
                    created: Created) -> RingCoordinator | None:
        """The ring's coordinator, started (None: no ring in this daemon). Records what it
        created in ``created``. Raises UserError."""

    def commit(self, start: Start, run_id: str) -> list[str]:
        """The first changes before the state opens; returns lines for the person."""

    def identity(self) -> RunIdentity:
        """What makes two starts the same run."""

    def clock(self, state: State, start: Start, found: Found) -> Callable[[], datetime]:
        """The run's clock (kept in the state where it is simulated)."""

    def parts(self, state: State, coordinator: RingCoordinator | None,
              now: Callable[[], datetime]) -> Parts:
        """The driver, the price feed and what every launch carries."""

    def begin(self, daemon: Daemon) -> None:
        """Right before the daemon starts (the local market's job-time outages)."""

    def tick(self, daemon: Daemon) -> None:
        """Once per :data:`WATCH_S` while the run goes on."""

    def crash_loop(self, state: State) -> str | None:
        """Why the workers keep failing before any joined, or None."""

    def notes(self) -> list[str]:
        """Lines for the report's notes (the market, the speed)."""

    def registry_id(self, run_id: str) -> str:
        """The id ``provision list`` shows for the run."""

    def fleet_driver(self, now: Callable[[], datetime]) -> CloudDriver:
        """The driver alone, to end a fleet (it launches nothing: no worker command)."""


class Observer(Protocol):
    """What the command shows while the run goes on (the session itself never prints)."""

    def note(self, line: str) -> None:
        """A line for the person running it (the metrics URL, a finished run archived)."""

    def watch(self, status: Callable[[int], Status], t0: float) -> None:
        """Every :data:`WATCH_S` while the run goes on; ``status(n)`` is the view with the
        ``n`` newest events, ``t0`` the run's (simulated) start."""

    def closing(self, status: Callable[[int], Status], t0: float) -> None:
        """Once, when the run stops (before the fleet is stopped)."""


class Quiet:
    """An :class:`Observer` that shows nothing (tests, benchmarks); notes go to the log."""

    def note(self, line: str) -> None:
        log.info("%s", line)

    def watch(self, status: Callable[[int], Status], t0: float) -> None:
        return None

    def closing(self, status: Callable[[int], Status], t0: float) -> None:
        return None


@dataclass(frozen=True)
class RunResult:
    """How a run ended: its verdict, the report's figures and where the report is."""

    verdict: Verdict
    figures: Mapping[str, Any]
    report: Path | None  # report.md (None: not written, the disk was full)
    fleet_kept: bool
    run_id: str
    model: Path | None = None  # the trained model written at the end (local runs), if any

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


class RunSession:
    """The life of one run (see the module docstring).

    ``open_state`` opens the run's state (the seam where a test counts the state's writes and
    kills the daemon at one of them).
    """

    def __init__(self, options: RunOptions, env: Environment,
                 observer: Observer | None = None, *, signals: bool = True,
                 open_state: Callable[[Path], State] = State) -> None:
        self.options = options
        self.env = env
        self.observer: Observer = observer or Quiet()
        self.signals = signals
        self.open_state = open_state
        self.stop = threading.Event()
        self.verdict: Verdict | None = None
        self.daemon: Daemon | None = None
        self._old_handlers: dict[int, Any] = {}
        self._signals_seen = 0
        self._waiting_noted = False
        self._limit_seen: float | None = None

    @property
    def on_exit(self) -> str:
        return self.options.on_exit or self.env.default_on_exit

    def request_stop(self) -> None:
        """Stop the run as Ctrl-C does (drain, then keep or terminate the fleet)."""
        self.stop.set()

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run until the verdict (see the module docstring). Raises UserError (one line, exit
        2) for bad input, with nothing changed. Everything the run creates (its folders and
        files, its workers' too) is its owner's alone whatever the umask
        (:func:`provisioner.daemon.run.lock.private_files`)."""
        with private_files():
            result = self._run_all()
        model = getattr(self.env, "model_path", None)
        if isinstance(model, Path) and model.is_file():
            result = dataclasses.replace(result, model=model)
        return result

    def _run_all(self) -> RunResult:
        env = self.env
        for line in env.check():
            self.observer.note(line)
        registry.check_name(self.options.name, env.target.state)
        created = Created()
        lock = RunLock(env.target.lock, env.target.what)
        lock.acquire(created)
        metrics = Metrics()
        coordinator: RingCoordinator | None = None
        try:
            try:
                found = Found.read(env.target.state)
                start = env.decide(found)
                if start.kind is StartKind.FINISH:
                    return self._finish_stop(start, found)
                if start.kind in (StartKind.FRESH, StartKind.NEXT):
                    for line in env.build_job():  # a continued run's was built at its start
                        self.observer.note(line)
                run_id = start.run_id()
                endpoint = self.options.metrics_endpoint
                if endpoint is not None:
                    host, port = endpoint
                    self.observer.note(f"metrics: http://{host}:{metrics.serve(port, host)}"
                                       f"/metrics")
                coordinator = env.coordinator(start, found, run_id, created)
            except BaseException:
                if coordinator is not None:
                    coordinator.stop()
                metrics.close()
                lock.release()
                created.undo()
                raise
            return self._run(start, found, run_id, coordinator, metrics, lock)
        finally:
            metrics.close()
            lock.release()

    def _commit(self, start: Start, run_id: str, coordinator: RingCoordinator | None) -> State:
        """The first changes: the environment's, the state opened, the run's meta."""
        for line in self.env.commit(start, run_id):
            self.observer.note(line)
        state = self.open_state(self.env.target.state)
        previous = (state.get_meta("run") or {}) if start.kind is StartKind.CONTINUE else {}
        name = self.options.name or previous.get("name")
        if (state.get_meta("ring") or {}).get("outcome", "running") != "running":
            state.set_meta("ring", {})  # a continued lost or failed ring: its new life decides
        state.set_meta("run", {"id": run_id, "name": name,
                               "identity": self.env.identity().as_meta(),
                               "ended": None, "previous_end": previous.get("ended")})
        state.set_meta("finished", False)
        if coordinator is not None:
            host, port = coordinator.address
            state.set_meta("coordinator", {"host": host, "port": port})
        # the checkpoint-restart baseline checkpoints as often as this run snapshots
        # (simulated seconds, :mod:`provisioner.daemon.view.savings`)
        state.set_meta("baseline", {"checkpoint_every_s":
                                    self.options.settings.snapshot.every_s})
        return state

    def _run(self, start: Start, found: Found, run_id: str,
             coordinator: RingCoordinator | None, metrics: MetricsSink,
             lock: RunLock) -> RunResult:
        env, o = self.env, self.options
        daemon: Daemon | None = None
        terminate = False
        try:
            state = self._commit(start, run_id, coordinator)
            name = (state.get_meta("run") or {}).get("name")
            config = str(Path(o.config).resolve()) if o.config else None
            registry.register(run_id=env.registry_id(run_id), driver=env.target.driver,
                              workdir=env.target.root, state=env.target.state,
                              lock=lock.path, job=o.job, log=o.detached_log, config=config,
                              name=name)
            registry.remember(name, driver=env.target.driver, workdir=env.target.root,
                              state=env.target.state, config=config)
            now = env.clock(state, start, found)
            if start.kind is StartKind.CONTINUE:
                state.record_event(now().timestamp(), EventKind.CONTINUED,
                                   detail=f"run {start.previous_id}: adopting its fleet")
            parts = env.parts(state, coordinator, now)
            daemon = build_daemon(o.settings, parts.driver, parts.source, state, now=now,
                                  speed=env.speed, coordinator=coordinator, metrics=metrics,
                                  launch_env=parts.launch_env, logs=parts.logs)
            self.daemon = daemon
            env.begin(daemon)
            self._install_signals()
            daemon.start()
            t0 = float(state.get_meta("started_at") or daemon.now().timestamp())
            self._watch(daemon, t0)
        finally:
            v = self.verdict
            terminate = v is not None and (v.job_over or self.on_exit == "terminate")
            if daemon is not None and v is not None:
                # the end first, then the stop: a daemon killed from here on leaves a run its
                # next start finishes stopping, never one it trains again
                ring = coordinator.stats() if coordinator is not None else {}
                self._durably(lambda: self._record_end(
                    daemon.state, daemon.now().timestamp(), v, ring, fleet_kept=not terminate,
                    stopped=False))
            if daemon is not None:  # an unexpected error keeps the fleet: a restart adopts it
                daemon.stop("terminate" if terminate else "keep")
            ring = {}
            if coordinator is not None:
                ring = coordinator.stats()
                coordinator.stop()
            self._restore_signals()
            registry.unregister()
        assert daemon is not None and self.verdict is not None
        end_t = daemon.now().timestamp()
        v = self.verdict
        self._durably(lambda: self._record_end(daemon.state, end_t, v, ring,
                                               fleet_kept=not terminate, stopped=True))
        return self._report(daemon.state, end_t, ring, self.verdict, not terminate, run_id)

    def _watch(self, daemon: Daemon, t0: float) -> None:
        o = self.options
        status = daemon.status
        try:
            while True:
                # the ring as the state recorded it (telemetry, every metrics period), not as
                # the coordinator says it now: the daemon acts on the job's end only once that
                # end is on disk, so a daemon killed at any later moment leaves a state that
                # says the job is over
                stats = daemon.state.get_meta("ring") or {}
                v = verdict(stats, interrupted=self.stop.is_set(),
                            crash_loop=self.env.crash_loop(daemon.state),
                            job_error=_job_error(daemon.state),
                            until_epochs=self._epochs_limit(stats),
                            elapsed_s=daemon.now().timestamp() - t0,
                            duration_s=o.duration_s, duration_text=o.duration_text,
                            until_steps=o.until_steps)
                if v is not None:
                    self.verdict = v
                    return
                try:
                    self.env.tick(daemon)
                except DiskFull:  # said once by the state; the tick comes again
                    pass
                self.observer.watch(status, t0)
                self.stop.wait(WATCH_S)
        finally:
            self.observer.closing(status, t0)

    def _durably(self, write: Callable[[], None]) -> None:
        """``write``, again every :data:`DISK_RETRY_S` while the disk is full (the state said
        so once): the run's end is recorded before anything is stopped, whatever it waits
        for. A second SIGINT/SIGTERM gives up waiting (the fleet is then kept, as after a
        crash: the next start adopts it)."""
        while True:
            try:
                write()
                return
            except DiskFull:
                if self._signals_seen >= 2:
                    raise
                if not self._waiting_noted:
                    self._waiting_noted = True
                    self.observer.note("waiting for disk space to record the run's end "
                                       "(Ctrl-C again: exit now and keep the fleet)")
                time.sleep(DISK_RETRY_S)

    def _epochs_limit(self, stats: Mapping[str, Any]) -> int | None:
        """``--until-epochs`` as the verdict should apply it: the job was checked to end there
        by itself (its on_finish runs), so the ring gets :data:`LIMIT_GRACE_S` to report it
        done before the run is cut at the limit."""
        limit = self.options.until_epochs
        if not limit or int(stats.get("epoch") or 0) < limit:
            return None
        if self._limit_seen is None:
            self._limit_seen = time.monotonic()
        return limit if time.monotonic() - self._limit_seen >= LIMIT_GRACE_S else None

    @staticmethod
    def _record_end(state: State, t: float, v: Verdict, ring: Mapping[str, Any], *,
                    fleet_kept: bool, stopped: bool) -> None:
        """The run's end in its ``run`` meta (one transaction with the ring's stats and
        ``finished``): first with ``stopped`` false, before anything is stopped; again with
        ``stopped`` true once the fleet is kept or terminated."""
        from provisioner.clio import finite

        run = dict(state.get_meta("run") or {})
        run["ended"] = end_record(v, t, fleet_kept=fleet_kept, stopped=stopped)
        values: dict[str, Any] = {"run": run, "finished": True}
        if ring:
            values["ring"] = finite({k: v for k, v in ring.items() if k != "rejected"})
            # the ledger too, as the telemetry keeps it beside the ring (Telemetry.keep_ledger):
            # its newest step is what a rerun that resumes from a snapshot counts as lost
            # (from the last telemetry look instead, a Ctrl-C at step 255 resumed from 40
            # counted 198 steps lost, not 215)
            values["ledger"] = advance(Ledger.from_meta(state.get_meta("ledger")),
                                       ring).as_meta()
        state.set_metas(values)

    def _report(self, state: State, end_t: float, ring: Mapping[str, Any], v: Verdict,
                fleet_kept: bool, run_id: str) -> RunResult:
        from provisioner.daemon.view.report import figures, write_report

        out = self.env.report_dir
        try:
            run = state.get_meta("run") or {}
            title = f"spotring run {run.get('name') or run_id}: {self.options.job}"
            path: Path | None = write_report(state, out, end_t, ring, title=title,
                                             notes=self.env.notes() + [f"stopped: {v.reason}"])
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            log.warning("%s: the report was not written (%s); its figures are in the "
                        "state: provision status", out, exc)
            return RunResult(v, figures(state, end_t, ring), None, fleet_kept, run_id)
        return RunResult(v, json.loads((Path(out) / "report.json").read_text()), path,
                         fleet_kept, run_id)

    def _finish_stop(self, start: Start, found: Found) -> RunResult:
        """A run whose end was recorded but whose daemon was killed while stopping it: end
        what is left of its fleet (nothing is launched, no ring is started), mark it
        stopped, write its report and return its recorded verdict."""
        from provisioner.daemon.run.down import end_fleet

        from provisioner.daemon.run.workdir import ring_end

        env = self.env
        ended = found.run.get("ended") or {}
        v = recorded(ended) if ended else ring_end(start.ring or found.get("ring") or {},
                                                   found.run)
        assert v is not None, "decide_start finishes only a run whose end was decided"
        run_id = start.run_id()
        self.observer.note(f"run {run_id} ended ({v.reason}) but its daemon stopped before "
                           f"the fleet did: finishing its stop, nothing is trained again")
        state = self.open_state(env.target.state)
        try:
            now = env.clock(state, start, found)
            job = (state.get_meta("job") or {}).get("id") or self.options.settings.job.id
            ring = {**(state.get_meta("ring") or {}), **(start.ring or {})}
            if not ended:  # the ring's end was recorded, the run's was not: record it now
                self._record_end(state, now().timestamp(), v, ring, fleet_kept=False,
                                 stopped=False)
            ids = end_fleet(job, env.fleet_driver(now), state, lambda: now().timestamp(),
                            f"the run's end ({v.reason}), finished after a restart")
            if ids:
                self.observer.note(f"terminated what was left of its fleet: {', '.join(ids)}")
            end_t = now().timestamp()
            state.record_event(end_t, EventKind.STOPPED,
                               detail="the run's stop, finished after a restart")
            self._record_end(state, end_t, v, ring, fleet_kept=False, stopped=True)
            return self._report(state, end_t, ring, v, False, run_id)
        finally:
            state.close()

    # -- signals -----------------------------------------------------------------------------
    def _install_signals(self) -> None:
        if not self.signals:
            return

        def on_signal(signum: int, _frame: Any) -> None:
            self._signals_seen += 1
            self.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, on_signal)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()
