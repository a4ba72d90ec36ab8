"""provision run / status: bad input is one line, exit 2, and NOTHING changed: no workdir
created, no file of an earlier run touched, nothing left running (issue 15, item 5)."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
from pathlib import Path

import pytest

from pricing.model import Offering
from provisioner.cli import main
from provisioner.daemon.run.lock import Created, RunLock
from provisioner.daemon.state import State
from tests.conftest import REPO

FAKE = REPO / "tests" / "fakes" / "local_worker.py"


@pytest.fixture
def provision(capsys, monkeypatch):
    monkeypatch.chdir(REPO)

    def run(*args):
        code = main([str(a) for a in args])
        cap = capsys.readouterr()
        return code, cap.out, cap.err
    return run


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its content hash (and every folder)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(folder.rglob("*"))}


def an_earlier_run(wd: Path) -> None:
    """A work directory holding a run that was interrupted (so a start would continue it)."""
    (wd / "workers").mkdir(parents=True)
    (wd / "workers" / "w.jsonl").write_text("{}\n")
    (wd / "samples").mkdir()
    st = State(wd / "state.sqlite")
    st.set_meta("run", {"id": "r1", "ended": {"outcome": "interrupted", "t": 0.0,
                                                "fleet_kept": False}})
    st.set_meta("started_at", 0.0)
    st.close()


@pytest.mark.parametrize("flags, needle", [
    (["--speed", "inf"], "--speed inf: must be a finite number"),
    (["--speed", "0"], "--speed 0"),
    (["--outages-per-hour", "1e9"], "--outages-per-hour 1e+09"),
    (["--outages-per-hour", "nan"], "--outages-per-hour nan"),
    (["--max-size", "0"], "--max-size 0"),
    (["--max-size", "100000"], "--max-size 100000"),
    (["--until-epochs", "0"], "--until-epochs 0"),
    (["--duration", "99999999999d"], "--duration '99999999999d': at most 365d"),
    (["--duration", "inf"], "--duration 'inf'"),
    (["--metrics-port", "70000"], "--metrics-port 70000"),
])
def test_absurd_flags_are_one_line_exit_2_and_nothing_created(tmp_path, provision, flags,
                                                             needle):
    wd = tmp_path / "w"
    code, out, err = provision("run", "--workdir", wd, *flags)
    assert code == 2 and needle in err, err
    assert err.strip().count("\n") == 0
    assert not wd.exists()


def test_an_absurd_price_in_the_config_names_the_field(tmp_path, provision):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[objective]\nbudget_per_hour = 1e308\n")
    code, _, err = provision("run", "--config", cfg, "--workdir", tmp_path / "w")
    assert code == 2 and "objective.budget_per_hour" in err and "1e+308" in err
    cfg.write_text('[job]\nthroughput_priors = { "p3.2xlarge" = inf }\n')
    code, _, err = provision("run", "--config", cfg, "--workdir", tmp_path / "w")
    assert code == 2 and "job.throughput_priors" in err and "finite" in err
    assert not (tmp_path / "w").exists()


def test_unwritable_report_folder_or_workdir(tmp_path, provision):
    code, _, err = provision("run", "--workdir", tmp_path / "w", "--report", "/sys/spotring-r")
    assert code == 2 and "--report /sys/spotring-r: cannot write" in err, err
    assert not (tmp_path / "w").exists()
    code, _, err = provision("run", "--workdir", "/sys/spotring-w")
    assert code == 2 and "--workdir /sys/spotring-w" in err and "writable" in err, err
    assert not Path("/sys/spotring-w").exists()


def test_a_busy_workdir_is_refused_and_left_as_it_was(tmp_path, provision):
    wd = tmp_path / "w"
    an_earlier_run(wd)
    holder = RunLock(wd / ".lock", "the other run")
    holder.acquire(Created())
    before = tree(wd)
    try:
        code, _, err = provision("run", "--workdir", wd, "--no-dashboard")
    finally:
        holder.release()
    assert code == 2 and f"--workdir {wd} is in use by another `provision run`" in err, err
    assert tree(wd) == before


def test_a_busy_port_changes_nothing_in_an_earlier_runs_workdir(tmp_path, provision):
    """The issue's case: a busy metrics port used to exit 2 "with nothing changed" after the
    workdir's samples, workers, cloud and state were already deleted."""
    wd = tmp_path / "w"
    an_earlier_run(wd)
    before = tree(wd)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, _, err = provision("run", "--workdir", wd, "--metrics-port", port)
        assert code == 2 and "already in use" in err, err
        cfg = tmp_path / "c.toml"
        cfg.write_text(f"[daemon]\ncoordinator_port = {port}\n")
        code, _, err = provision("run", "--config", cfg, "--workdir", wd)
        assert code == 2 and "coordinator_port" in err, err
        # a fresh workdir is not even created
        code, _, err = provision("run", "--config", cfg, "--workdir", tmp_path / "fresh")
        assert code == 2 and not (tmp_path / "fresh").exists(), err
    after = tree(wd)
    after.pop(".lock", None)  # an empty lock file may stay (never deleted once shared)
    assert after == before


