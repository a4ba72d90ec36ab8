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

import threading
from pathlib import Path
from typing import Any

import pytest

from provisioner.daemon.run.session import Quiet, RunSession
from provisioner.daemon.state import State
from provisioner.drivers.local import LocalDriver, running
from tests.fakes.local_run import JOB, fake_ring_environment, local_options, run_until
from tests.fakes.ring import FakeRing


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


class Arming(Quiet):
    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    def closing(self, status: Any, t0: float) -> None:
        self.seam.arm()


#: How the run ends in each case: the job finishing, the run cut at its --until-steps (the
#: ring's stats, --until-steps, the outcome and exit code a restart must report). A lost or
#: failed job ends as "done" does (test_workdir.py decides it as data).
ENDS = {"done": ({"outcome": "done", "finished": True, "epoch": 8}, None, "done", 0),
        "limit": ({"outcome": "running", "epoch": 3}, 40, "limit", 0)}


def session(wd: Path, seam: Seam, ring: FakeRing, until: int | None) -> RunSession:
    o = local_options(wd, until)
    env = fake_ring_environment(o, ring, wd.parent / f"{wd.name}-out",
                                wrap=lambda driver: DyingDriver(driver, seam))
    return RunSession(o, env, Arming(seam), signals=False,
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
    box = run_until(session(wd, seam, ring, until), wd, ring, stats)
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
