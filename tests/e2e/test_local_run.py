"""``provision run`` on the local cloud as a user runs it, through the ways issue 15 lost jobs:
every worker killed at once, a second run on the same workdir, Ctrl-C then a rerun, and the
daemon SIGKILLed and restarted while the ring trains.

Real parts: the daemon process with its embedded coordinator, `python -m trainer worker`
processes in gloo rings, the local driver's records, SIGKILL. The market is the seeded
built-in one with no outages (the only revocations are the ones a test makes).

The tests marked ``needs_trainer`` need the trainer side of issue 15 (workers that keep
training while the coordinator is gone and re-report to a restarted one; snapshots): they
are skipped until ``trainer.snapshot`` exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.daemon.state import State
from provisioner.drivers.local import running
from tests.conftest import REPO
from tests.fakes.wait import wait_for

pytestmark = pytest.mark.slow
JOB = "spotring-demo"
needs_trainer = pytest.mark.skipif(
    importlib.util.find_spec("trainer.snapshot") is None,
    reason="needs the trainer side of issue 15 (trainer.snapshot, workers that outlive the "
           "coordinator)")


def start(wd: Path, *flags: str, log: str = "run.log", config: Path | None = None
          ) -> subprocess.Popen:
    argv = [sys.executable, "-m", "provisioner.cli", "run", "--workdir", str(wd),
            "--no-dashboard", "--outages-per-hour", "0", "--max-size", "3", *flags]
    if config is not None:
        argv += ["--config", str(config)]
    wd.parent.mkdir(parents=True, exist_ok=True)
    out = open(wd.parent / log, "w")
    return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def meta(wd: Path, key: str):
    if not (wd / "state.sqlite").exists():
        return None
    st = State.read_only(wd / "state.sqlite")
    try:
        return st.get_meta(key)
    finally:
        st.close()


def events(wd: Path, kind: str) -> list:
    if not (wd / "state.sqlite").exists():
        return []
    st = State.read_only(wd / "state.sqlite")
    try:
        return st.events(kinds=[kind])
    finally:
        st.close()


def ring(wd: Path) -> dict:
    return meta(wd, "ring") or {}


def log_of(wd: Path, name: str = "run.log") -> str:
    p = wd.parent / name
    return p.read_text() if p.exists() else ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def cleanup(wd: Path) -> None:
    for rec in running(wd / "cloud", JOB):
        try:
            os.killpg(rec["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def training(wd: Path, world: int, step: int) -> bool:
    r = ring(wd)
    return int(r.get("world") or 0) >= world and int(r.get("step") or 0) >= step


@pytest.mark.timeout(300)
def test_every_worker_killed_without_snapshots_is_a_lost_job_and_a_second_run_is_refused(
        tmp_path):
    """The issue's run: every worker SIGKILLed at once. With snapshots off, the job is lost:
    the run ends at once (no generation re-formed for minutes while billed), exit 3, one line
    saying why, the fleet terminated, and the report counts every step as lost (and all the
    money), never "steps lost 0"."""
    wd = tmp_path / "w"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fleet]\nmarkets = ["spot"]\nmax_size = 3\n'
                   "[snapshot]\nevery_s = 0\nevery_steps = 0\n")
    proc = start(wd, "--speed", "60", "--until-epochs", "200", config=cfg)
    try:
        assert wait_for(lambda: training(wd, 3, 20), 180, step_s=0.2,
                        abort=lambda: log_of(wd) if proc.poll() is not None else None)
        # a second run on the same workdir is refused, and the first is untouched
        second = subprocess.run([sys.executable, "-m", "provisioner.cli", "run", "--workdir",
                                 str(wd), "--no-dashboard"], cwd=REPO, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert "is in use by another `provision run`" in second.stderr
        assert second.stderr.strip().count("\n") == 0
        assert proc.poll() is None
        pids = [r["pid"] for r in running(wd / "cloud", JOB)]
        assert len(pids) == 3
        for pid in pids:
            os.killpg(pid, signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        stop(proc)
        cleanup(wd)
    out = log_of(wd)
    assert code == 3, out
    errors = [ln for ln in out.splitlines() if ln.startswith("provision run: error:")]
    assert len(errors) == 1 and "the job was lost" in errors[0], out
    fig = json.loads((wd / "report" / "report.json").read_text())
    assert fig["outcome"] == "lost" and fig["failure"], fig
    assert fig["steps_lost"] >= 20 and fig["money_lost_usd"] == pytest.approx(fig["spend_usd"])
    assert running(wd / "cloud", JOB) == []
    st = State.read_only(wd / "state.sqlite")
    try:
        assert st.live_instances() == []
        assert st.get_meta("run")["ended"]["outcome"] == "lost"
    finally:
        st.close()


@pytest.mark.timeout(300)
def test_ctrl_c_then_a_rerun_continues_the_same_run(tmp_path):
    """Ctrl-C drains and terminates the fleet and keeps everything; the same command again
    continues that run (same run id, same coordinator address and token, the simulated clock
    going on from the stop, spend adding up) instead of wiping it, and reports what the
    interruption cost."""
    wd = tmp_path / "w"
    first = start(wd, "--speed", "60", "--until-epochs", "12")
    try:
        assert wait_for(lambda: training(wd, 2, 5), 180, step_s=0.2,
                        abort=lambda: log_of(wd) if first.poll() is not None else None)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 0, log_of(wd)
    finally:
        stop(first)
    run1 = meta(wd, "run")
    assert run1["ended"]["outcome"] == "interrupted" and not run1["ended"]["fleet_kept"]
    coord1 = meta(wd, "coordinator")
    token1 = (wd / "token").read_bytes()
    spend1 = json.loads((wd / "report" / "report.json").read_text())["spend_usd"]
    step1 = int(ring(wd)["step"])
    samples1 = sorted(p.name for p in (wd / "workers").iterdir())
    assert running(wd / "cloud", JOB) == [] and samples1
    second = start(wd, "--speed", "60", "--until-epochs", "12", log="run2.log")
    try:
        code = second.wait(timeout=240)
    finally:
        stop(second)
        cleanup(wd)
    out = log_of(wd, "run2.log")
    assert code == 0, out
    run2 = meta(wd, "run")
    assert run2["id"] == run1["id"] and run2["ended"]["outcome"] == "done"
    assert meta(wd, "coordinator") == coord1 and (wd / "token").read_bytes() == token1
    cont = events(wd, "continued")
    assert len(cont) == 1
    assert cont[0].t - run1["ended"]["t"] < 600  # the clock went on from the stop
    fig = json.loads((wd / "report" / "report.json").read_text())
    assert fig["spend_usd"] > spend1 and fig["daemon_restarts"] == 1
    assert set(samples1) <= {p.name for p in (wd / "workers").iterdir()}  # nothing deleted
    if fig["resumed_from"] is None:  # no snapshot to resume from: it started again
        assert fig["steps_lost"] >= step1, fig
    else:
        assert fig["steps_lost"] >= step1 - int(fig["resumed_from"]), fig
    # the finished run is moved aside, not deleted, by the next start
    third = start(wd, "--speed", "60", "--until-epochs", "1", log="run3.log")
    try:
        assert third.wait(timeout=240) == 0, log_of(wd, "run3.log")
    finally:
        stop(third)
        cleanup(wd)
    archived = wd / "runs" / run1["id"]
    assert (archived / "state.sqlite").exists() and (archived / "report" / "report.json").exists()
    assert meta(wd, "run")["id"] != run1["id"]


@needs_trainer
@pytest.mark.timeout(420)
def test_daemon_killed_during_training_and_restarted_adopts_the_ring(tmp_path):
    """The daemon is not in the data path: SIGKILLed while the ring trains, its workers go on
    (same pids); restarted on the same workdir it adopts them, runs the coordinator on the
    same address with the same token, the ring re-reports (``adopted``), and training goes on
    where it was: no step lost for the restart, every sample once per epoch."""
    wd = tmp_path / "w"
    epochs = 40
    first = start(wd, "--speed", "60", "--until-epochs", str(epochs), "--record-samples")
    try:
        assert wait_for(lambda: training(wd, 3, 30), 180, step_s=0.2,
                        abort=lambda: log_of(wd) if first.poll() is not None else None)
        coord = meta(wd, "coordinator")
        pids = sorted(r["pid"] for r in running(wd / "cloud", JOB))
        step_at_kill = int(ring(wd)["step"])
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        time.sleep(2.0)
        assert sorted(r["pid"] for r in running(wd / "cloud", JOB)) == pids  # still alive
        assert all(alive(p) for p in pids)
        launches_before = len(events(wd, "launch"))
        second = start(wd, "--speed", "60", "--until-epochs", str(epochs), "--record-samples",
                       log="run2.log")
        try:
            assert wait_for(lambda: bool(ring(wd).get("adopted")), 120, step_s=0.2,
                            abort=lambda: log_of(wd, "run2.log") if second.poll() is not None
                            else None), log_of(wd, "run2.log")
            assert meta(wd, "coordinator") == coord
            assert int(ring(wd)["step"]) >= step_at_kill
            code = second.wait(timeout=300)
        finally:
            stop(second)
    finally:
        stop(first)
        cleanup(wd)
    assert code == 0, log_of(wd, "run2.log")
    adopted = {e.instance_id for e in events(wd, "adopted")}
    assert len(events(wd, "launch")) == launches_before or adopted, "the fleet was relaunched"
    fig = json.loads((wd / "report" / "report.json").read_text())
    assert fig["outcome"] == "done" and fig["daemon_restarts"] == 1, fig
    assert fig["restart_steps_lost"] == 0 and fig["adopted"], fig
    assert fig["steps_lost"] == 0, fig
    seen: dict[int, list[int]] = {}
    for f in (wd / "samples").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            seen.setdefault(rec["epoch"], []).extend(rec["ids"])
    assert sorted(seen) == list(range(epochs))
    for epoch, ids in seen.items():
        assert len(ids) == len(set(ids)), f"epoch {epoch}: a sample trained twice"


@needs_trainer
@pytest.mark.timeout(300)
def test_every_worker_killed_resumes_from_the_newest_snapshot(tmp_path):
    """With snapshots on (every 60 simulated seconds = 1 real second at --speed 60), every
    worker killed at once costs at most one interval: the replacements resume from the
    newest complete snapshot, the job finishes, and the report says where it resumed."""
    wd = tmp_path / "w"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fleet]\nmarkets = ["spot"]\nmax_size = 3\n[snapshot]\nevery_s = 60\n')
    proc = start(wd, "--speed", "60", "--until-epochs", "30", config=cfg)
    try:
        assert wait_for(lambda: training(wd, 3, 40) and ring(wd).get("snapshot"), 180,
                        step_s=0.2, abort=lambda: log_of(wd) if proc.poll() is not None else None)
        for rec in running(wd / "cloud", JOB):
            os.killpg(rec["pid"], signal.SIGKILL)
        code = proc.wait(timeout=240)
    finally:
        stop(proc)
        cleanup(wd)
    assert code == 0, log_of(wd)
    fig = json.loads((wd / "report" / "report.json").read_text())
    assert fig["outcome"] == "done" and fig["resumed_from"] is not None, fig
    assert fig["accuracy"] >= 0.9, fig
    assert any((wd / "snapshots").rglob("*")), "no snapshot on the daemon host's disk"
