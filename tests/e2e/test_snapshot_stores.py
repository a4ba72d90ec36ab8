"""The main job with its snapshots in S3 (a moto server) or GCS (tests/fakes/gcs_fake.py):
every worker killed at once, the ring resumes from the newest snapshot in the bucket; and
with the daemon away, rank 0 writes the snapshot to the bucket itself under the workers' grant
of the terraform modules (moto enforcing the IAM policies; the GCS fake the conditioned
objectCreator), and a restarted coordinator resumes from it.

The daemon's side: ``[snapshot] url`` (with ``endpoint_url`` / ``api_endpoint`` for the
fakes) reaches the coordinator inside the daemon, which stores what the workers upload; the
workers hold no cloud credentials. Needs the trainer side of issue 15 (``trainer.state.snapshot``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable

import pytest

from tests.e2e.test_local_run import QUIET, kill_every_worker_and_see_the_resume, needs_trainer
from tests.fakes.local_run import JOB, RunProcess

pytestmark = [pytest.mark.slow, needs_trainer]


def run_and_kill_everyone(tmp_path: Path, snapshot_toml: str, env: dict[str, str]) -> dict:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fleet]\nmarkets = ["spot"]\nmax_size = 3\n[snapshot]\nevery_s = 60\n'
                   + snapshot_toml)
    with RunProcess(tmp_path / "w", *QUIET, "--until-epochs", "400", config=cfg,
                    env=env).start() as run:
        fig = kill_every_worker_and_see_the_resume(run)
        snaps = run.workdir / "snapshots"
        assert not snaps.exists() or not any(snaps.rglob("*")), \
            "snapshots went to the daemon's disk instead of the bucket"
    return fig


@pytest.mark.timeout(900)
def test_snapshots_in_s3_resume_the_job(tmp_path):
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from tests.fakes.aws_world import moto_endpoint

    with moto_endpoint() as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="snaps")
        run_and_kill_everyone(tmp_path, f'url = "s3://snaps/runs"\nendpoint_url = "{endpoint}"\n',
                              {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                               "AWS_DEFAULT_REGION": "us-east-1"})
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="snaps").get("Contents", [])]
        assert keys and all(k.startswith(f"runs/{JOB}/") for k in keys), keys


@pytest.mark.timeout(900)
def test_snapshots_in_gcs_resume_the_job(tmp_path):
    pytest.importorskip("google.cloud.storage")
    from tests.fakes.gcs_fake import GcsFake

    with GcsFake(buckets=["snaps"]) as fake:
        run_and_kill_everyone(tmp_path, f'url = "gs://snaps/runs"\napi_endpoint = '
                              f'"{fake.endpoint}"\n', {"STORAGE_EMULATOR_HOST": fake.endpoint})
        names = fake.names("snaps")
        assert names and all(n.startswith(f"runs/{JOB}/") for n in names), names


# -- the daemon away: rank 0 writes to the bucket itself (issue 30, item 10) ------------------

RING_JOB = "tests/trainer/jobs/regression.py"


def _outage_costs_one_interval(tmp_path: Path, settings: object, env: dict[str, str],
                               stored: Callable[[], list[int]],
                               outage: Callable[[bool], None]) -> None:
    """Two workers train with snapshots every 20 steps in the bucket; the coordinator stops
    (the daemon dies); rank 0 writes the next snapshot to the bucket itself under the
    workers' grant (``outage(True)`` .. ``outage(False)``); every worker is killed; a
    restarted coordinator on the same bucket resumes the replacements from that snapshot."""
    from tests.trainer.ringutil import TOKEN, Ring
    from trainer.control.coordinator import Coordinator

    ring = Ring(tmp_path, job=RING_JOB, env={"REG_EPOCHS": "40", "REG_SLEEP_MS": "4", **env},
                snapshot=settings, initial_world=2, heartbeat_timeout_s=3.0)
    try:
        ring.worker("a")
        ring.worker("b")
        ring.wait_for("a snapshot", lambda: (ring.coord.stats()["snapshot"] or {}).get(
            "step", 0) >= 20, 150)
        host, port = ring.coord.address
        ring.coord.stop()  # the daemon dies, its coordinator and vault with it
        before = max(stored())
        outage(True)
        ring.wait_for("a snapshot written to the bucket by rank 0",
                      lambda: max(stored()) > before, 150)
        for name in ("a", "b"):  # then every holder of the state
            os.kill(ring.procs[name].pid, signal.SIGKILL)
        outage(False)
        during = max(stored())
        assert before < during  # (not always a multiple of 20: one in flight as the
        # coordinator stopped is taken again RETRY_S later, to the bucket)
        ring.coord = Coordinator(host, port, TOKEN, heartbeat_timeout_s=3.0, snapshot=settings)
        ring.coord.start()  # the daemon back, on the same address and bucket
        ring.worker("c")
        ring.worker("d")
        ring.wait_for("the ring resumed", lambda: ring.events("resumed"), 180)
        assert ring.events("resumed")[0]["data"]["step"] == during
        assert ring.coord.stats()["resumed_from"] == during
        assert all(f["identical"] for f in ring.formed())
    finally:
        ring.close()


@pytest.mark.timeout(420)
def test_s3_the_daemon_away_rank0_writes_under_its_grant_and_the_ring_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from tests.fakes.aws_world import moto_endpoint
    from tests.terraform.snapshot_grants import act_as, aws_policy, enforce_iam, iam_user
    from tests.trainer.ringutil import TOKEN
    from trainer.protocol.admission import derive_key
    from trainer.state import snapshot as snap

    bucket, job = "spotring-ring-artifacts", "ring"
    with moto_endpoint() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=bucket)
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
        daemon = iam_user(iam, "daemon", aws_policy("daemon_snapshots", bucket, job))
        worker = iam_user(iam, "worker", aws_policy("worker_snapshots", bucket, job))
        act_as(monkeypatch, daemon)  # this process is the daemon (the coordinator's vault)
        enforce_iam(monkeypatch)
        settings = snap.SnapshotSettings(f"s3://{bucket}/snapshots/{job}", every_s=3600.0,
                                         every_steps=20, direct=True, endpoint_url=endpoint)
        key = derive_key(TOKEN, b"snapshot manifest")
        vault = snap.Vault(snap.open_store(settings), key=key)
        try:
            _outage_costs_one_interval(tmp_path, settings, worker,
                                       lambda: [m.step for m in vault.manifests()] or [0],
                                       lambda away: None)
        finally:
            vault.close()


@pytest.mark.timeout(420)
def test_gcs_the_daemon_away_rank0_creates_under_its_grant_and_the_ring_resumes(
        tmp_path: Path) -> None:
    pytest.importorskip("google.cloud.storage")
    from tests.fakes.gcs_fake import GcsFake
    from tests.terraform.snapshot_grants import gcs_create_prefixes
    from trainer.state import snapshot as snap

    bucket, job = "spotring-ring-artifacts", "ring"
    with GcsFake(buckets=[bucket]) as fake:
        settings = snap.SnapshotSettings(f"gs://{bucket}/snapshots/{job}", every_s=3600.0,
                                         every_steps=20, direct=True,
                                         api_endpoint=fake.endpoint)

        def stored() -> list[int]:  # read in the fake itself: the worker's grant lists nothing
            return [int(n.rsplit("/", 1)[1].split("-")[1]) for n in fake.names(bucket)
                    if n.endswith(".json")] or [0]

        # while the coordinator is away, every request is a worker's: the conditioned grant
        _outage_costs_one_interval(
            tmp_path, settings, {}, stored,
            lambda away: fake.creator_only(gcs_create_prefixes(job) if away else None))
