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
``spotring-env-SPOTRING_JOB``). A job file travels with its code (``job.code``: ``--code``,
else the file's folder): packed once at the start (:func:`provisioner.drivers.code.pack`),
shipped beside the wheel (:func:`provisioner.drivers.artifacts.ship`), and every launch
carries ``SPOTRING_CODE``/``SPOTRING_CODE_SHA256`` and the job's path inside the code as
``SPOTRING_JOB``. A git source (``--code git+URL@REF``) is cloned here, on the daemon's
host, and packed the same way; no worker clones anything. One run trains one code: the
state keeps what its launches carry (meta ``code``), and a restarted daemon that finds the
folder changed launches the run's own code still, and says so (a ring whose members ran two
codes could not share its weights); another ``job.id`` trains the new code.

A state file holds one job's run: a start on a state whose job finished is refused (its
snapshots, keyed by ``job.id``, would train the finished job again); give another
``job.id`` or ``daemon.state_path``.

Rule for callers: build it from checked :class:`~provisioner.daemon.run.options.RunOptions`;
one environment serves one session.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from provisioner.daemon.loop.scheduler import Daemon
from provisioner.daemon.ports import RingCoordinator
from provisioner.daemon.run.jobcheck import limit_env
from provisioner.daemon.run.jobspec import check_job
from provisioner.daemon.run.lock import Created
from provisioner.daemon.run.options import RunOptions
from provisioner.daemon.run.session import Found, Parts
from provisioner.daemon.run.target import cloud_target
from provisioner.daemon.run.workdir import RunIdentity, Start, StartKind, decide_start
from provisioner.daemon.state import State
from provisioner.daemon.wiring import (cloud_parts, make_coordinator, ring_token, shipped_logs,
                                       snapshot_url, with_recorded_end)
from provisioner.drivers.artifacts import ship
from provisioner.drivers.code import code_root, is_git, pack
from provisioner.errors import UserError


#: The launch values that name a run's code (kept in the state: meta ``code``).
CODE_KEYS = ("SPOTRING_CODE", "SPOTRING_CODE_SHA256", "SPOTRING_JOB")


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
        self._run_code: dict[str, str] | None = None  # what a continued run's launches carry

    def check(self) -> list[str]:
        """The driver, the source and the token; the wheel this daemon runs, and the job's
        code when it travels, stored with the run (``[cloud] artifacts``) before anything
        starts: their URLs and SHA-256s go with every launch
        (:mod:`provisioner.drivers.artifacts`)."""
        s = self.options.settings
        self._parts = cloud_parts(s, list(self.options.traces) or None)
        self._token = ring_token(s)
        if s.job.code is None:
            self._shipped = ship(s)
            return []
        with tempfile.TemporaryDirectory(prefix="spotring-code-") as tmp, code_root(
                s.job.code, self.options.job) as (root, job_file, origin):
            if is_git(s.job.code):  # the job was a path in the repository: checked now
                check_job(str(job_file), "--job")
            packed = pack(root, job_file, Path(tmp), max_mb=s.job.code_max_mb)
            self._shipped = ship(s, packed)
        return [f"code: {packed.files} files ({packed.size / 1e6:.1f} MB) of {origin}, "
                f"sha256 {packed.sha256[:12]}, job {packed.job}"]

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
        """Continue, finish or refuse, from the state and the ring's end its coordinator
        recorded beside the snapshots (a daemon killed right after the ring finished did not
        record it itself: the run is finished, not trained again)."""
        ring = found.get("ring")
        url = snapshot_url(self.options.settings, self._snapshots())
        if found.run and url:
            ring = with_recorded_end(ring, self.options.settings, url, self._token)
        start = decide_start(found.run, found.has_state, self.identity(), self.target.what,
                            ring)
        if start.kind is StartKind.CONTINUE:
            self._run_code = found.get("code")
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
        default = self._snapshots()
        if s.snapshot.url is None:
            created.mkdirs(default)
        return make_coordinator(host, port, self._token, snapshot=s.snapshot,
                                snapshot_url=snapshot_url(s, default))

    def _snapshots(self) -> Path:
        """The snapshots' folder on this host when ``snapshot.url`` is unset."""
        return self.target.state.parent / "snapshots" / self.options.settings.job.id

    def commit(self, start: Start, run_id: str) -> list[str]:
        """A continued run keeps its code (the module docstring): the launch values of the
        code it started with, and a line when the folder changed since."""
        prev, now = self._run_code, self._shipped.get("SPOTRING_CODE_SHA256")
        if not prev or now is None or prev.get("SPOTRING_CODE_SHA256") == now:
            return []
        self._shipped.update(prev)
        return [f"code: changed since this run started (sha256 {now[:12]} now); its launches "
                f"keep the run's code {prev['SPOTRING_CODE_SHA256'][:12]}, which its workers "
                f"run; give another job.id to train the new code"]

    def clock(self, state: State, start: Start, found: Found) -> Callable[[], datetime]:
        return _now

    def parts(self, state: State, coordinator: RingCoordinator | None,
              now: Callable[[], datetime]) -> Parts:
        assert self._parts is not None, "check() first"
        driver, source = self._parts
        code = {k: v for k, v in self._shipped.items() if k in CODE_KEYS}
        if code:
            state.set_meta("code", code)
        # the workers' job, job.job_file (or --job), goes with each launch as SPOTRING_JOB,
        # with the wheel this daemon runs, pinned by its SHA-256; a job file travelling with
        # its code is its path inside the code (SPOTRING_JOB from ship)
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
