"""The daemon ships the exact wheel it runs with the run: located or built from the checkout,
stored content-addressed (a folder, S3 on moto, GCS on the fake), pinned by its SHA-256 in
the launch values; one line naming the setting when it cannot."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from provisioner.config import parse_settings
from provisioner.drivers import artifacts
from provisioner.errors import ConfigError
from tests.conftest import REPO


def settings(**cloud: str):
    return parse_settings({"cloud": {"driver": "aws", **cloud}})


def fake_wheel(tmp: Path, body: bytes = b"PK-not-really") -> Path:
    path = tmp / "spotring-0.1.0-py3-none-any.whl"
    path.write_bytes(body)
    return path


def test_nothing_to_ship_without_artifacts() -> None:
    assert artifacts.ship(settings()) == {}


def test_a_folder_store_keeps_one_copy_per_content(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    store = tmp_path / "store"
    env = artifacts.ship(settings(artifacts=str(store), wheel=str(wheel)))
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert env == {"SPOTRING_WHEEL": (store / sha / wheel.name).as_uri(),
                   "SPOTRING_WHEEL_SHA256": sha}
    stored = store / sha / wheel.name
    first = stored.stat().st_mtime_ns
    assert artifacts.ship(settings(artifacts=str(store), wheel=str(wheel))) == env
    assert stored.stat().st_mtime_ns == first  # found, not written again
    wheel.write_bytes(b"PK-another-build")
    other = artifacts.ship(settings(artifacts=str(store), wheel=str(wheel)))
    assert other["SPOTRING_WHEEL_SHA256"] != sha and stored.read_bytes() == b"PK-not-really"


def test_s3_store_on_moto(tmp_path: Path) -> None:
    moto = pytest.importorskip("moto")
    import boto3

    wheel = fake_wheel(tmp_path)
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="runs")
        s = settings(artifacts="s3://runs/jobs/a/", wheel=str(wheel))
        env = artifacts.ship(s)
        sha = env["SPOTRING_WHEEL_SHA256"]
        assert env["SPOTRING_WHEEL"] == f"s3://runs/jobs/a/{sha}/{wheel.name}"
        key = f"jobs/a/{sha}/{wheel.name}"
        assert s3.get_object(Bucket="runs", Key=key)["Body"].read() == wheel.read_bytes()
        assert artifacts.ship(s) == env
        missing = settings(artifacts="s3://no-such-bucket/x", wheel=str(wheel))
        with pytest.raises(ConfigError, match=r"\[cloud\] artifacts = 's3://no-such-bucket/x'"):
            artifacts.ship(missing)


def test_the_code_travels_beside_the_wheel_content_addressed(tmp_path: Path) -> None:
    from provisioner.drivers.code import pack

    moto = pytest.importorskip("moto")
    import boto3

    wheel = fake_wheel(tmp_path)
    (tmp_path / "proj" / "sub").mkdir(parents=True)
    job = tmp_path / "proj" / "sub" / "train.py"
    job.write_text("def make_job(seed):\n    return None\n")
    packed = pack(tmp_path / "proj", job, tmp_path)
    with pytest.raises(ConfigError, match=r"^\[cloud\] artifacts: unset, and the job "
                                          r"sub/train.py travels with its code"):
        artifacts.ship(settings(wheel=str(wheel)), packed)
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="runs")
        s = settings(artifacts="s3://runs/jobs/a", wheel=str(wheel))
        env = artifacts.ship(s, packed)
        assert env["SPOTRING_CODE"] == f"s3://runs/jobs/a/{packed.sha256}/code.tar.gz"
        assert env["SPOTRING_CODE_SHA256"] == packed.sha256 and env["SPOTRING_JOB"] == \
            "sub/train.py"
        got = s3.get_object(Bucket="runs", Key=f"jobs/a/{packed.sha256}/code.tar.gz")
        assert got["Body"].read() == packed.path.read_bytes()
        assert got["ContentType"] == "application/gzip"
        assert artifacts.ship(s, packed) == env  # found, not stored again


def test_gcs_store_on_the_fake(tmp_path: Path) -> None:
    pytest.importorskip("google.cloud.storage")
    from tests.fakes.gcs_fake import GcsFake

    wheel = fake_wheel(tmp_path)
    with GcsFake(buckets=["runs"]) as gcs:
        s = parse_settings({"cloud": {"driver": "gcp", "artifacts": "gs://runs/a",
                                      "wheel": str(wheel)},
                            "snapshot": {"api_endpoint": gcs.endpoint}})
        env = artifacts.ship(s)
        sha = env["SPOTRING_WHEEL_SHA256"]
        assert env["SPOTRING_WHEEL"] == f"gs://runs/a/{sha}/{wheel.name}"
        assert gcs.data("runs", f"a/{sha}/{wheel.name}") == wheel.read_bytes()


def test_bad_wheel_and_artifacts_settings_are_one_line_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^\[cloud\] wheel = '/nope.whl': not a .whl file"):
        artifacts.ship(settings(artifacts=str(tmp_path), wheel="/nope.whl"))
    with pytest.raises(ConfigError, match=r"cloud\.artifacts"):
        settings(artifacts="ftp://x/y")


def test_a_daemon_run_from_a_checkout_builds_its_own_wheel_outside_it(tmp_path: Path) -> None:
    before = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO,
                            capture_output=True, text=True).stdout
    assert artifacts.source_tree() == REPO
    wheel = artifacts.locate_wheel(None, tmp_path)
    names = zipfile.ZipFile(wheel.path).namelist()
    assert "trainer/__main__.py" in names and "provisioner/drivers/artifacts.py" in names
    assert wheel.sha256 == hashlib.sha256(wheel.path.read_bytes()).hexdigest()
    after = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO,
                           capture_output=True, text=True).stdout
    assert after == before  # no build/ or egg-info left in the checkout
