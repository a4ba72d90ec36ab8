"""A cloud as a run's environment: ``provision run --config FILE`` with ``[cloud] driver =
"aws"|"gcp"``.

Design: :class:`CloudEnvironment` is what a :class:`~provisioner.daemon.run.session.
RunSession` needs beyond its common lifecycle on AWS or GCP: the driver and price source from
the settings (:func:`provisioner.daemon.wiring.cloud_parts`), real time, and the state file
``daemon.state_path`` (relative: to the config file's folder) as the run's place, locked as
``STATE_PATH.lock``. With ``daemon.token_path`` set the trainer's coordinator runs inside the
daemon on the address a previous daemon of this state used (kept in the state, so
``coordinator_port = 0`` still means the port the workers dial), so a restarted daemon adopts
the fleet (:mod:`provisioner.daemon.loop.recovery`) and the workers' ring goes on. Snapshots go
to ``[snapshot] url`` (default ``snapshots/<job.id>`` beside the state file). Every launch
carries the job (``SPOTRING_JOB``: AWS tag ``spotring:env:SPOTRING_JOB``, GCP metadata
``spotring-env-SPOTRING_JOB``).

A state file holds one job's run: a start on a state whose job finished is refused (its
snapshots, keyed by ``job.id``, would train the finished job again); give another
``job.id`` or ``daemon.state_path``.

Rule for callers: build it from checked :class:`~provisioner.daemon.run.options.RunOptions`;
one environment serves one session.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from provisioner.daemon.loop.scheduler import Daemon
from provisioner.daemon.ports import RingCoordinator
from provisioner.daemon.run.jobcheck import limit_env
from provisioner.daemon.run.lock import Created
from provisioner.daemon.run.options import RunOptions
from provisioner.daemon.run.session import Found, Parts
from provisioner.daemon.run.target import cloud_target
from provisioner.daemon.run.workdir import RunIdentity, Start, StartKind, decide_start
from provisioner.daemon.state import State
from provisioner.daemon.wiring import (cloud_parts, make_coordinator, ring_token, shipped_logs,
                                       snapshot_url)
from provisioner.drivers.artifacts import ship
from provisioner.errors import UserError


def _now() -> datetime:
    return datetime.now(timezone.utc)


class CloudEnvironment:
    """AWS or GCP (see the module docstring)."""

    speed = 1.0

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        s = options.settings
        self.target = cloud_target(s.cloud.driver, s.daemon.state_path, options.config)
        self.report_dir = (Path(options.report).resolve() if options.report
                           else self.target.report)
        self.default_on_exit = s.daemon.on_exit
        self._parts: tuple[Any, Any] | None = None
        self._token: bytes | None = None
        self._shipped: dict[str, str] = {}

    def check(self) -> list[str]:
        """The driver, the source and the token; the wheel this daemon runs, stored with the
        run (``[cloud] artifacts``) before anything starts: its URL and SHA-256 go with every
        launch (:mod:`provisioner.drivers.artifacts`)."""
        s = self.options.settings
        self._parts = cloud_parts(s, list(self.options.traces) or None)
        self._token = ring_token(s)
        self._shipped = ship(s)
        return []

    def build_job(self) -> list[str]:
        """Nothing: a cloud job is a module of the workers' image (``provision check --job
        MODULE`` builds it where it is installed)."""
        return []

    def identity(self) -> RunIdentity:
        """The job and its limit; the market is the cloud's (a restart may read its prices
        from another source)."""
        s = self.options.settings
        return RunIdentity(s.job.id, self.options.job, self.options.until_epochs,
                           f"cloud {s.cloud.driver}", self.options.until_steps)

    def decide(self, found: Found) -> Start:
        start = decide_start(found.run, found.has_state, self.identity(), self.target.what,
                            found.get("ring"))
        if start.kind is StartKind.NEXT:
            raise UserError(f"{self.target.what}: holds job {self.options.settings.job.id}, "
                            f"which finished; give another job.id (or daemon.state_path) to "
                            f"train again")
        return start

    def registry_id(self, run_id: str) -> str:
        return self.options.settings.job.id

    def coordinator(self, start: Start, found: Found, run_id: str,
                    created: Created) -> RingCoordinator | None:
        """The stable member of the ring (None without ``daemon.token_path``): on the address
        this state's workers dial, if a previous daemon recorded one."""
        s = self.options.settings
        if self._token is None:
            return None
        d = s.daemon
        host, port = d.coordinator_host, d.coordinator_port
        prev = found.get("coordinator")
        if prev:
            if d.coordinator_port not in (0, prev["port"]):
                raise UserError(f"daemon.coordinator_port {d.coordinator_port}: this state's "
                                f"workers dial {prev['host']}:{prev['port']}; set "
                                f"{prev['port']} (or 0) to go on with them")
            port = int(prev["port"])
        default = self.target.state.parent / "snapshots" / s.job.id
        if s.snapshot.url is None:
            created.mkdirs(default)
        return make_coordinator(host, port, self._token, snapshot=s.snapshot,
                                snapshot_url=snapshot_url(s, default))

    def commit(self, start: Start, run_id: str) -> list[str]:
        return []

    def clock(self, state: State, start: Start, found: Found) -> Callable[[], datetime]:
        return _now

    def parts(self, state: State, coordinator: RingCoordinator | None,
              now: Callable[[], datetime]) -> Parts:
        assert self._parts is not None, "check() first"
        driver, source = self._parts
        # the workers' job, job.job_file (or --job), goes with each launch as SPOTRING_JOB,
        # with the wheel this daemon runs, pinned by its SHA-256
        return Parts(driver, source, {"SPOTRING_JOB": self.options.job, **self._shipped,
                                      **limit_env(self.options.until_epochs,
                                                  self.options.until_steps)},
                     logs=shipped_logs(self.options.settings))

    def fleet_driver(self, now: Callable[[], datetime]) -> Any:
        assert self._parts is not None, "check() first"
        return self._parts[0]

    def begin(self, daemon: Daemon) -> None:
        return None

    def tick(self, daemon: Daemon) -> None:
        return None

    def crash_loop(self, state: State) -> str | None:
        return None

    def notes(self) -> list[str]:
        s = self.options.settings
        return [f"cloud: {s.cloud.driver}", "prices: " + (", ".join(self.options.traces)
                                                          or f"source {s.source.kind}")]