def test_missing_token_while_the_runs_workers_live(tmp_path, provision):
    from datetime import datetime, timezone

    from provisioner.drivers.base import LaunchRequest
    from provisioner.drivers.local import LocalDriver

    wd = tmp_path / "w"
    an_earlier_run(wd)
    out = tmp_path / "out"
    out.mkdir()
    drv = LocalDriver(wd / "cloud", lambda spec: [sys.executable, str(FAKE), str(out),
                                                 spec.instance_id],
                      clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc),
                      terminate_grace_s=1.0)
    inst = drv.launch(LaunchRequest(Offering("local", "local-1", "local-1a", "p3.2xlarge"), 1,
                                    "spotring-demo", "tok-1")).instances
    try:
        before = tree(wd)
        code, _, err = provision("run", "--workdir", wd, "--no-dashboard")
        assert code == 2 and f"{wd / 'token'}: missing" in err and "kill" in err, err
        assert err.strip().count("\n") == 0
        after = tree(wd)
        after.pop(".lock", None)
        assert after == before
        assert [i.id for i in drv.list("spotring-demo")] == [inst[0].id]  # still running
    finally:
        drv.terminate([i.id for i in inst])


def test_status_never_writes_and_json_is_finite(tmp_path, capsys):
    st = State(tmp_path / "state.sqlite")
    off = Offering("local", "local-1", "local-1a", "p3.2xlarge")
    st.set_meta("started_at", 0.0)
    st.set_meta("job", {"id": "j", "driver": "local"})
    st.set_meta("ring", {"step": 3, "steps_lost": 0, "loss": float("inf")})
    st.record_price(off, 0.0, 3.6)
    st.adopt("loc-1", off, 0.0)
    st.record_metrics(1800.0, [("spend", "", 1.8)])
    st.close()
    before = tree(tmp_path)
    assert main(["status", "--workdir", str(tmp_path), "--json"]) == 0
    text = capsys.readouterr().out
    assert "Infinity" not in text and json.loads(text)["ring"]["step"] == 3
    assert main(["status", "--workdir", str(tmp_path)]) == 0
    assert "step 3" in capsys.readouterr().out
    assert tree(tmp_path) == before
    assert main(["status", "--state", str(tmp_path / "nope.sqlite")]) == 2
    assert not (tmp_path / "nope.sqlite").exists()


def test_a_link_out_of_the_workdir_is_refused_and_never_followed(tmp_path, provision):
    """Issue 30's case: a dangling symlink in the workdir made the daemon create its target.
    Now the start is refused (one line naming the link, exit 2) and nothing is created on
    either side of the link."""
    wd = tmp_path / "w"
    wd.mkdir()
    target = tmp_path / "elsewhere" / "state.sqlite"
    (wd / "state.sqlite").symlink_to(target)
    before = tree(wd)
    code, _, err = provision("run", "--workdir", wd, "--no-dashboard")
    assert code == 2 and f"{wd / 'state.sqlite'} is a link" in err, err
    assert err.strip().count("\n") == 0
    assert not target.exists() and not target.parent.exists()
    assert tree(wd) == before
