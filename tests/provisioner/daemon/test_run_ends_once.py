"""A run ends once (issue 30, item 4): the end is recorded before anything is stopped, so a
daemon killed at ANY write of its shutdown path leaves a run that its next start finishes
stopping (the rest of the fleet ended, the report written, the recorded exit code) and
never trains again: no worker launched, no ring started.

The kill is injected through the run session's ``open_state`` seam: :class:`DyingState`
counts the state's writes from the verdict on (the observer's ``closing``, called the moment
the session decides the run is over) and dies at the k-th: that write and everything after
it raise :class:`Killed`, every call of the driver too, as nothing of a SIGKILLed process
reaches the disk or the cloud. An exhaustive loop kills at every write of a calibrated
shutdown, k = 1..N. Real parts: the run session, the daemon and its scheduler, SQLite, the
local driver with worker processes (the stand-in worker of tests/fakes), the registry; the
ring is the Protocol's fake (the job's end is what a test sets).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from provisioner.config import parse_settings
from provisioner.daemon.run.local import LocalEnvironment
from provisioner.daemon.run.options import RunOptions
from provisioner.daemon.run.session import Parts, Quiet, RunSession
from provisioner.daemon.state import State
from provisioner.drivers.local import LocalDriver, running
from tests.conftest import REPO
from tests.fakes.ring import FakeRing
from tests.fakes.wait import wait_for

FAKE = REPO / "tests" / "fakes" / "local_worker.py"
JOB = "spotring-demo"


class Killed(BaseException):
    """The daemon's process died here."""


class Seam:
    """Counts the shutdown path's writes (those of the thread that armed it) and dies at the
    ``at``-th (None: never)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.thread: threading.Thread | None = None
        self.writes = 0
        self.dead = False

    def arm(self) -> None:
        self.thread = threading.current_thread()

    def write(self) -> None:
        if self.dead:
            raise Killed
        if self.thread is threading.current_thread():
            self.writes += 1
            if self.writes == self.at:
                self.dead = True
                raise Killed

    def call(self) -> None:
        if self.dead:
            raise Killed


class DyingState(State):
    def __init__(self, path: Path, seam: Seam) -> None:
        super().__init__(path)
        self.seam = seam

    def _write(self, sql: str, params: Any = ()) -> int:
        self.seam.write()
        return super()._write(sql, params)

    def _writemany(self, statements: Any) -> None:
        self.seam.write()
        super()._writemany(statements)


class DyingDriver:
    """The local driver, dead with the process: no launch, termination or signal after."""

    def __init__(self, inner: Any, seam: Seam) -> None:
        self._inner, self._seam = inner, seam

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in ("launch", "terminate", "revoke", "notices"):
            def guarded(*a: Any, **kw: Any) -> Any:
                self._seam.call()
                return attr(*a, **kw)
            return guarded
        return attr


class Env(LocalEnvironment):
    """The local environment with the ring's fake and the stand-in worker."""

    def __init__(self, options: RunOptions, ring: FakeRing, seam: Seam, out: Path) -> None:
        super().__init__(options)
        self.ring, self.seam, self.out = ring, seam, out

    def coordinator(self, start: Any, found: Any, run_id: str, created: Any) -> FakeRing:
        self._token(start, created)
        self.ring.start()
        self.ring.started = True
        return self.ring

    def worker_command(self, coordinator: Any) -> Any:
        return lambda spec: [sys.executable, str(FAKE), str(self.out), spec.instance_id]

    def parts(self, state: State, coordinator: Any, now: Any) -> Parts:
        p = super().parts(state, coordinator, now)
        p.driver._terminate_grace_s = 0.5  # the stand-in exits on SIGTERM at once
        return Parts(DyingDriver(p.driver, self.seam), p.source, p.launch_env)


class Arming(Quiet):
    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    def closing(self, status: Any, t0: float) -> None:
        self.seam.arm()


#: How the run ends in each case: the job finishing, the --until-epochs limit reached (the
#: ring's stats, --until-epochs, the outcome and exit code a restart must report). A lost or
#: failed job ends as "done" does (test_workdir.py decides it as data).
ENDS = {"done": ({"outcome": "done", "finished": True, "epoch": 8}, None, "done", 0),
        "limit": ({"outcome": "running", "epoch": 3}, 3, "done", 0)}


