"""The ring's end recorded beside its snapshots (issue 30 item 4, the trainer's side): a
daemon killed less than one metrics period after the ring finished recorded only "running";
the coordinator's signed ``run.end.json`` makes its next start finish the run's stop, not
train it again. A marker forged without the token is refused."""

from __future__ import annotations

from pathlib import Path

from provisioner.daemon.run.workdir import RunIdentity, StartKind, decide_start
from provisioner.daemon.wiring import with_recorded_end
from tests.fakes.local_run import local_options
from trainer.protocol.admission import derive_key
from trainer.state import snapshot as snap

TOKEN = b"run-token"
IDENTITY = RunIdentity("job", "examples/digits.py", 3, "generator seed 1, 0 outages/h")
RUN = {"id": "20261126T000000Z-abcdef", "identity": IDENTITY.as_meta(), "ended": None}


def _marker(folder: Path, token: bytes) -> None:
    vault = snap.Vault(snap.DirStore(folder), key=derive_key(token, b"snapshot manifest"))
    try:
        vault.record_end({"outcome": "done", "step": 690, "epoch": 3, "finished": True})
    finally:
        vault.close()


def test_a_recorded_end_finishes_the_stop_instead_of_training_again(tmp_path: Path) -> None:
    settings = local_options(tmp_path / "w").settings
    folder = tmp_path / "snapshots" / RUN["id"]
    running = {"outcome": "running", "step": 680, "epoch": 2}  # the last metrics period
    assert decide_start(RUN, True, IDENTITY, "w", running).kind is StartKind.CONTINUE
    _marker(folder, TOKEN)
    ring = with_recorded_end(running, settings, folder.resolve().as_uri(), TOKEN)
    assert ring["finished"] and ring["outcome"] == "done" and ring["step"] == 690
    start = decide_start(RUN, True, IDENTITY, "w", ring)
    assert start.kind is StartKind.FINISH and start.ring == ring


def test_a_forged_or_missing_marker_changes_nothing(tmp_path: Path) -> None:
    settings = local_options(tmp_path / "w").settings
    folder = tmp_path / "snapshots" / RUN["id"]
    running = {"outcome": "running", "step": 680}
    missing = tmp_path / "nowhere"
    assert with_recorded_end(running, settings, missing.as_uri(), TOKEN) == running
    assert not missing.exists()  # read only: nothing created
    _marker(folder, b"someone else's token")
    assert with_recorded_end(running, settings, folder.as_uri(), TOKEN) == running
    (folder / snap.END).write_text("[" * 100_000)
    assert with_recorded_end(running, settings, folder.as_uri(), TOKEN) == running


def test_a_cloud_daemon_reads_the_recorded_end_too(tmp_path: Path) -> None:
    from provisioner.config import parse_settings
    from provisioner.daemon.run.cloud import CloudEnvironment
    from provisioner.daemon.run.options import RunOptions
    from provisioner.daemon.run.session import Found

    settings = parse_settings({"cloud": {"driver": "aws"}, "job": {"id": "job"},
                               "daemon": {"state_path": str(tmp_path / "state.sqlite")}})
    env = CloudEnvironment(RunOptions(settings=settings))
    env._token = TOKEN  # what check() reads from daemon.token_path
    identity = env.identity()
    found = Found(True, {"run": {**RUN, "identity": identity.as_meta()},
                         "ring": {"outcome": "running", "step": 680}})
    assert env.decide(found).kind is StartKind.CONTINUE  # no marker: the run goes on
    _marker(tmp_path / "snapshots" / "job", TOKEN)  # where the cloud coordinator snapshots
    start = env.decide(found)
    assert start.kind is StartKind.FINISH and start.ring["step"] == 690
