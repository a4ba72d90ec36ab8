"""A cloud daemon run: ``provision run --config FILE`` with ``[cloud] driver = "aws"|"gcp"``.

Design: the parts come from :mod:`provisioner.daemon.wiring` (driver and source from
settings, the trainer's coordinator when ``daemon.token_path`` is set); this module only
runs the daemon in real time until a signal or ``--duration``, then keeps or terminates the
fleet (``--on-exit``).

Rule: every input is checked before anything starts (exit 2 with one line).
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from datetime import datetime, timezone

from provisioner.config import Settings
from provisioner.daemon.metrics import Metrics
from provisioner.daemon.ports import RingCoordinator
from provisioner.daemon.scheduler import Daemon
from provisioner.daemon.state import State
from provisioner.daemon.wiring import build_daemon, cloud_parts, make_coordinator, ring_token


def run_cloud(settings: Settings, args: argparse.Namespace, duration: float | None) -> int:
    """Run a cloud daemon (real time) until a signal or ``duration`` seconds."""
    driver, source = cloud_parts(settings, args.trace)
    d = settings.daemon
    token = ring_token(settings)
    metrics = Metrics()
    coordinator: RingCoordinator | None = None
    daemon: Daemon | None = None
    stop = threading.Event()
    try:
        port = args.metrics_port if args.metrics_port is not None else d.metrics_port
        if port is not None:
            metrics.serve(port)
        if token is not None:  # the stable member of the ring: workers dial this address
            coordinator = make_coordinator(d.coordinator_host, d.coordinator_port, token)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        daemon = build_daemon(settings, driver, source, State(d.state_path),
                              now=lambda: datetime.now(timezone.utc), metrics=metrics,
                              coordinator=coordinator)
        t0 = time.monotonic()
        daemon.start()
        while not stop.wait(1.0):
            if duration is not None and time.monotonic() - t0 >= duration:
                break
    finally:
        if daemon is not None:
            daemon.stop(args.on_exit or d.on_exit)
        if coordinator is not None:
            coordinator.stop()
        metrics.close()
    print(f"stopped; state in {settings.daemon.state_path} (see `provision status`)")
    return 0
