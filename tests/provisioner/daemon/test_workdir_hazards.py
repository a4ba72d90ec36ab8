"""The work directory is never a way out (issue 30, item 8): a full disk pauses what writes,
with ONE message, keeps the last good state and the workers, and recovers by itself when
space returns (a worker lost meanwhile is replaced); a symbolic link is never followed out
of the work directory.

The full disk is injected at the state's write seam (SQLite's own "database or disk is
full") and at the local driver's file writes (ENOSPC), the two places a daemon writes; the
rest is real: the run session, the scheduler, SQLite reads, the local driver and its worker
processes (the stand-in worker). The ring is the Protocol's fake.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from provisioner.daemon.run.session import RunSession
from provisioner.daemon.run.workdir import no_way_out
from provisioner.daemon.state import State
from provisioner.drivers.local import running
from provisioner.errors import UserError
from tests.fakes.local_run import JOB, fake_ring_environment, local_options
from tests.fakes.ring import FakeRing
from tests.fakes.wait import wait_for


class Disk:
    """Whether the disk is full now, and how many writes found it so."""

    def __init__(self) -> None:
        self.full = threading.Event()
        self.refused = 0

    def check_sqlite(self) -> None:
        if self.full.is_set():
            self.refused += 1
            raise sqlite3.OperationalError("database or disk is full")

    def check_file(self) -> None:
        if self.full.is_set():
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")


class DiskState(State):
    def __init__(self, path: Path, disk: Disk) -> None:
        super().__init__(path)
        self.disk = disk

    def _write(self, sql: str, params: Any = ()) -> int:
        self.disk.check_sqlite()
        return super()._write(sql, params)

    def _writemany(self, statements: Any) -> None:
        self.disk.check_sqlite()
        super()._writemany(statements)


def on_disk(driver: Any, disk: Disk) -> Any:
    """The local driver whose own record files share the full disk."""
    write = driver._write

    def checked(path: Path, data: dict) -> None:
        disk.check_file()
        write(path, data)
    driver._write = checked
    return driver


def read(wd: Path, fn: Any) -> Any:
    st = State.read_only(wd / "state.sqlite")
    try:
        return fn(st)
    finally:
        st.close()


def metric_rows(wd: Path) -> int:
    return read(wd, lambda st: len(st.metric_series("spend")))


@pytest.mark.timeout(300)
def test_a_full_disk_pauses_writes_once_and_the_run_recovers_by_itself(tmp_path, monkeypatch,
                                                                       caplog):
    monkeypatch.setenv("SPOTRING_STATE_HOME", str(tmp_path / "home"))
    caplog.set_level(logging.WARNING)
    wd, disk, ring = tmp_path / "w", Disk(), FakeRing()
    o = local_options(wd)
    env = fake_ring_environment(o, ring, tmp_path / "out", wrap=lambda d: on_disk(d, disk))
    session = RunSession(o, env, signals=False, open_state=lambda p: DiskState(p, disk))
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(result=session.run()), daemon=True)
    t.start()
    try:
        assert wait_for(lambda: len(running(wd / "cloud", JOB)) == 2, 120)
        workers = running(wd / "cloud", JOB)
        ring.speeds = {r["id"]: 100.0 for r in workers}
        assert wait_for(lambda: metric_rows(wd) >= 3, 60)

        disk.full.set()
        assert wait_for(lambda: disk.refused >= 10, 60)  # the jobs keep trying, quietly
        assert session.daemon.state.paused_since is not None
        assert session.daemon.status(0).paused_since is not None  # the dashboard says it
        rows, events = metric_rows(wd), read(wd, lambda st: len(st.events()))
        victim = workers[0]
        os.killpg(victim["pid"], signal.SIGKILL)  # a worker lost while the disk is full
        refused = disk.refused
        assert wait_for(lambda: disk.refused >= refused + 10, 60)
        # the last good state is kept: nothing written, nothing half-written
        assert metric_rows(wd) == rows and read(wd, lambda st: len(st.events())) == events
        assert victim["id"] in {r.id for r in read(wd, lambda st: st.live_instances())}
        assert [r["id"] for r in running(wd / "cloud", JOB)] == [workers[1]["id"]]  # kept

        disk.full.clear()  # space returns: the lost worker is ended and replaced
        assert wait_for(lambda: victim["id"] not in {
            r.id for r in read(wd, lambda st: st.live_instances())}, 60)
        assert wait_for(lambda: len(running(wd / "cloud", JOB)) == 2, 60)
        assert wait_for(lambda: metric_rows(wd) > rows, 60)
        assert wait_for(lambda: session.daemon.state.paused_since is None, 60)
        ring.progress = {**ring.progress, "outcome": "done", "finished": True}
        t.join(120)
    finally:
        session.request_stop()
        t.join(60)
    assert box["result"].exit_code == 0
    said = [r for r in caplog.records if r.name.startswith("provisioner")]
    paused = [r for r in said if "writes are paused" in r.getMessage()]
    back = [r for r in said if "space is back" in r.getMessage()]
    assert len(paused) == 1 and len(back) == 1, [r.getMessage() for r in said]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage() for r in caplog.records]


def test_no_link_leads_out_of_the_work_directory(tmp_path):
    wd = tmp_path / "w"
    (wd / "workers").mkdir(parents=True)
    (wd / "inside").symlink_to(wd / "workers")  # a link within the directory is fine
    no_way_out(wd, "--workdir")
    outside = tmp_path / "outside"
    for link, target in ((wd / "state.sqlite", outside / "x.sqlite"),  # to nothing
                         (wd / "report", tmp_path),  # out
                         (wd / "workers" / "w.jsonl", Path("/etc/passwd")),  # deep, out
                         (wd / "token", wd / "missing")):  # inside, but to nothing
        link.symlink_to(target)
        with pytest.raises(UserError, match="--workdir") as err:
            no_way_out(wd, "--workdir")
        assert str(link) in str(err.value) and "\n" not in str(err.value)
        link.unlink()
    assert not outside.exists()
