"""The main job on this machine: ``provision run`` with the embedded local cloud.

Design: :class:`LocalRun` checks every input *before* anything starts (a missing trace, a
trace with no usable offering, a port in use: one line, exit 2, nothing left running), then
wires the whole loop here:

- the market: ``--trace PATH`` (any format :func:`pricing.sources.trace.load_trace` reads;
  availability-only traces get generated prices, :func:`pricing.sources.synthetic.
  fill_prices`), else the seeded built-in market of :mod:`pricing.sources.synthetic`;
  replayed at ``--speed``;
- the ring: the trainer's coordinator inside this process
  (:func:`provisioner.daemon.wiring.make_coordinator`); instances are ``python -m trainer
  worker`` processes started by the local driver (their argv: :func:`worker_argv`),
  training ``job.job_file`` (``examples/digits.py``);
- the end: ``--until-epochs`` (passed to the example as ``DIGITS_EPOCHS``), ``--duration``
  (simulated), the job finishing, or Ctrl-C/SIGTERM (drain, stop, terminate the fleet);
- the report: ``--report DIR`` (default ``WORKDIR/report``), see :mod:`provisioner.daemon.report`.

Rule for callers: run from the repository root (or give ``job.job_file`` as an absolute
path); ``--workdir`` is reset at the start of a local run (leftover workers terminated).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pricing.sources import synthetic
from pricing.sources.synthetic import AvailabilityIndex
from provisioner.config import Settings
from provisioner.daemon.metrics import Metrics
from provisioner.daemon.ports import PriceFeed, RingCoordinator
from provisioner.daemon.scheduler import Daemon
from provisioner.daemon.state import EventKind, State, ring_kind
from provisioner.daemon.wiring import build_daemon, make_coordinator
from provisioner.errors import ConfigError, UserError

log = logging.getLogger(__name__)

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


class LocalRun:
    """The main job on this machine (see the module docstring)."""

    def __init__(self, settings: Settings, args: argparse.Namespace,
                 duration: float | None) -> None:
        self.settings = settings
        self.args = args
        self.speed = args.speed or settings.local.speed
        self.duration = duration
        self.workdir = Path(args.workdir or settings.local.state_dir).resolve()
        self.report_dir = Path(args.report).resolve() if args.report else self.workdir / "report"
        self.on_exit = args.on_exit or "terminate"
        self.stop = threading.Event()
        self.interrupted = False
        self.failure: str | None = None
        self.reason = "stopped"
        self._old_handlers: dict[int, Any] = {}

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
                if self.args.outages_per_hour < 0:
                    raise UserError(f"--outages-per-hour {self.args.outages_per_hour}: must "
                                    "be >= 0")
                params = replace(params, outages_per_hour=self.args.outages_per_hour)
            snap = synthetic.generate(params)
            origin = "the built-in generator"
        return snap, [origin, *snap.notes[-3:]]

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

    def run(self) -> int:
        from pricing.sources.trace import ReplayClock, TraceSource

        snap, notes = self.market()
        snap, start = self.usable(snap)
        job_file = Path(self.settings.job.job_file)
        if not job_file.is_absolute() and not job_file.exists() and "/" in str(job_file):
            raise ConfigError(f"job.job_file = {str(job_file)!r}: not found from {os.getcwd()}; "
                              "run from the repository root or give an absolute path")
        job_spec = str(job_file.resolve()) if job_file.exists() else str(job_file)
        self._reset_workdir()
        metrics = Metrics()
        coordinator = None
        daemon = None
        ring: dict[str, Any] = {}
        ok = False
        try:
            if self.args.metrics_port is not None:
                metrics.serve(self.args.metrics_port)
            coordinator, token_file = self._coordinator()
            source = TraceSource([], snapshot=snap)
            clock = ReplayClock.starting_now(start, self.speed)
            daemon = self._daemon(source, clock.trace_time, coordinator, token_file, job_spec,
                                  AvailabilityIndex(snap.availability), metrics)
            self._signals()
            daemon.start()
            t0 = daemon.now().timestamp()
            self._watch(daemon, t0)
            ok = self.failure is None
        finally:
            if daemon is not None:  # on an error nothing is left running, whatever --on-exit
                daemon.stop(self.on_exit if ok else "terminate")
            if coordinator is not None:
                ring = coordinator.stats()
                coordinator.stop()
            metrics.close()
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
        if self.failure:
            raise UserError(self.failure)
        return self._finish(daemon, ring, notes)

    def _reset_workdir(self) -> None:
        from provisioner.drivers.local import LocalDriver

        cloud = self.workdir / "cloud"
        if cloud.exists():  # a crashed earlier run: its workers must not outlive it
            old = LocalDriver(cloud, lambda s: [], terminate_grace_s=1.0)
            old.terminate([i.id for i in old.list(self.settings.job.id)])
        for name in ("cloud", "workers", "samples"):
            shutil.rmtree(self.workdir / name, ignore_errors=True)
        for p in self.workdir.glob("state.sqlite*"):
            p.unlink()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "workers").mkdir()
        (self.workdir / "samples").mkdir()

    def _coordinator(self) -> tuple[RingCoordinator, Path]:
        from trainer.admission import write_token_file

        token_file = self.workdir / "token"
        token = write_token_file(token_file)  # 0600 from its first byte, whole or not at all
        d = self.settings.daemon
        coord = make_coordinator(d.coordinator_host, d.coordinator_port, token,
                                 heartbeat_timeout_s=5.0)
        return coord, token_file

    def _daemon(self, source: PriceFeed, now: Callable[[], datetime],
                coordinator: RingCoordinator, token_file: Path, job: str,
                availability: AvailabilityIndex, metrics: Metrics) -> Daemon:
        from provisioner.drivers.local import LocalDriver

        host, port = coordinator.address
        samples = self.workdir / "samples" if self.args.record_samples else None
        wd = self.workdir
        loc = self.settings.local

        def command(spec: Any) -> list[str]:
            return worker_argv(loc.python or sys.executable, f"{host}:{port}", token_file, job,
                               spec.instance_id, spec.slowdown, wd / "workers", samples,
                               loc.worker_args)

        driver = LocalDriver(wd / "cloud", command, clock=now, availability=availability,
                             notice_window_s=loc.notice_window_s,
                             hard_kill_every=loc.hard_kill_every)
        env = {"OMP_NUM_THREADS": "1", "SPOTRING_LOG": os.environ.get("SPOTRING_LOG", "WARNING")}
        if self.args.until_epochs:
            env["DIGITS_EPOCHS"] = str(self.args.until_epochs)
        return build_daemon(self.settings, driver, source, State(wd / "state.sqlite"), now=now,
                            speed=self.speed, coordinator=coordinator, metrics=metrics,
                            launch_env=env)

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
        log_file = self.workdir / "cloud" / "logs" / f"{exits[-1].instance_id}.log"
        tail = ""
        try:
            lines = [ln for ln in log_file.read_text().splitlines() if ln.strip()]
            tail = f": {lines[-1][:200]}" if lines else ""
        except OSError:
            pass
        return (f"{len(exits)} workers exited before any joined the ring (see {log_file}"
                f"{tail}); check job.job_file and local.worker_args")

    def _done(self, daemon: Daemon, t0: float) -> str | None:
        if self.stop.is_set():
            return "interrupted"
        self.failure = self._crash_loop(daemon)
        if self.failure:
            return "workers failing"
        stats = daemon.coordinator.stats()
        if stats.get("finished"):
            return "the job finished" + (" (every member lost)" if stats.get("lost") else "")
        if self.args.until_epochs and int(stats.get("epoch") or 0) >= self.args.until_epochs:
            return f"{self.args.until_epochs} epochs done"
        if self.duration is not None and daemon.now().timestamp() - t0 >= self.duration:
            return f"--duration {self.args.duration} reached"
        return None

    def _watch(self, daemon: Daemon, t0: float) -> None:
        from provisioner.daemon.dashboard import render

        live = None
        if not self.args.no_dashboard and sys.stdout.isatty():
            from rich.live import Live

            live = Live(render(daemon.status(), t0), refresh_per_second=4, transient=False)
            live.start()
        last_line = 0.0
        try:
            while True:
                why = self._done(daemon, t0)
                if why:
                    self.reason = why
                    return
                if live is not None:
                    live.update(render(daemon.status(), t0))
                elif time.monotonic() - last_line > 5.0:
                    last_line = time.monotonic()
                    st = daemon.status(events=0)
                    print(f"[{(st.now.timestamp() - t0) / 3600:6.2f} h] fleet "
                          f"{sum(st.fleet.values())} (+{st.draining} draining), "
                          f"${st.cost_per_hour:.3f}/h, spend ${st.spend:.4f}, epoch "
                          f"{st.progress.get('epoch', 0)}, accuracy "
                          f"{st.progress.get('accuracy', '-')}", flush=True)
                self.stop.wait(0.25)
        finally:
            if live is not None:
                live.stop()

    def _finish(self, daemon: Daemon, ring: Mapping[str, Any], notes: list[str]) -> int:
        from provisioner.daemon.report import write_report

        end_t = daemon.now().timestamp()
        reason = self.reason
        path = write_report(daemon.state, self.report_dir, end_t, ring,
                            title="spotring: local main job",
                            notes=[f"market: {n}" for n in notes] + [f"stopped: {reason}",
                                                                     f"speed: {self.speed:g}x"])
        import json

        fig = json.loads((self.report_dir / "report.json").read_text())
        print(f"stopped: {reason}. spend ${fig['spend_usd']:.4f} for {fig['samples']:,} "
              f"samples (${fig['cost_per_1m_samples_usd'] or 0:.4f} per 1M), accuracy "
              f"{fig['accuracy']}, steps lost {fig['steps_lost']}, {fig['notices']} notices, "
              f"{fig['kills']} kills, {fig['joins']} joins")
        print(f"report: {path}")
        daemon.state.set_meta("finished", True)
        return 0
