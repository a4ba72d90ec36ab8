"""``provision list``, ``logs`` and ``down`` against fake runs: the registry prunes dead
daemons, ``logs -f`` follows while a daemon holds the run's lock and ends when it exits, and
``down`` is refused (one line, exit 2) while a daemon holds it. A real daemon:
tests/e2e/test_detach_ops.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.daemon.run import registry
from provisioner.daemon.run.lock import held_by

from tests.fakes.wait import wait_for

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
log = open(sys.argv[2], "a")
for k in range(int(sys.argv[3])):
    log.write(f"line {k}\\n"); log.flush(); time.sleep(0.2)
while not os.path.exists(sys.argv[4]):
    time.sleep(0.05)
if len(sys.argv) > 5:  # as a daemon ends: its lock released, then its end printed
    fcntl.flock(fd, fcntl.LOCK_UN)
    time.sleep(float(sys.argv[5]))
    log.write("stopped: interrupted\\n"); log.flush()
"""


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRING_STATE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def cli(capsys, *args):
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def holder(wd: Path, lines: int, release: Path, end_after: float | None = None
           ) -> subprocess.Popen:
    """A stand-in daemon: holds WORKDIR/.lock, writes ``lines`` lines to daemon.log, and
    exits once ``release`` exists (with ``end_after``: releases the lock, then writes its
    end line that many seconds later, as ``provision run`` prints its end)."""
    wd.mkdir(parents=True, exist_ok=True)
    extra = [] if end_after is None else [str(end_after)]
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(wd / ".lock"),
                             str(wd / "daemon.log"), str(lines), str(release), *extra])
    assert wait_for(lambda: held_by(wd / ".lock") == proc.pid, 60)
    return proc