def options(wd: Path, until: int | None) -> RunOptions:
    settings = parse_settings({"fleet": {"max_size": 2, "markets": ["spot"]}})
    return RunOptions(settings=settings, workdir=wd, outages_per_hour=0.0, speed=600.0,
                      until_epochs=until)


def session(wd: Path, seam: Seam, ring: FakeRing, until: int | None) -> RunSession:
    out = wd.parent / f"{wd.name}-out"
    out.mkdir(exist_ok=True)
    o = options(wd, until)
    return RunSession(o, Env(o, ring, seam, out), Arming(seam), signals=False,
                      open_state=lambda p: DyingState(p, seam))


def read(wd: Path, fn: Any) -> Any:
    st = State.read_only(wd / "state.sqlite")
    try:
        return fn(st)
    finally:
        st.close()


def run_to_its_end(wd: Path, seam: Seam, end: str) -> tuple[Any, BaseException | None]:
    """Run until two workers are up and in the ring, end the run as ``end`` says, and return
    the session's result or what killed it."""
    ring = FakeRing()
    stats, until, _outcome, _code = ENDS[end]
    s = session(wd, seam, ring, until)
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["result"] = s.run()
        except BaseException as exc:  # noqa: BLE001 - Killed, or a failure to report
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: len(running(wd / "cloud", JOB)) == 2 or "error" in box, 120)
        assert "error" not in box, box.get("error")
        ring.speeds = {r["id"]: 100.0 for r in running(wd / "cloud", JOB)}
        ring.progress = {**ring.progress, **stats, "step": 40, "samples_done": 2560}
        t.join(120)
        assert not t.is_alive()
    finally:
        d = s.daemon
        if d is not None and d.scheduler is not None:  # a killed daemon has no threads left
            d.stopping.set()
            d.scheduler.shutdown(wait=True)
    return box.get("result"), box.get("error")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRING_STATE_HOME", str(tmp_path / "home"))
    yield
    for cloud in tmp_path.glob("*/cloud"):  # nothing of a failed trial left running
        LocalDriver(cloud, lambda spec: []).terminate([r["id"] for r in running(cloud, JOB)])


def restart(s: RunSession) -> Any:
    """Run ``s`` (the restart); one that went on running the run instead of finishing its
    stop is stopped after a while, and its result shows what it did."""
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(result=s.run()), daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():
        s.request_stop()
        t.join(120)
    return box.get("result")


def launches(wd: Path) -> int:
    return read(wd, lambda st: len([i for i in st.intents() if i.kind == "launch"]))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("end", sorted(ENDS))
def test_a_daemon_killed_at_any_write_of_its_shutdown_never_trains_the_run_again(tmp_path,
                                                                                  home, end):
    calibration = Seam(at=None)
    stats, until, outcome, code = ENDS[end]
    result, error = run_to_its_end(tmp_path / "calibration", calibration, end)
    assert error is None and result.verdict.outcome == outcome, error
    n = calibration.writes
    assert n >= 6  # the end, the terminations, the last metrics, "stopped", the stop mark
    ended = read(tmp_path / "calibration", lambda st: st.get_meta("run")["ended"])
    assert ended["stopped"] and not ended["fleet_kept"]

    for k in range(1, n + 1):
        wd = tmp_path / f"k{k}"
        seam = Seam(at=k)
        result, error = run_to_its_end(wd, seam, end)
        assert isinstance(error, Killed) and seam.dead, (k, result, error)
        ended = read(wd, lambda st: (st.get_meta("run") or {}).get("ended"))
        assert ended is not None or k == 1, k  # the end is the first write of the path
        before = launches(wd)

        ring = FakeRing()
        again = restart(session(wd, Seam(at=None), ring, until))
        assert not getattr(ring, "started", False), f"k={k}: a ring started again"
        assert launches(wd) == before, f"k={k}: workers launched again"
        assert again.verdict.outcome == outcome and again.exit_code == code, (k, again)
        assert running(wd / "cloud", JOB) == [], f"k={k}: a worker left running"
        run = read(wd, lambda st: st.get_meta("run"))
        assert run["ended"]["stopped"] and run["ended"]["outcome"] == outcome, (k, run)
        assert read(wd, lambda st: st.live_instances()) == []
        assert (wd / "report" / "report.json").exists()
