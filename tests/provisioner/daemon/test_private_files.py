"""A run's files are its owner's alone whatever the umask (issue 30, item 5): the work
directory, its state, token, lock, snapshots, worker logs and report, and the registry's
entry, created 0700 (folders) and 0600 (files) under ``umask 000``; the caller's umask is
given back after the run.

Real parts: the run session over the local environment, SQLite, the local driver and its
worker processes (the stand-in worker), the registry; the ring is the Protocol's fake.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from provisioner.daemon.run.lock import Created, RunLock
from provisioner.daemon.run.session import RunSession
from provisioner.daemon.state import State
from tests.fakes.local_run import fake_ring_environment, local_options, run_until
from tests.fakes.ring import FakeRing


def shared(root: Path) -> list[str]:
    """Everything under ``root`` (and ``root``) another user could read, write or enter."""
    paths = [root, *root.rglob("*")]
    return [f"{p} {stat.filemode(p.stat().st_mode)}" for p in paths
            if not p.is_symlink() and p.stat().st_mode & 0o077]


def test_a_runs_files_are_its_owners_alone_whatever_the_umask(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPOTRING_STATE_HOME", str(home))
    wd = tmp_path / "w"
    ring = FakeRing()
    o = local_options(wd)
    session = RunSession(o, fake_ring_environment(o, ring, tmp_path / "out"), signals=False)
    old = os.umask(0)
    try:
        box = run_until(session, wd, ring, {"outcome": "done", "finished": True})
        assert os.umask(0) == 0  # the run gave the caller's umask back
    finally:
        os.umask(old)
    assert "result" in box, box
    for name in ("state.sqlite", "token", ".lock", "report/report.json", "report/report.md"):
        assert (wd / name).is_file(), name
    assert list((wd / "cloud" / "logs").glob("*.log")), "no worker log"
    assert [p for p in (wd / "snapshots").iterdir() if p.is_dir()], "no snapshot folder"
    assert shared(wd) == []
    assert shared(home) == []


def test_the_state_and_a_lock_made_outside_a_run_are_private_too(tmp_path):
    old = os.umask(0)
    try:
        State(tmp_path / "a" / "state.sqlite").close()
        created = Created()
        RunLock(tmp_path / "b" / ".lock", "--workdir b").acquire(created)
    finally:
        os.umask(old)
    assert shared(tmp_path / "a") == [] and shared(tmp_path / "b") == []


def test_folders_made_before_a_failed_mkdir_are_recorded_and_undone(tmp_path, monkeypatch):
    """``mkdir -p a/b/c`` that fails at ``c`` leaves ``a`` and ``b`` made by this start:
    ``Created`` records them as they are made, so undoing the failed start removes them
    (and nothing that was there before)."""
    mine = tmp_path / "users"
    mine.mkdir()
    target = mine / "a" / "b" / "c"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == target:
            raise OSError(28, "No space left on device")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    created = Created()
    try:
        created.mkdirs(target)
    except OSError:
        pass
    else:
        raise AssertionError("the injected failure did not happen")
    assert (mine / "a" / "b").is_dir()
    assert stat.S_IMODE((mine / "a").stat().st_mode) == 0o700
    created.undo()
    assert mine.is_dir() and list(mine.iterdir()) == []
