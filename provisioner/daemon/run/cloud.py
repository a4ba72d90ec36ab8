"""A cloud daemon run: ``provision run --config FILE`` with ``[cloud] driver = "aws"|"gcp"``.

Design: the parts come from :mod:`provisioner.daemon.wiring` (driver and source from
settings, the trainer's coordinator when ``daemon.token_path`` is set); this module only
runs the daemon in real time until a signal, ``--duration`` or the ring's end, then keeps or
terminates the fleet (``--on-exit``; a lost or failed job's fleet is terminated).

Restart: the state file (``daemon.state_path``, relative to the config file's folder) is
locked for the run's life (``STATE_PATH.lock``: a second daemon on it is refused); a daemon
started again on it adopts the fleet (:mod:`provisioner.daemon.loop.recovery`) and runs the
coordinator on the address the previous one had (kept in the state, so ``coordinator_port =
0`` still means the same port the workers dial) with the same token file, so the workers'
ring goes on. Snapshots go to ``[snapshot] url`` (default ``snapshots/<job.id>`` beside the
state file).

Rule: every input is checked before anything starts (exit 2 with one line).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from provisioner.config import Settings
from provisioner.daemon.run import registry
from provisioner.daemon.run.lock import Created, RunLock
from provisioner.daemon.view.metrics import Metrics
from provisioner.daemon.outcome import Verdict, verdict
from provisioner.daemon.ports import RingCoordinator
from provisioner.daemon.loop.scheduler import Daemon
from provisioner.daemon.state import State
from provisioner.daemon.wiring import (build_daemon, cloud_parts, make_coordinator,
                                       ring_token, snapshot_url)
from provisioner.errors import UserError


def _address(settings: Settings, state_path: Path) -> tuple[str, int]:
    """The coordinator's address: the one a previous daemon of this state used, if any."""
    d = settings.daemon
    if not state_path.exists():
        return d.coordinator_host, d.coordinator_port
    st = State.read_only(state_path)
    try:
        prev = st.get_meta("coordinator")
    finally:
        st.close()
    if not prev:
        return d.coordinator_host, d.coordinator_port
    if d.coordinator_port not in (0, prev["port"]):
        raise UserError(f"daemon.coordinator_port {d.coordinator_port}: this state's workers "
                        f"dial {prev['host']}:{prev['port']}; set {prev['port']} (or 0) to go "
                        f"on with them")
    return d.coordinator_host, int(prev["port"])


def run_cloud(settings: Settings, args: argparse.Namespace, duration: float | None) -> int:
    """Run a cloud daemon (real time) until a signal, ``duration`` seconds or the job's end."""
    driver, source = cloud_parts(settings, args.trace)
    d = settings.daemon
    token = ring_token(settings)
    state_path = Path(d.state_path)
    created = Created()
    lock = RunLock(state_path.with_name(state_path.name + ".lock"),
                   f"daemon.state_path {state_path}")
    lock.acquire(created)
    metrics = Metrics()
    coordinator: RingCoordinator | None = None
    daemon: Daemon | None = None
    stop = threading.Event()
    v: Verdict | None = None
    try:
        try:
            endpoint = getattr(args, "metrics_endpoint", None)
            if endpoint is not None:
                host, mport = endpoint
                print(f"metrics: http://{host}:{metrics.serve(mport, host)}/metrics",
                      flush=True)
            if token is not None:  # the stable member of the ring: workers dial this address
                host, cport = _address(settings, state_path)
                default = state_path.parent / "snapshots" / settings.job.id
                if settings.snapshot.url is None:
                    created.mkdirs(default)
                coordinator = make_coordinator(host, cport, token, snapshot=settings.snapshot,
                                               snapshot_url=snapshot_url(settings, default))
            state = State(state_path)
        except BaseException:
            if coordinator is not None:
                coordinator.stop()
            metrics.close()
            lock.release()
            created.undo()
            raise
        if coordinator is not None:
            h, p = coordinator.address
            state.set_meta("coordinator", {"host": h, "port": p})
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        detached = os.environ.get("SPOTRING_DETACHED_LOG")
        registry.register(run_id=settings.job.id, driver=settings.cloud.driver,
                          workdir=state_path.parent, state=state_path, lock=lock.path,
                          job=settings.job.job_file, log=Path(detached) if detached else None,
                          config=str(Path(args.config).resolve()) if args.config else None)
        # the workers' job, job.job_file (or --job), goes with each launch as SPOTRING_JOB
        # (AWS tag spotring:env:SPOTRING_JOB, GCP metadata spotring-env-SPOTRING_JOB)
        daemon = build_daemon(settings, driver, source, state,
                              now=lambda: datetime.now(timezone.utc), metrics=metrics,
                              coordinator=coordinator,
                              launch_env={"SPOTRING_JOB": settings.job.job_file})
        t0 = time.monotonic()
        daemon.start()
        while v is None:
            stop.wait(1.0)
            v = verdict(coordinator.stats() if coordinator is not None else {},
                        interrupted=stop.is_set(), crash_loop=None, until_epochs=None,
                        elapsed_s=time.monotonic() - t0, duration_s=duration,
                        duration_text=args.duration)
    finally:
        if daemon is not None:  # an unexpected error keeps the fleet: a restart adopts it
            on_exit = args.on_exit or d.on_exit
            daemon.stop("terminate" if v is not None and (v.job_over or on_exit == "terminate")
                        else "keep")
        if coordinator is not None:
            coordinator.stop()
        metrics.close()
        lock.release()
        registry.unregister()
    print(f"stopped: {v.reason}; state in {settings.daemon.state_path} (see `provision "
          f"status`)")
    if v.failure:
        print(f"provision run: error: {v.failure}", file=sys.stderr)
    return v.exit_code
