"""``provision run`` on the local cloud as a user runs it, through the ways issue 15 lost jobs:
every worker killed at once, a second run on the same workdir, Ctrl-C then a rerun, and the
daemon SIGKILLed and restarted while the ring trains.

Real parts: the daemon process with its embedded coordinator, `python -m trainer worker`
processes in gloo rings, the local driver's records, SIGKILL (tests/fakes/local_run.py runs
and reads it). The market is the seeded built-in one with no outages (the only revocations
are the ones a test makes).

The tests marked ``needs_trainer`` need the trainer side of issue 15 (workers that keep
training while the coordinator is gone and re-report to a restarted one; snapshots): they
are skipped until ``trainer.state.snapshot`` exists.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes.local_run import REPO, RunProcess
from tests.fakes.wait import BOOT_S, wait_for

pytestmark = pytest.mark.slow
needs_trainer = pytest.mark.skipif(
    importlib.util.find_spec("trainer.state.snapshot") is None,
    reason="needs the trainer side of issue 15 (trainer.state.snapshot, workers that outlive the "
           "coordinator)")
QUIET = ("--outages-per-hour", "0", "--max-size", "3", "--speed", "60")


def no_snapshots(tmp_path: Path) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fleet]\nmarkets = ["spot"]\nmax_size = 3\n'
                   "[snapshot]\nevery_s = 0\nevery_steps = 0\n")
    return cfg


@pytest.mark.timeout(900)
def test_every_worker_killed_without_snapshots_is_a_lost_job_and_a_second_run_is_refused(
        tmp_path):
    """The issue's run: every worker SIGKILLed at once. With snapshots off, the job is lost:
    the run ends at once (no generation re-formed for minutes while billed), exit 3, one line
    saying why, the fleet terminated, and the report counts every step as lost (and all the
    money), never "steps lost 0"."""
    with RunProcess(tmp_path / "w", *QUIET, "--until-epochs", "200",
                    config=no_snapshots(tmp_path)).start() as run:
        assert wait_for(lambda: run.training(3, 20), BOOT_S, step_s=0.2, abort=run.exited)
        # a second run on the same workdir is refused, and the first is untouched
        second = subprocess.run([sys.executable, "-m", "provisioner.cli", "run", "--workdir",
                                 str(run.workdir), "--no-dashboard"], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert "is in use by another `provision run`" in second.stderr
        assert second.stderr.strip().count("\n") == 0
        assert run.poll() is None
        assert len(run.kill_workers()) == 3
        code = run.wait(timeout=120)
        out = run.log()
        assert code == 3, out
        errors = [ln for ln in out.splitlines() if ln.startswith("provision run: error:")]
        assert len(errors) == 1 and "the job was lost" in errors[0], out
        fig = run.report()
        assert fig["outcome"] == "lost" and fig["failure"], fig
        assert fig["steps_lost"] >= 20
        assert fig["money_lost_usd"] == pytest.approx(fig["spend_usd"])
        assert run.workers() == []
        assert run.meta("run")["ended"]["outcome"] == "lost"


@pytest.mark.timeout(900)
def test_ctrl_c_then_a_rerun_continues_the_same_run(tmp_path):
    """Ctrl-C drains and terminates the fleet and keeps everything; the same command again
    continues that run (same run id, same coordinator address and token, the simulated clock
    going on from the stop, spend adding up) instead of wiping it, and reports what the
    interruption cost. The run after a finished one moves it to ``runs/``."""
    with RunProcess(tmp_path / "w", *QUIET, "--until-epochs", "12").start() as run:
        wd = run.workdir
        assert wait_for(lambda: run.training(2, 5), BOOT_S, step_s=0.2, abort=run.exited)
        run.send(signal.SIGINT)
        assert run.wait(timeout=120) == 130, run.log()  # drained, reported, 128 + SIGINT
        run1 = run.meta("run")
        assert run1["ended"]["outcome"] == "interrupted" and not run1["ended"]["fleet_kept"]
        coord1, token1 = run.meta("coordinator"), (wd / "token").read_bytes()
        spend1, step1 = run.report()["spend_usd"], int(run.ring()["step"])
        logs1 = sorted(p.name for p in (wd / "workers").iterdir())
        assert run.workers() == [] and logs1

        time.sleep(5.0)  # a clock that kept running would be 300 simulated seconds further on
        assert run.start("run2.log").wait(timeout=240) == 0, run.log()
        run2 = run.meta("run")
        assert run2["id"] == run1["id"] and run2["ended"]["outcome"] == "done"
        assert run.meta("coordinator") == coord1 and (wd / "token").read_bytes() == token1
        cont = run.events("continued")
        assert len(cont) == 1
        assert cont[0].t - run1["ended"]["t"] < 150  # the clock went on from the stop
        fig = run.report()
        assert fig["spend_usd"] > spend1 and fig["daemon_restarts"] == 1
        assert set(logs1) <= {p.name for p in (wd / "workers").iterdir()}  # nothing deleted
        if fig["resumed_from"] is None:  # no snapshot to resume from: it started again
            assert fig["steps_lost"] >= step1, fig
        else:
            assert fig["steps_lost"] >= step1 - int(fig["resumed_from"]), fig

        run.flags[-1] = "1"  # --until-epochs 1: another run, after a finished one
        assert run.start("run3.log").wait(timeout=240) == 0, run.log()
        archived = wd / "runs" / run1["id"]
        assert (archived / "state.sqlite").exists()
        assert (archived / "report" / "report.json").exists()
        assert run.meta("run")["id"] != run1["id"]


@needs_trainer
@pytest.mark.timeout(900)
def test_daemon_killed_during_training_and_restarted_adopts_the_ring(tmp_path):
    """The daemon is not in the data path: SIGKILLed while the ring trains, its workers go on
    (same pids, more steps); restarted on the same workdir it adopts them, runs the coordinator
    on the same address with the same token, the ring re-reports (``adopted``), and training
    goes on where it was: no step lost for the restart, no sample twice in an epoch.

    The job is far longer than the test: it ends the run (Ctrl-C) once the adopted ring has
    trained on. A job the ring could finish while nobody coordinated (on a loaded machine the
    restart took longer than the rest of a 40-epoch job) leaves nothing to adopt."""
    with RunProcess(tmp_path / "w", *QUIET, "--until-epochs", "400",
                    "--record-samples").start() as run:
        # a ring of three formed and training (killed while a generation forms, the ring
        # waits for the coordinator: forming needs its store)
        assert wait_for(lambda: run.last_step(world=3) >= 30, BOOT_S, step_s=0.2,
                        abort=run.exited)
        coord = run.meta("coordinator")
        pids = sorted(r["pid"] for r in run.workers())
        step_at_kill = run.last_step()
        launches = len(run.events("launch"))
        run.send(signal.SIGKILL)
        run.wait(10)
        assert wait_for(lambda: run.last_step() > step_at_kill + 2, 120, step_s=0.1)
        assert sorted(r["pid"] for r in run.workers()) == pids  # the ring outlived the daemon
        run.start("run2.log")
        assert wait_for(lambda: bool(run.ring().get("adopted")), 120, step_s=0.2,
                        abort=run.exited), run.log()
        assert run.meta("coordinator") == coord
        assert int(run.ring()["step"]) >= step_at_kill
        adopted_at = run.last_step()
        assert wait_for(lambda: int(run.ring().get("step") or 0) > adopted_at + 10, 120,
                        step_s=0.2, abort=run.exited), run.log()  # on, coordinated again
        run.send(signal.SIGINT)
        assert run.wait(timeout=120) == 130, run.log()  # drained, reported, 128 + SIGINT
        assert len(run.events("launch")) == launches, "the fleet was relaunched, not adopted"
        fig = run.report()
        assert fig["daemon_restarts"] == 1, fig
        assert fig["restart_steps_lost"] == 0 and fig["steps_lost"] == 0, fig
        seen: dict[int, list[int]] = {}
        for f in (run.workdir / "samples").glob("*.jsonl"):
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                seen.setdefault(rec["epoch"], []).extend(rec["ids"])
        assert sorted(seen) == list(range(len(seen))) and len(seen) >= 2
        full = len(set(seen[0]))
        for epoch, ids in seen.items():
            assert len(ids) == len(set(ids)), f"epoch {epoch}: a sample trained twice"
            assert epoch == max(seen) or len(ids) == full, f"epoch {epoch}: samples missing"


@needs_trainer
def kill_every_worker_and_see_the_resume(run: RunProcess) -> dict:
    """Every worker of a three-member ring killed at once after a snapshot was taken: the
    replacements resume from the newest snapshot and train on, then Ctrl-C ends the run.
    The job is far longer than the story (the ring could otherwise finish before the kill
    lands, leaving nothing to resume, as it did beside a chaos run). Returns the report."""
    assert wait_for(lambda: run.training(3, 40) and run.ring().get("snapshot"), BOOT_S,
                    step_s=0.2, abort=run.exited)
    run.kill_workers()
    assert wait_for(lambda: run.ring().get("resumed_from") is not None, 240, step_s=0.2,
                    abort=run.exited), run.log()
    resumed = int(run.ring()["step"])
    assert wait_for(lambda: int(run.ring().get("step") or 0) >= resumed + 20, 120,
                    step_s=0.2, abort=run.exited), run.log()
    run.send(signal.SIGINT)
    assert run.wait(timeout=120) == 130, run.log()  # drained, reported, 128 + SIGINT
    fig = run.report()
    assert fig["resumed_from"] is not None and int(fig["resumed_from"]) >= 1, fig  # not step 1
    return fig


@pytest.mark.timeout(900)
def test_every_worker_killed_resumes_from_the_newest_snapshot(tmp_path):
    """With snapshots on (every 60 simulated seconds = 1 real second at --speed 60), every
    worker killed at once costs at most one interval: the replacements resume from the
    newest complete snapshot on the daemon host's disk and train on."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fleet]\nmarkets = ["spot"]\nmax_size = 3\n[snapshot]\nevery_s = 60\n')
    with RunProcess(tmp_path / "w", *QUIET, "--until-epochs", "400", config=cfg).start() as run:
        kill_every_worker_and_see_the_resume(run)
        assert any((run.workdir / "snapshots").rglob("*")), "nothing on the daemon's disk"


