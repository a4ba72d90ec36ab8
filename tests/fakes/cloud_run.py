"""A cloud run end to end on one machine: the real daemon and the trainer's coordinator, the
emulated cloud (moto or the GCP fake), and fake instances booting the rendered boot scripts
(tests/fakes/instances.py), whose workers join the real ring and train.

Design: :class:`CloudRun` is what ``provision run`` assembles for a cloud (the coordinator on
a fixed port the boot script names, the wheel (and the user's code, when given) shipped to
the run's artifacts by
:func:`provisioner.drivers.artifacts.ship`, the daemon from
:func:`provisioner.daemon.wiring.build_daemon` with the run's launch values) plus the
questions a test asks the ring: its members by instance (:meth:`members_of`), whether a worker
was ever lost (:meth:`lost`), how many steps were lost.

Rule for callers: use it as a context manager after the cloud's world is up; it stops the
daemon (terminating the fleet) and the coordinator on exit.
"""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path
from typing import Any, Mapping

from provisioner.drivers.identity import by_instance


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CloudRun:
    """The daemon and coordinator of one job over an emulated cloud (see the module docstring)."""

    def __init__(self, settings: Any, driver: Any, source: Any, state_path: Path, *,
                 port: int, token: str, launch_env: Mapping[str, str],
                 code: Any = None) -> None:
        self.settings, self.driver, self.source = settings, driver, source
        self.code = code  # a provisioner.drivers.code.Packed shipped with the run, or None
        self.state_path, self.port, self.token = state_path, port, token
        self.launch_env = dict(launch_env)
        self.coordinator: Any = None
        self.daemon: Any = None

    def __enter__(self) -> "CloudRun":
        from provisioner.daemon.state import State
        from provisioner.daemon.wiring import build_daemon, make_coordinator, shipped_logs
        from provisioner.drivers.artifacts import ship
        from tests.fakes.aws_world import real_clock

        shipped = ship(self.settings, self.code)
        self.coordinator = make_coordinator("127.0.0.1", self.port, self.token.encode(),
                                            heartbeat_timeout_s=5.0)
        self.daemon = build_daemon(self.settings, self.driver, self.source,
                                   State(self.state_path), now=real_clock(),
                                   coordinator=self.coordinator,
                                   launch_env={**self.launch_env, **shipped},
                                   logs=shipped_logs(self.settings))
        self.daemon.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.daemon is not None:
                self.daemon.stop("terminate")
        finally:
            if self.coordinator is not None:
                self.coordinator.stop()

    # -- what the ring says ---------------------------------------------------------------------

    def members_of(self) -> dict[str, list[str]]:
        """instance id -> its members' names (active, joining or draining)."""
        return by_instance(m.name for m in self.coordinator.members())

    def active(self) -> set[str]:
        return {m.name for m in self.coordinator.members() if m.state == "active"}

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.coordinator.events() if e["kind"] == kind]

    def live(self) -> dict[str, Any]:
        return {r.id: r for r in self.daemon.state.live_instances()}

    def step(self) -> int:
        return int(self.coordinator.stats().get("step") or 0)

    def steps_lost(self) -> int:
        return int(self.coordinator.stats().get("steps_lost") or 0)


def new_token() -> str:
    return secrets.token_hex(24)


def trained(run: CloudRun, steps: int, timeout_s: float) -> bool:
    """Did the ring take ``steps`` more steps within ``timeout_s``?"""
    start = run.step()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.step() >= start + steps:
            return True
        time.sleep(0.2)
    return False
