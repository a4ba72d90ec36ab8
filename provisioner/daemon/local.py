"""The main job on this machine: ``provision run`` with the embedded local cloud.

Design: :class:`LocalRun` wires the whole loop here:

- the market: ``--trace PATH`` (any format :func:`pricing.sources.trace.load_trace` reads;
  availability-only traces get generated prices, :func:`pricing.sources.synthetic.
  fill_prices`), else the seeded built-in market of :mod:`pricing.sources.synthetic`;
  replayed at ``--speed`` on a clock kept in the state, so a restarted daemon goes on at the
  simulated time its workers are at;
- the ring: the trainer's coordinator inside this process
  (:func:`provisioner.daemon.wiring.make_coordinator`), storing the ring's snapshots in
  ``WORKDIR/snapshots`` (or ``[snapshot] url``); instances are ``python -m trainer worker``
  processes started by the local driver in their own sessions (their argv:
  :func:`worker_argv`), training ``job.job_file`` (``--job``; default the packaged ``spotring_examples.digits``). Workers outlive
  the daemon: it is not in the data path;
- the end (:func:`provisioner.daemon.outcome.verdict`): ``--until-epochs`` (passed to the
  example as ``DIGITS_EPOCHS``), ``--duration`` (simulated, the run's total), the job
  finishing, lost or failed (exit 3 or 4, the fleet terminated), workers that never join
  (exit 2), or Ctrl-C/SIGTERM (drain, stop, terminate the fleet unless ``--on-exit keep``);
- the report: ``--report DIR`` (default ``WORKDIR/report``), see :mod:`provisioner.daemon.report`.

The start changes nothing until every input is known good: flags, market and job file are
checked, the report folder probed, the work directory's lock taken (a second run on it is
refused, :mod:`provisioner.daemon.lock`), the run found there read read-only and the start
decided (fresh, continue or next: :mod:`provisioner.daemon.workdir`), the metrics port and
the coordinator bound (a continued run's on its own address and token). A failure in any of
these undoes what the start created and is one line, exit 2. Only then is the state opened
and the daemon started; a continued run's fleet is adopted, never wiped.

Rule for callers: pass settings whose ``job.job_file`` went through
:func:`provisioner.daemon.jobspec.check_job` (``provision run`` does). The work directory is never wiped: a finished run is moved to ``WORKDIR/runs/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pricing.sources import synthetic
from pricing.sources.synthetic import AvailabilityIndex
from provisioner.config import Settings
from provisioner.daemon import registry
from provisioner.daemon.lock import Created, RunLock, writable_folder
from provisioner.daemon.metrics import Metrics
from provisioner.daemon.outcome import Verdict, verdict
from provisioner.daemon.ports import PriceFeed, RingCoordinator
from provisioner.daemon.savings import pct
from provisioner.daemon.scheduler import Daemon
from provisioner.daemon.state import EventKind, State, ring_kind
from provisioner.daemon.wiring import build_daemon, make_coordinator, snapshot_url
from provisioner.daemon.workdir import (RunIdentity, Start, StartKind, Workdir, archive,
                                        decide_start)
from provisioner.errors import UserError

log = logging.getLogger(__name__)

#: The shortest real interval between snapshots of a local run. ``[snapshot] every_s`` is in
#: simulated seconds like every other period of a local run (the coordinator gets
#: ``every_s / speed``); below a second the snapshots would cost the ring more than the 1%
#: issue 15 allows on this machine.
MIN_SNAPSHOT_REAL_S = 1.0
#: Workers exiting this many times with none ever joining the ring stop the run (a broken job
#: file or interpreter would otherwise be relaunched forever, each launch paid for).
CRASH_LOOP_EXITS = 4


def worker_argv(python: str, coordinator: str, token_file: Path, job: str, name: str,
                slowdown: float, metrics_dir: Path, samples_dir: Path | None,
                extra: Sequence[str] = ()) -> list[str]:
    """The one command line of a worker: ``python -m trainer worker --coordinator HOST:PORT
    --token-file F --job J --name N ...``."""
    argv = [python, "-m", "trainer", "worker", "--coordinator", coordinator,
            "--token-file", str(token_file), "--job", job, "--name", name,
            "--slowdown", f"{slowdown:.4f}", "--threads", "1", "--no-rejoin",
            "--metrics-file", str(metrics_dir / f"{name}.jsonl")]
    if samples_dir is not None:
        argv += ["--record-samples", str(samples_dir / f"{name}.jsonl")]
    return argv + list(extra)


@dataclass
class Prepared:
    """What a start holds once every check passed (before anything was committed)."""

    start: Start
    run_id: str
    found: Mapping[str, Any]  # the meta of the run found in the workdir
    coordinator: RingCoordinator
    token_file: Path


class LocalRun:
    """The main job on this machine (see the module docstring)."""

    def __init__(self, settings: Settings, args: argparse.Namespace,
                 duration: float | None) -> None:
        self.settings = settings
        self.args = args
        self.speed = args.speed or settings.local.speed
        self.duration = duration
        self.wd = Workdir(Path(args.workdir or settings.local.state_dir).resolve())
        self.workdir = self.wd.root
        self.report_dir = Path(args.report).resolve() if args.report else self.wd.report
        self.on_exit = args.on_exit or "terminate"
        self.stop = threading.Event()
        self.interrupted = False
        self.verdict: Verdict | None = None
        self._old_handlers: dict[int, Any] = {}
        self._driver: Any = None
        self._outages: Any = None

    # -- inputs (nothing changes) ------------------------------------------------------------
    def market(self) -> tuple[Any, list[str]]:
        """The snapshot to replay and notes; raises on a bad trace (nothing started yet)."""
        from dataclasses import replace

        from pricing.sources.trace import load_trace

        if self.args.trace:
            for p in self.args.trace:
                if not Path(p).exists():
                    raise UserError(f"--trace {p}: no such file or folder (see "
                                    f"../shared/data/README.md for real traces)")
            snap = synthetic.fill_prices(load_trace(self.args.trace),
                                         synthetic.GeneratorParams(seed=self.args.seed))
            origin = ", ".join(self.args.trace)
        else:
            params = synthetic.GeneratorParams(seed=self.args.seed)
            if self.args.outages_per_hour is not None:
                params = replace(params, outages_per_hour=self.args.outages_per_hour)
            snap = synthetic.generate(params)
            origin = "the built-in generator"
            if self.job_outages(params):
                origin += (" with job-time outages at "
                           + ", ".join(f"{o.at:.0%} ({'notice' if o.notice else 'kill'})"
                                       for o in params.job_outages) + " of the job")
        return snap, [origin, *snap.notes[-3:]]

    def job_outages(self, params: synthetic.GeneratorParams) -> tuple:
        """The built-in market's job-time outages this run meets: none with a ``--trace`` (the
        trace is the market), with ``--outages-per-hour 0`` (revocations only by hand) or
        without ``--until-epochs`` (no known length to place them in)."""
        if self.args.trace or not self.args.until_epochs or params.outages_per_hour <= 0:
            return ()
        return params.job_outages

    def identity(self, job_spec: str) -> RunIdentity:
        """This start's :class:`RunIdentity` (a continued run must have the same)."""
        if self.args.trace:
            market = "trace " + ", ".join(str(Path(p).resolve()) for p in self.args.trace)
        else:
            rate = self.args.outages_per_hour
            if rate is None:
                rate = synthetic.GeneratorParams().outages_per_hour
            market = f"generator seed {self.args.seed}, {rate:g} outages/h"
        return RunIdentity(self.settings.job.id, job_spec, self.args.until_epochs, market)

    def usable(self, snap: Any) -> tuple[Any, datetime]:
        """Keep quotes of offerings this run can use; the replay starts at the first one."""
        from dataclasses import replace

        from pricing import sanity
        from provisioner.drivers.local import slowdown_for
        from provisioner.errors import DriverError
        from provisioner.plan.throughput import ThroughputModel

        job = self.settings.job
        model = ThroughputModel(priors=job.throughput_priors, unit=job.samples_per_s_per_unit)
        quotes, _rejected = sanity.check(snap.quotes)
        ok = []
        why: set[str] = set()
        for q in quotes:
            if q.offering.market not in self.settings.fleet.markets and not (
                    q.on_demand_per_hour and "on-demand" in self.settings.fleet.markets):
                why.add(f"market {q.offering.market} not in fleet.markets")
                continue
            try:
                model.samples_per_s(q.offering.instance_type)
                slowdown_for(q.offering.instance_type)
            except (KeyError, DriverError):
                why.add(f"{q.offering.instance_type}: no GPU throughput prior")
                continue
            ok.append(q)
        if not ok:
            src = ", ".join(self.args.trace or ["generator"])
            raise UserError(f"--trace {src}: no usable offerings ("
                            + ("; ".join(sorted(why)[:3]) or "no prices")
                            + "); give a trace with GPU spot prices or availability of "
                            "p3/p2 types, or no --trace for the built-in generator")
        start = min(q.time for q in ok)
        return replace(snap, quotes=tuple(ok)), start

    def job_spec(self) -> str:
        """The job the workers train: ``job.job_file`` as ``provision run`` checked it
        (:func:`provisioner.daemon.jobspec.check_job`: an absolute path or a module)."""
        return self.settings.job.job_file

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        snap, notes = self.market()
        snap, start = self.usable(snap)
        job_spec = self.job_spec()
        identity = self.identity(job_spec)
        writable_folder(self.workdir, "--workdir")
        writable_folder(self.report_dir, "--report")
        created = Created()
        lock = RunLock(self.wd.lock, f"--workdir {self.workdir}")
        lock.acquire(created)
        metrics = Metrics()
        try:
            try:
                ready = self._prepare(identity, metrics, created)
            except BaseException:
                metrics.close()
                lock.release()
                created.undo()
                raise
            return self._run(ready, identity, snap, start, notes, job_spec, metrics)
        finally:
            metrics.close()
            lock.release()

    def _prepare(self, identity: RunIdentity, metrics: Metrics, created: Created) -> Prepared:
        """Every check that needs the lock; binds the metrics port and the coordinator."""
        found: dict[str, Any] = {}
        has_state = self.wd.state.exists()
        if has_state:
            st = State.read_only(self.wd.state)
            try:
                found = {k: st.get_meta(k) for k in ("run", "coordinator", "clock",
                                                     "finished", "started_at")}
            finally:
                st.close()
        run_meta = found.get("run") or ({"ended": {"outcome": "done"}}
                                        if found.get("finished") else {})
        start = decide_start(run_meta, has_state, identity, f"--workdir {self.workdir}")
        endpoint = getattr(self.args, "metrics_endpoint", None)
        if endpoint is not None:
            host, port = endpoint
            print(f"metrics: http://{host}:{metrics.serve(port, host)}/metrics", flush=True)
        token = self._token(start, created)
        run_id = start.run_id()
        if self.settings.snapshot.url is None:  # the default store: a folder the start made
            created.mkdirs(self.wd.snapshots / run_id)
        coordinator = self._coordinator(start, found, token, run_id)
        return Prepared(start, run_id, found, coordinator, self.wd.token)

    def _token(self, start: Start, created: Created) -> bytes:
        """The run's token: the one in ``WORKDIR/token`` (a continued run's workers hold it),
        else a new one. Raises UserError when it is gone while the run's workers live."""
        from provisioner.drivers.local import running
        from trainer.protocol.admission import read_token_file, write_token_file

        path = self.wd.token
        try:
            return read_token_file(path)
        except (OSError, ValueError):
            pass
        alive = running(self.wd.cloud, self.settings.job.id) if start.kind is \
            StartKind.CONTINUE else []
        if alive:
            pids = " ".join(str(r["pid"]) for r in alive)
            raise UserError(f"{path}: missing or empty, but this run's {len(alive)} workers "
                            f"hold its token; put the file back to continue the run, or end "
                            f"them (kill {pids}) and start again (the job resumes from its "
                            f"snapshots)")
        existed = path.exists()
        token = write_token_file(path)
        if not existed:
            created.file(path)
        return token

    def _coordinator(self, start: Start, found: Mapping[str, Any], token: bytes,
                     run_id: str) -> RingCoordinator:
        """The coordinator, on the continued run's address (its workers dial it), keeping
        this run's snapshots (``.../<run id>``: never another run's)."""
        d = self.settings.daemon
        host, port = d.coordinator_host, d.coordinator_port
        prev = found.get("coordinator") if start.kind is StartKind.CONTINUE else None
        if prev:
            if port not in (0, prev["port"]) or host != prev["host"]:
                raise UserError(f"daemon.coordinator_host/port {host}:{port}: this run's "
                                f"workers dial {prev['host']}:{prev['port']}; leave them unset "
                                f"to continue it, or pick another --workdir")
            host, port = prev["host"], prev["port"]
        snap = self.settings.snapshot
        if snap.every_s > 0:  # simulated seconds, as every period of a local run
            snap = snap.model_copy(update={"every_s": max(MIN_SNAPSHOT_REAL_S,
                                                          snap.every_s / self.speed)})
        try:
            url = snapshot_url(self.settings, self.wd.snapshots)
            return make_coordinator(host, port, token, heartbeat_timeout_s=5.0, snapshot=snap,
                                    snapshot_url=url and f"{url}/{run_id}")
        except UserError as exc:
            if not prev:
                raise
            raise UserError(f"{host}:{port}: this run's coordinator address (its workers "
                            f"dial it) is busy; stop what listens there and start again "
                            f"({exc})") from None

    def _commit(self, ready: Prepared, identity: RunIdentity) -> State:
        """The first changes: the finished run archived, the folders, the state's meta."""
        start = ready.start
        if start.kind is StartKind.NEXT:
            dest = archive(self.wd, start.previous_id, self.report_dir)
            print(f"the finished run in {self.workdir} moved to {dest}", flush=True)
        self.wd.workers.mkdir(exist_ok=True)
        self.wd.samples.mkdir(exist_ok=True)
        state = State(self.wd.state)
        run = dict(state.get_meta("run") or {}) if start.kind is StartKind.CONTINUE else {}
        state.set_meta("run", {"id": ready.run_id, "identity": identity.as_meta(), "ended": None,
                               "previous_end": run.get("ended")})
        host, port = ready.coordinator.address
        state.set_meta("coordinator", {"host": host, "port": port})
        # the checkpoint-restart baseline checkpoints as often as this run snapshots
        # (simulated seconds, :mod:`provisioner.daemon.savings`)
        state.set_meta("baseline", {"checkpoint_every_s": self.settings.snapshot.every_s})
        return state

    def _clock(self, state: State, trace_start: datetime, ended: Mapping[str, Any] | None,
               continuing: bool) -> Callable[[], datetime]:
        """The simulated clock, kept in the state: a run continued after a crash goes on at
        the time its workers are at (the clock kept running); after a clean stop that
        terminated the fleet it goes on from the stop (nothing ran meanwhile)."""
        from pricing.sources.trace import ReplayClock

        saved = state.get_meta("clock") if continuing else None
        now = time.time()
        if saved:
            old = ReplayClock(datetime.fromisoformat(saved["trace_start"]),
                              float(saved["wall_start"]), float(saved["speed"]), time.time)
            paused = bool(ended and not ended.get("fleet_kept") and ended.get("t") is not None)
            if paused or old.speed != self.speed:
                at = (datetime.fromtimestamp(float(ended["t"]), timezone.utc)  # type: ignore[index]
                      if paused else old.trace_time(now))
                clock = ReplayClock(at, now, self.speed, time.time)
            else:
                clock = old
        else:
            clock = ReplayClock(trace_start, now, self.speed, time.time)
        state.set_meta("clock", {"trace_start": clock.trace_start.isoformat(),
                                 "wall_start": clock.wall_start, "speed": clock.speed})
        return clock.trace_time

    def _run(self, ready: Prepared, identity: RunIdentity, snap: Any, trace_start: datetime,
             notes: list[str], job_spec: str, metrics: Metrics) -> int:
        from pricing.sources.trace import TraceSource

        coordinator = ready.coordinator
        daemon = None
        ring: dict[str, Any] = {}
        try:
            state = self._commit(ready, identity)
            detached = os.environ.get("SPOTRING_DETACHED_LOG")
            registry.register(run_id=ready.run_id, driver="local", workdir=self.wd.root,
                              state=self.wd.state, lock=self.wd.lock, job=job_spec,
                              log=Path(detached) if detached else None, config=self.args.config)
            continuing = ready.start.kind is StartKind.CONTINUE
            prev_end = (ready.found.get("run") or {}).get("ended") if continuing else None
            now = self._clock(state, trace_start, prev_end, continuing)
            if continuing:
                state.record_event(now().timestamp(), EventKind.CONTINUED,
                                   detail=f"run {ready.start.previous_id}: adopting its fleet")
            daemon = self._daemon(TraceSource([], snapshot=snap), now, coordinator,
                                  ready.token_file, job_spec,
                                  AvailabilityIndex(snap.availability), metrics, state)
            self._outages = self._job_time_outages(daemon, coordinator)
            self._signals()
            daemon.start()
            t0 = float(state.get_meta("started_at") or daemon.now().timestamp())
            self._watch(daemon, t0)
        finally:
            v = self.verdict
            terminate = v is not None and (v.job_over or self.on_exit == "terminate")
            if daemon is not None:  # an unexpected error keeps the fleet: a restart adopts it
                daemon.stop("terminate" if terminate else "keep")
            ring = coordinator.stats()
            coordinator.stop()
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            registry.unregister()
        assert daemon is not None and self.verdict is not None
        return self._finish(daemon, ring, notes, self.verdict, terminate)

    def _daemon(self, source: PriceFeed, now: Callable[[], datetime],
                coordinator: RingCoordinator, token_file: Path, job: str,
                availability: AvailabilityIndex, metrics: Metrics, state: State) -> Daemon:
        from provisioner.drivers.local import LocalDriver

        host, port = coordinator.address
        samples = self.wd.samples if self.args.record_samples else None
        loc = self.settings.local
        workers = self.wd.workers

        def command(spec: Any) -> list[str]:
            return worker_argv(loc.python or sys.executable, f"{host}:{port}", token_file, job,
                               spec.instance_id, spec.slowdown, workers, samples,
                               loc.worker_args)

        driver = LocalDriver(self.wd.cloud, command, clock=now, availability=availability,
                             notice_window_s=loc.notice_window_s,
                             hard_kill_every=loc.hard_kill_every)
        self._driver = driver
        env = {"OMP_NUM_THREADS": "1", "SPOTRING_LOG": os.environ.get("SPOTRING_LOG", "WARNING")}
        if self.args.until_epochs:
            env["DIGITS_EPOCHS"] = str(self.args.until_epochs)
        return build_daemon(self.settings, driver, source, state, now=now, speed=self.speed,
                            coordinator=coordinator, metrics=metrics, launch_env=env)

    def _job_time_outages(self, daemon: Daemon, coordinator: RingCoordinator) -> Any:
        """The built-in market's job-time outages (:mod:`provisioner.daemon.outages`), or None."""
        from dataclasses import replace

        from provisioner.daemon.outages import META_KEY, JobTimeOutages

        params = synthetic.GeneratorParams(seed=self.args.seed)
        if self.args.outages_per_hour is not None:
            params = replace(params, outages_per_hour=self.args.outages_per_hour)
        schedule = self.job_outages(params)
        if not schedule:
            return None
        state, driver = daemon.state, self._driver

        def active() -> set[str]:
            return {m.name for m in coordinator.members() if m.state == "active"}

        def live() -> list[tuple[str, float]]:
            return [(r.id, r.launched_at) for r in state.live_instances()
                    if r.draining_since is None]

        def revoke(iid: str, hard: bool, source: str) -> bool:
            return bool(driver.revoke(iid, hard=hard, source=source))

        return JobTimeOutages(schedule, int(self.args.until_epochs), stats=coordinator.stats,
                              active=active, live=live, revoke=revoke,
                              fired=int(state.get_meta(META_KEY) or 0),
                              on_fired=lambda n: state.set_meta(META_KEY, n))

    def _signals(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            self.interrupted = True
            self.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, on_signal)

    def _crash_loop(self, daemon: Daemon) -> str | None:
        """Workers that keep exiting without ever joining mean a broken job or worker set-up."""
        exits = daemon.state.events(kinds=[EventKind.EXITED])
        if len(exits) < CRASH_LOOP_EXITS or daemon.state.events(kinds=[ring_kind("join")], limit=1):
            return None
        log_file = self.wd.cloud / "logs" / f"{exits[-1].instance_id}.log"
        tail = ""
        try:
            lines = [ln for ln in log_file.read_text().splitlines() if ln.strip()]
            tail = f": {lines[-1][:200]}" if lines else ""
        except OSError:
            pass
        return (f"{len(exits)} workers exited before any joined the ring (see {log_file}"
                f"{tail}); check job.job_file and local.worker_args")

    def _watch(self, daemon: Daemon, t0: float) -> None:
        live = None
        if not self.args.no_dashboard and sys.stdout.isatty():
            from rich.live import Live

            live = Live(self._frame(daemon, t0, None), refresh_per_second=4, transient=False,
                        vertical_overflow="crop")
            live.start()
        # Log lines written while the dashboard is up (the coordinator's warning on a kill)
        # go through Live's stderr proxy, above the frame; straight to the terminal they tore
        # it (a stale frame's lines were left on the screen).
        handlers = _log_streams_to(sys.stderr) if live is not None else []
        last_line = 0.0
        try:
            while True:
                v = verdict(daemon.coordinator.stats() if daemon.coordinator else {},
                            interrupted=self.stop.is_set(), crash_loop=self._crash_loop(daemon),
                            until_epochs=self.args.until_epochs,
                            elapsed_s=daemon.now().timestamp() - t0,
                            duration_s=self.duration, duration_text=self.args.duration)
                if v is not None:
                    self.verdict = v
                    return
                if self._outages is not None:
                    self._outages.tick()
                if live is not None:
                    live.update(self._frame(daemon, t0, live))
                elif time.monotonic() - last_line > 5.0:
                    last_line = time.monotonic()
                    st = daemon.status(events=0)
                    acc = st.progress.get("accuracy")
                    print(f"[{(st.now.timestamp() - t0) / 3600:6.2f} h] fleet "
                          f"{sum(st.fleet.values())} (+{st.draining} draining), "
                          f"${st.cost_per_hour:.3f}/h, spend ${st.spend:.4f}, epoch "
                          f"{st.progress.get('epoch', 0)}, accuracy "
                          f"{'-' if acc is None else f'{acc:.3f}'}", flush=True)
                self.stop.wait(0.25)
        finally:
            if live is not None:
                try:  # the last frame left on the screen is the end, not a frame before it
                    live.update(self._frame(daemon, t0, live))
                finally:
                    live.stop()
                    for h, stream in handlers:
                        h.setStream(stream)

    @staticmethod
    def _frame(daemon: Daemon, t0: float, live: Any) -> Any:
        """The dashboard sized to the terminal as it is now (it may have been resized)."""
        from provisioner.daemon.dashboard import render
        from rich.console import Console

        size = (live.console if live is not None else Console()).size
        # one line short of the terminal: a frame of its full height scrolls the screen by
        # one each time the cursor ends below it, leaving torn frames above
        return render(daemon.status(events=60), t0, width=size.width,
                      height=max(8, size.height - 1))

    def _finish(self, daemon: Daemon, ring: Mapping[str, Any], notes: list[str],
                v: Verdict, terminated: bool) -> int:
        from provisioner.daemon.report import write_report

        end_t = daemon.now().timestamp()
        state = daemon.state
        run = dict(state.get_meta("run") or {})
        run["ended"] = {"outcome": v.outcome, "reason": v.reason, "t": end_t,
                        "fleet_kept": not terminated, "exit_code": v.exit_code,
                        "failure": v.failure}
        state.set_meta("run", run)
        state.set_meta("finished", True)
        path = write_report(state, self.report_dir, end_t, ring,
                            title="spotring: local main job",
                            notes=[f"market: {n}" for n in notes] + [
                                f"stopped: {v.reason}", f"speed: {self.speed:g}x"])
        fig = json.loads((self.report_dir / "report.json").read_text())
        acc = "-" if fig["accuracy"] is None else f"{fig['accuracy']:.3f}"
        print(f"stopped: {v.reason}. spend ${fig['spend_usd']:.4f} for {fig['samples']:,} "
              f"samples (${fig['cost_per_1m_samples_usd'] or 0:.4f} per 1M), accuracy "
              f"{acc}, steps lost {fig['steps_lost']} "
              f"(${fig['money_lost_usd']:.4f}), {fig['notices']} notices, "
              f"{fig['kills']} kills, {fig['joins']} joins", flush=True)
        print(f"against on-demand ${fig['on_demand_usd']:.4f}: saved "
              f"{pct(fig['saved_vs_on_demand'])}; against checkpoint-restart on the same "
              f"spot fleet ${fig['checkpoint_restart_usd']:.4f}: saved "
              f"{pct(fig['saved_vs_checkpoint_restart'])} (docs/daemon.md, \"Savings\")",
              flush=True)
        print(f"report: {path}", flush=True)
        if v.failure:
            print(f"provision run: error: {v.failure}", file=sys.stderr, flush=True)
        return v.exit_code


def _log_streams_to(stream: Any) -> list[tuple[logging.StreamHandler, Any]]:
    """Point every terminal log handler (root's, writing to the process's stdout or stderr)
    at ``stream``; returns (handler, its former stream) to put back."""
    out = []
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) \
                and h.stream in (sys.__stderr__, sys.__stdout__):
            out.append((h, h.setStream(stream)))
    return out