#: The user's own job (not the digits example): its epochs from the run's limit
#: (SPOTRING_UNTIL_EPOCHS, which every worker gets), metrics without an accuracy, and an
#: on_finish that leaves a file beside the job.
OWN_JOB = '''
import os
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from trainer.job import Job


def make_job(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(64, 4)
    y = x.sum(dim=1, keepdim=True)

    def evaluate(m):
        with torch.no_grad():
            mse = float(torch.nn.functional.mse_loss(m(x), y))
        return {"mse": mse, "r2": 1.0 - mse / float(y.var())}

    def on_finish(m):
        Path(__file__).with_suffix(".finished").write_text("trained")

    return Job(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
               loss_fn=torch.nn.functional.mse_loss, train_set=TensorDataset(x, y),
               global_batch=16, epochs=int(os.environ.get("SPOTRING_UNTIL_EPOCHS", "50")),
               evaluate=evaluate, on_finish=on_finish)
'''


@pytest.mark.timeout(900)
def test_until_epochs_applies_to_the_users_job_and_its_metrics_reach_the_report(tmp_path):
    """Issue 31.3 and 31.4: --until-epochs reaches any job that takes it (not only the digits
    example): the job ends there by itself, its on_finish runs, the run says done; what its
    evaluate returns (mse, r2: no accuracy) is in the report with its step, and the report
    names the job."""
    job = tmp_path / "ownjob.py"
    job.write_text(OWN_JOB)
    with RunProcess(tmp_path / "w", *QUIET, "--until-epochs", "3", "--job", str(job),
                    "--name", "own-try").start() as run:
        assert run.wait(timeout=240) == 0, run.log()
        out = run.log()
        assert "builds; 5 parameters, 3 epochs of 64 samples" in out, out
        assert "stopped: the job finished" in out and "mse " in out, out
        model = run.workdir / "model.pt"  # 26.7: the trained model by default, and where
        assert f"trained model: {model}" in out, out
        import torch

        assert set(torch.load(model, weights_only=True)) == {"weight", "bias"}
        fig = run.report()
        assert fig["outcome"] == "done" and fig["epochs"] == 3 and fig["name"] == "own-try"
        assert fig["job"] == str(job)
        assert set(fig["job_metrics"]["values"]) == {"mse", "r2"}, fig
        assert fig["job_metrics"]["step"] >= 1
        md = (run.workdir / "report" / "report.md").read_text()
        assert md.startswith(f"# spotring run own-try: {job}")
    assert job.with_suffix(".finished").read_text() == "trained"  # on_finish ran