def follow_logs(wd: Path) -> tuple[subprocess.Popen, list[str]]:
    """``provision logs WD -f`` as a process, once it is surely following, and the lines it
    printed so far: it prints the log's tail (one write), then checks the lock and follows.
    A line the test adds to the log after that tail is printed only by the follow loop, so
    a test that releases the holder before the process checked the lock (its start is slow
    on a loaded machine) cannot see "nothing to follow" instead (CI saw it so once)."""
    follow = subprocess.Popen([sys.executable, "-m", "provisioner", "logs", str(wd), "-f"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert follow.stdout is not None
    first = follow.stdout.readline()  # the tail's first line: the tail is printed whole
    assert first, follow.communicate(timeout=60)
    with open(wd / "daemon.log", "a") as fh:
        fh.write("mark\n")
    seen = [first]
    while seen[-1] != "mark\n":
        seen.append(follow.stdout.readline())
        assert seen[-1], follow.communicate(timeout=60)
    return follow, seen


def printed(follow: subprocess.Popen, seen: list[str]) -> list[str]:
    """Everything ``follow`` printed: ``seen`` (read by :func:`follow_logs`), then the rest."""
    assert follow.stdout is not None and follow.stderr is not None
    # read through the same buffered pipe: communicate() reads the descriptor and would
    # miss lines that readline() already buffered
    out, err = follow.stdout.read(), follow.stderr.read()
    assert follow.wait(timeout=120) == 0 and not err, err
    return "".join(seen + [out]).splitlines()


def test_registry_lists_live_runs_and_prunes_dead_ones(tmp_path, capsys, state_home):
    me = registry.register(run_id="r-live", driver="local", workdir=tmp_path, state=tmp_path /
                           "state.sqlite", lock=tmp_path / ".lock", job="j.py")
    assert me is not None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = registry.runs_dir() / f"{dead}.json"
    stale.write_text(json.dumps({**json.loads(registry._path(os.getpid()).read_text()),
                                 "pid": int(dead), "run_id": "r-dead"}))
    try:
        code, out, _ = cli(capsys, "list", "--json")
        runs = json.loads(out)
        assert code == 0 and [r["run"] for r in runs] == ["r-live"]
        assert runs[0]["pid"] == os.getpid() and runs[0]["alive"] is True
        assert runs[0]["workdir"] == str(tmp_path) and runs[0]["job"] == "j.py"
        assert not stale.exists()  # pruned as it was read
        code, out, _ = cli(capsys, "runs")
        assert code == 0 and "r-live" in out
        assert registry.find("r-li").pid == os.getpid()
    finally:
        registry.unregister()
    code, out, _ = cli(capsys, "list")
    assert code == 0 and "no runs" in out


def test_logs_follows_while_the_daemon_holds_the_lock(tmp_path):
    wd, release = tmp_path / "w", tmp_path / "release"
    proc = holder(wd, 10, release)
    try:
        assert wait_for(lambda: "line 0" in (wd / "daemon.log").read_text(), 120)
        follow, seen = follow_logs(wd)
        assert wait_for(lambda: "line 9" in (wd / "daemon.log").read_text(), 120)
        time.sleep(1.0)
        assert follow.poll() is None  # the daemon still holds the run: still following
        release.touch()
        lines = printed(follow, seen)
        assert lines == (wd / "daemon.log").read_text().splitlines()
        assert [ln for ln in lines if ln != "mark"] == [f"line {k}" for k in range(10)]
    finally:
        release.touch()
        proc.wait(timeout=60)


def test_logs_follow_prints_the_end_a_daemon_writes_after_releasing_its_lock(tmp_path):
    # `provision run` releases the run's lock, then prints "stopped: ...". Following ended
    # at the first poll that found the lock free, before that line on a loaded machine (the
    # e2e detach test failed so once); it now waits for the daemon's process to end.
    wd, release = tmp_path / "w", tmp_path / "release"
    proc = holder(wd, 2, release, end_after=1.5)
    try:
        assert wait_for(lambda: "line 1" in (wd / "daemon.log").read_text(), 120)
        follow, seen = follow_logs(wd)
        release.touch()
        assert printed(follow, seen) == ["line 0", "line 1", "mark", "stopped: interrupted"]
    finally:
        release.touch()
        proc.wait(timeout=60)


def test_logs_without_a_daemon_prints_and_says_so(tmp_path, capsys):
    wd = tmp_path / "w"
    (wd / "cloud" / "logs").mkdir(parents=True)
    (wd / "daemon.log").write_text("a\nb\nc\n")
    (wd / "cloud" / "logs" / "loc-1.log").write_text("step 1\n")
    code, out, err = cli(capsys, "logs", str(wd), "-f", "-n", "2")
    assert code == 0 and out == "b\nc\n" and "nothing to follow" in err
    code, out, _ = cli(capsys, "logs", str(wd), "--worker", "loc-1")
    assert "[daemon] a" in out and "[loc-1] step 1" in out
    code, _, err = cli(capsys, "logs", str(wd), "--worker", "loc-9")
    assert code == 2 and "loc-9" in err and "loc-1" in err


def test_logs_and_down_name_the_fix_when_there_is_no_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for cmd in ("logs", "down"):
        code, _, err = cli(capsys, cmd)
        assert code == 2 and err.strip().count("\n") == 0 and "spotring-run" in err, err
        code, _, err = cli(capsys, cmd, "nope")
        assert code == 2 and "provision list" in err, err


def test_down_is_refused_while_a_daemon_holds_the_run(tmp_path, capsys):
    wd, release = tmp_path / "w", tmp_path / "release"
    proc = holder(wd, 0, release)
    try:
        (wd / "state.sqlite").write_bytes(b"")
        code, _, err = cli(capsys, "down", str(wd))
        assert code == 2 and err.strip().count("\n") == 0
        assert f"pid {proc.pid}" in err and "stop it first" in err
        assert held_by(wd / ".lock") == proc.pid  # untouched
    finally:
        release.touch()
        proc.wait(timeout=60)


def test_logs_of_a_cloud_worker_are_its_shipped_lines(tmp_path, capsys):
    """On a cloud run, --worker reads the lines the instance's boot shipped to the run's
    artifacts (provisioner/drivers/shiplog.py), kept after the instance is gone; a worker's
    ring name (<instance id>/<gpu>) names its instance."""
    from provisioner.drivers.artifacts import DirStore
    from provisioner.drivers.shiplog import chunk_key

    art = tmp_path / "artifacts"
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[cloud]\ndriver = "aws"\nartifacts = "{art}"\n'
                   f'[daemon]\nstate_path = "{tmp_path / "state.sqlite"}"\n')
    store, chunk = DirStore(art), tmp_path / "chunk"
    for unit, seq, text in (("boot", 0, "spotring-boot: started 1 worker(s)\n"),
                            ("spotring-worker@0.service", 0, "joined at step 0\n"),
                            ("spotring-worker@0.service", 1, "left at step 9\n")):
        chunk.write_text(text)
        store.put(chunk_key("i-0abc", unit, seq), chunk)
    code, out, err = cli(capsys, "logs", "--config", str(cfg), "--worker", "i-0abc")
    assert code == 0, err
    assert out.splitlines() == ["[i-0abc boot] spotring-boot: started 1 worker(s)",
                                "[i-0abc spotring-worker@0.service] joined at step 0",
                                "[i-0abc spotring-worker@0.service] left at step 9"]
    code, out, _ = cli(capsys, "logs", "--config", str(cfg), "--worker", "i-0abc/0", "-n", "1")
    assert code == 0 and out.splitlines()[-1].endswith("left at step 9")
    code, _, err = cli(capsys, "logs", "--config", str(cfg), "--worker", "i-0zzz")
    assert code == 2 and "i-0zzz" in err and "no lines shipped" in err
