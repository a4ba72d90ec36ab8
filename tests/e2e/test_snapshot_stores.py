"""The main job with its snapshots in S3 (a moto server) or GCS (tests/fakes/gcs_fake.py):
every worker killed at once, the ring resumes from the newest snapshot in the bucket.

The daemon's side: ``[snapshot] url`` (with ``endpoint_url`` / ``api_endpoint`` for the
fakes) reaches the coordinator inside the daemon, which stores what the workers upload; the
workers hold no cloud credentials. Needs the trainer side of issue 15 (``trainer.snapshot``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.drivers.local import running
from tests.conftest import REPO
from tests.e2e.test_local_run import JOB, cleanup, log_of, needs_trainer, ring, stop, training
from tests.fakes.wait import wait_for

pytestmark = [pytest.mark.slow, needs_trainer]


def run_and_kill_everyone(tmp_path: Path, snapshot_toml: str, env: dict[str, str]) -> dict:
    wd = tmp_path / "w"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fleet]\nmarkets = ["spot"]\nmax_size = 3\n[snapshot]\nevery_s = 60\n'
                   + snapshot_toml)
    out = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "provisioner.cli", "run", "--workdir",
                             str(wd), "--config", str(cfg), "--no-dashboard",
                             "--outages-per-hour", "0", "--speed", "60", "--until-epochs",
                             "30"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, **env})
    try:
        assert wait_for(lambda: training(wd, 3, 40) and ring(wd).get("snapshot"), 180,
                        step_s=0.2, abort=lambda: log_of(wd) if proc.poll() is not None else None)
        for rec in running(wd / "cloud", JOB):
            os.killpg(rec["pid"], signal.SIGKILL)
        assert proc.wait(timeout=240) == 0, log_of(wd)
    finally:
        stop(proc)
        cleanup(wd)
    assert not (wd / "snapshots").exists() or not any((wd / "snapshots").rglob("*")), \
        "snapshots went to the daemon's disk instead of the bucket"
    fig = json.loads((wd / "report" / "report.json").read_text())
    assert fig["outcome"] == "done" and fig["resumed_from"] is not None, fig
    return fig


@pytest.mark.timeout(360)
def test_snapshots_in_s3_resume_the_job(tmp_path):
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        s3.create_bucket(Bucket="snaps")
        run_and_kill_everyone(tmp_path, f'url = "s3://snaps/runs"\nendpoint_url = "{endpoint}"\n',
                              creds)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="snaps").get("Contents", [])]
        assert keys and all(k.startswith(f"runs/{JOB}/") for k in keys), keys
    finally:
        server.stop()


@pytest.mark.timeout(360)
def test_snapshots_in_gcs_resume_the_job(tmp_path):
    pytest.importorskip("google.cloud.storage")
    from tests.fakes.gcs_fake import GcsFake

    with GcsFake(buckets=["snaps"]) as fake:
        run_and_kill_everyone(tmp_path, f'url = "gs://snaps/runs"\napi_endpoint = '
                              f'"{fake.endpoint}"\n', {"STORAGE_EMULATOR_HOST": fake.endpoint})
        names = fake.names("snaps")
        assert names and all(n.startswith(f"runs/{JOB}/") for n in names), names
