"""The main job with its snapshots in S3 (a moto server) or GCS (tests/fakes/gcs_fake.py):
every worker killed at once, the ring resumes from the newest snapshot in the bucket.

The daemon's side: ``[snapshot] url`` (with ``endpoint_url`` / ``api_endpoint`` for the
fakes) reaches the coordinator inside the daemon, which stores what the workers upload; the
workers hold no cloud credentials. Needs the trainer side of issue 15 (``trainer.state.snapshot``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_local_run import QUIET, needs_trainer
from tests.fakes.local_run import JOB, RunProcess
from tests.fakes.wait import wait_for

pytestmark = [pytest.mark.slow, needs_trainer]


def run_and_kill_everyone(tmp_path: Path, snapshot_toml: str, env: dict[str, str]) -> dict:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fleet]\nmarkets = ["spot"]\nmax_size = 3\n[snapshot]\nevery_s = 60\n'
                   + snapshot_toml)
    with RunProcess(tmp_path / "w", *QUIET, "--until-epochs", "30", config=cfg,
                    env=env).start() as run:
        assert wait_for(lambda: run.training(3, 40) and run.ring().get("snapshot"), 180,
                        step_s=0.2, abort=run.exited)
        run.kill_workers()
        assert run.wait(timeout=240) == 0, run.log()
        snaps = run.workdir / "snapshots"
        assert not snaps.exists() or not any(snaps.rglob("*")), \
            "snapshots went to the daemon's disk instead of the bucket"
        fig = run.report()
    assert fig["outcome"] == "done" and fig["resumed_from"] is not None, fig
    return fig


@pytest.mark.timeout(360)
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


@pytest.mark.timeout(360)
def test_snapshots_in_gcs_resume_the_job(tmp_path):
    pytest.importorskip("google.cloud.storage")
    from tests.fakes.gcs_fake import GcsFake

    with GcsFake(buckets=["snaps"]) as fake:
        run_and_kill_everyone(tmp_path, f'url = "gs://snaps/runs"\napi_endpoint = '
                              f'"{fake.endpoint}"\n', {"STORAGE_EMULATOR_HOST": fake.endpoint})
        names = fake.names("snaps")
        assert names and all(n.startswith(f"runs/{JOB}/") for n in names), names
