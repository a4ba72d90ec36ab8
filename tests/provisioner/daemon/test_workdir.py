"""The local run's work directory: the lock, the start decision, the archive of a finished
run, and the journal that leaves nothing behind when a start fails."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.daemon.run.lock import Created, RunLock, writable_folder
from provisioner.daemon.run.workdir import (RunIdentity, StartKind, Workdir, archive,
                                        decide_start)
from provisioner.errors import UserError
from tests.fakes.wait import wait_for

ID = RunIdentity("spotring-demo", "/repo/examples/digits.py", 30, "generator seed 7, 0.3 outages/h")


def test_a_second_lock_is_refused_with_the_holders_pid(tmp_path):
    first = RunLock(tmp_path / "w" / ".lock", "--workdir w")
    first.acquire(Created())
    with pytest.raises(UserError, match=rf"--workdir w is in use .*pid {os.getpid()}"):
        RunLock(tmp_path / "w" / ".lock", "--workdir w").acquire(Created())
    first.release()
    again = RunLock(tmp_path / "w" / ".lock", "--workdir w")
    again.acquire(Created())
    again.release()


def test_a_lock_dies_with_its_holder(tmp_path):
    """Stale-safe: a SIGKILLed run's lock is free at once (the kernel drops a flock)."""
    path = tmp_path / ".lock"
    code = ("import sys, time; from pathlib import Path; "
            "from provisioner.daemon.run.lock import Created, RunLock; "
            f"RunLock(Path({str(path)!r}), 'w').acquire(Created()); print('held', flush=True); "
            "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[3])
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {child.pid}"):
            RunLock(path, "w").acquire(Created())
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        lock = RunLock(path, "w")
        assert wait_for(lambda: _try(lock), 10)
        lock.release()
    finally:
        if child.poll() is None:
            child.kill()


def _try(lock):
    try:
        lock.acquire(Created())
        return True
    except UserError:
        return False


def test_undo_removes_only_what_the_start_created(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "keep.txt").write_text("user data")
    created = Created()
    lock = RunLock(tmp_path / "old" / "new" / "deeper" / ".lock", "w")
    lock.acquire(created)
    (tmp_path / "old" / "new" / "token").write_text("t")
    created.file(tmp_path / "old" / "new" / "token")
    lock.release()
    created.undo()
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["keep.txt"]
    # a lock file that was there before stays
    (tmp_path / "old" / ".lock").write_text("")
    created = Created()
    lock = RunLock(tmp_path / "old" / ".lock", "w")
    lock.acquire(created)
    lock.release()
    created.undo()
    assert (tmp_path / "old" / ".lock").exists()


def test_an_unwritable_folder_is_refused_and_nothing_is_left(tmp_path):
    with pytest.raises(UserError, match="--report /sys/spotring-report: cannot write"):
        writable_folder(Path("/sys/spotring-report"), "--report")
    with pytest.raises(UserError, match="--workdir"):
        RunLock(Path("/sys/spotring-run/.lock"), "--workdir /sys/spotring-run").acquire(Created())
    assert not Path("/sys/spotring-run").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a folder"):
        writable_folder(tmp_path / "file" / "report", "--report")
    writable_folder(tmp_path / "a" / "b", "--report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # the probe is gone


def test_the_start_decision():
    assert decide_start(None, False, ID, "w").kind is StartKind.FRESH
    assert decide_start({"id": "r1", "identity": ID.as_meta()}, True, ID, "w").kind is \
        StartKind.CONTINUE
    interrupted = {"id": "r1", "identity": ID.as_meta(), "ended": {"outcome": "interrupted"}}
    assert decide_start(interrupted, True, ID, "w").kind is StartKind.CONTINUE
    done = {"id": "r1", "ended": {"outcome": "done"}}
    start = decide_start(done, True, ID, "w")
    assert start.kind is StartKind.NEXT and start.previous_id == "r1"
    other = {"id": "r1", "identity": {**ID.as_meta(), "until_epochs": 150}}
    with pytest.raises(UserError, match=r"--until-epochs 150 .*same --until-epochs"):
        decide_start(other, True, ID, "--workdir w")
    assert decide_start({}, True, ID, "w").kind is StartKind.CONTINUE  # an older state


def test_a_run_whose_stop_never_finished_is_finished_not_continued():
    """A daemon killed while stopping a run whose job is over (or whose ring's end was
    recorded before the run's) leaves a run the next start only finishes stopping; a run
    stopped by hand or by its --duration goes on as before."""
    def run(**ended):
        return {"id": "r1", "identity": ID.as_meta(), "ended": ended or None}

    for outcome, code, over in (("done", 0, True), ("lost", 3, True), ("failed", 4, True),
                                ("workers-failing", 2, True)):
        start = decide_start(run(outcome=outcome, exit_code=code, job_over=over,
                                 stopped=False), True, ID, "w")
        assert start.kind is StartKind.FINISH and start.run_id() == "r1", outcome
    for outcome in ("interrupted", "duration"):  # Ctrl-C, --duration: the run goes on
        start = decide_start(run(outcome=outcome, job_over=False, stopped=False), True, ID,
                             "w")
        assert start.kind is StartKind.CONTINUE, outcome
    # a run cut at its --until-steps/--until-epochs: the work asked for is done
    cut = run(outcome="limit", job_over=True, stopped=False)
    assert decide_start(cut, True, ID, "w").kind is StartKind.FINISH
    assert decide_start({**cut, "ended": {**cut["ended"], "stopped": True}}, True, ID,
                        "w").kind is StartKind.NEXT
    stopped_lost = run(outcome="lost", exit_code=3, job_over=True, stopped=True)
    assert decide_start(stopped_lost, True, ID, "w").kind is StartKind.CONTINUE
    # the end not recorded, but the ring's end was (the verdict comes from that record)
    for ring in ({"outcome": "done"}, {"outcome": "lost"}, {"outcome": "failed"}):
        assert decide_start(run(), True, ID, "w", ring).kind is StartKind.FINISH, ring
    limited = {**run(), "identity": {**ID.as_meta(), "until_epochs": 3}}
    limited_id = RunIdentity(**{**ID.as_meta(), "until_epochs": 3})
    assert decide_start(limited, True, limited_id, "w", {"epoch": 3}).kind is StartKind.FINISH
    assert decide_start(limited, True, limited_id, "w", {"epoch": 2}).kind is \
        StartKind.CONTINUE
    assert decide_start(run(), True, ID, "w", {"outcome": "running"}).kind is \
        StartKind.CONTINUE


def test_archive_moves_the_finished_run_and_deletes_nothing(tmp_path):
    wd = Workdir(tmp_path)
    for d in (wd.workers, wd.samples, wd.snapshots / "r1", wd.snapshots / "r2", wd.report,
              wd.cloud):
        d.mkdir(parents=True)
        (d / "f").write_text(d.name)
    wd.state.write_text("db")
    (tmp_path / "state.sqlite-wal").write_text("wal")
    (tmp_path / "notes.txt").write_text("the user's")
    dest = archive(wd, "r1", wd.report)
    assert dest == wd.runs / "r1"
    assert sorted(p.name for p in dest.iterdir()) == ["report", "samples", "snapshots",
                                                      "state.sqlite", "state.sqlite-wal",
                                                      "workers"]
    assert (dest / "samples" / "f").read_text() == "samples"
    assert (dest / "snapshots" / "f").read_text() == "r1"  # that run's snapshots only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cloud", "notes.txt", "runs",
                                                          "snapshots"]
    assert [p.name for p in wd.snapshots.iterdir()] == ["r2"]
    wd.state.write_text("db2")
    assert archive(wd, "r1", None) == wd.runs / "r1.2"  # never over an earlier archive
