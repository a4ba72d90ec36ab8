"""The CLI as a user meets it (issues 30.9 and 31.6): one way to name a run in ``status``,
``logs``, ``stop``, ``down`` and ``revoke``; ``--name``; ``provision stop``; tables that fit
80 columns (ids never cut) and grow on a wider terminal; every numeric flag checked (one
line naming the flag and the fix, exit 2, nothing changed).

The runs are state files written here and stand-in daemons (a process holding a run's lock,
as tests/provisioner/commands/test_ops.py has them); a real daemon: tests/e2e.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pricing.model import Offering
from provisioner.cli import main
from provisioner.daemon.run import registry
from provisioner.daemon.run.lock import held_by
from provisioner.daemon.state import State
from tests.fakes.wait import wait_for

OFF = Offering("local", "local-1", "local-1a", "p3.2xlarge")
LONG_ID = "loc-0123456789abcdef0123-0"

#: A stand-in daemon: holds WORKDIR/.lock and, on SIGINT, records the run's end and exits
#: (what a daemon does, in a few lines).
STOPPABLE = """
import fcntl, json, os, signal, sqlite3, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
def stop(*_):
    db = sqlite3.connect(sys.argv[2])
    run = json.loads(db.execute("SELECT value FROM meta WHERE key='run'").fetchone()[0])
    run["ended"] = {"outcome": "interrupted", "reason": "interrupted", "fleet_kept": False,
                    "stopped": True}
    db.execute("INSERT OR REPLACE INTO meta VALUES ('run', ?)", (json.dumps(run),))
    db.commit()
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
open(sys.argv[3], "w").close()
while True:
    time.sleep(0.05)
"""


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRING_STATE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def cli(capsys, *args):
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own errors end the program, as in a shell
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def a_run(wd: Path, name: str | None = None, run_id: str = "20261126T101010Z-abc123") -> Path:
    """A work directory holding a run (as a daemon leaves it), remembered under ``name``."""
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "cloud" / "instances").mkdir(parents=True, exist_ok=True)
    st = State(wd / "state.sqlite")
    st.set_meta("started_at", 0.0)
    st.set_meta("job", {"id": "spotring-demo", "driver": "local"})
    st.set_meta("run", {"id": run_id, "name": name, "identity": {"until_epochs": 30},
                        "ended": None})
    st.set_meta("ring", {"step": 340, "epoch": 12, "world": 2, "accuracy": 0.981})
    st.record_price(OFF, 0.0, 0.9)
    st.adopt(LONG_ID, OFF, 0.0)
    st.record_event(60.0, "launch", LONG_ID, OFF, "deficit: a long reason " * 6)
    st.record_metrics(1800.0, [("spend", "", 0.45)])
    st.close()
    registry.remember(name, driver="local", workdir=wd, state=wd / "state.sqlite",
                      config=None)
    return wd


def test_one_way_to_name_a_run(tmp_path, capsys):
    wd = a_run(tmp_path / "w", name="digits-try2")
    for ref in (["digits-try2"], [wd], [wd / "state.sqlite"], ["--workdir", wd],
                ["--state", wd / "state.sqlite"]):
        code, out, err = cli(capsys, "status", *ref, "--json")
        assert code == 0 and not err, (ref, err)
        doc = json.loads(out)
        assert doc["name"] == "digits-try2" and doc["ring"]["step"] == 340, ref
    code, _, err = cli(capsys, "status", "no-such-run")
    assert code == 2 and err.count("\n") == 1 and "--name" in err, err
    code, _, err = cli(capsys, "status", wd, "--workdir", tmp_path / "other")
    assert code == 2 and "named twice" in err
    # revoke: [RUN] ID, the same RUN
    code, _, err = cli(capsys, "revoke", "digits-try2", "loc-9")
    assert code == 2 and "loc-9: no live local instance" in err and str(wd) in err, err
    code, _, err = cli(capsys, "revoke", "loc-9", "--workdir", wd)
    assert code == 2 and "loc-9: no live local instance" in err, err
    code, out, _ = cli(capsys, "logs", "digits-try2", "--worker", "x")
    assert code == 2


def test_a_name_is_checked_and_belongs_to_one_run(tmp_path):
    a_run(tmp_path / "w", name="taken")
    with pytest.raises(Exception, match="--name 'bad name'"):
        registry.check_name("bad name", tmp_path / "x" / "state.sqlite")
    with pytest.raises(Exception, match="--name taken: already the name of the run in"):
        registry.check_name("taken", tmp_path / "other" / "state.sqlite")
    registry.check_name("taken", tmp_path / "w" / "state.sqlite")  # its own run: fine
    (tmp_path / "w" / "state.sqlite").unlink()
    registry.check_name("taken", tmp_path / "other" / "state.sqlite")  # its run is gone


def test_stop_asks_the_daemon_and_waits_for_its_end(tmp_path, capsys):
    wd = a_run(tmp_path / "w", name="to-stop")
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE, str(wd / ".lock"),
                             str(wd / "state.sqlite"), str(ready)])
    try:
        assert wait_for(lambda: ready.exists() and held_by(wd / ".lock") == proc.pid, 60)
        code, out, err = cli(capsys, "stop", "to-stop")
        assert code == 0 and not err, err
        assert f"pid {proc.pid}" in out and "interrupted, its fleet terminated" in out, out
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    code, out, _ = cli(capsys, "stop", "to-stop")  # nothing runs it now
    assert code == 0 and "nothing to stop" in out


@pytest.mark.parametrize("columns", [80, 160])
def test_status_and_list_fit_the_terminal(tmp_path, capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    wd = a_run(tmp_path / ("w" * 40), name="digits-a-rather-long-name")
    code, out, _ = cli(capsys, "status", wd)
    lines = out.splitlines()
    assert code == 0 and max(len(ln) for ln in lines) <= columns, out
    assert any(ln.strip().startswith(LONG_ID) for ln in lines), out  # the id, whole
    assert "epoch 12/30, step 340, accuracy 0.981" in out
    registry.register(run_id="20261126T101010Z-abc123", driver="local", workdir=wd,
                      state=wd / "state.sqlite", lock=wd / ".lock",
                      job="/a/long/path/to/the/users/job/file.py",
                      name="digits-a-rather-long-name")
    try:
        code, out, _ = cli(capsys, "list")
    finally:
        registry.unregister()
    lines = out.splitlines()
    assert code == 0 and max(len(ln) for ln in lines) <= columns, out
    assert lines[1].startswith("digits-a-rather-long-name ") and str(os.getpid()) in lines[1]
    assert ("JOB" in lines[0]) == (columns >= 120) and ("file.py" in out) == (columns >= 120)


@pytest.mark.parametrize("argv, needle", [
    (["run", "--seed", "-1"], "--seed -1: must be a whole number from 0"),
    (["run", "--name", "no spaces"], "--name 'no spaces'"),
    (["status", "--events", "-3"], "--events -3"),
    (["status", "--events", "1e9"], "argument --events: invalid int value"),
    (["logs", "-n", "-5"], "--lines -5"),
    (["revoke", "loc-1", "--window", "nan"], "--window nan"),
    (["revoke", "loc-1", "--window", "1e300"], "--window 1e+300"),
    (["stop", "--timeout", "0"], "--timeout 0"),
    (["stop", "--timeout", "inf"], "--timeout inf"),
])
def test_numbers_and_names_out_of_range_are_one_line_and_exit_2(tmp_path, capsys, argv,
                                                                 needle):
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = cli(capsys, *argv)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing changed
