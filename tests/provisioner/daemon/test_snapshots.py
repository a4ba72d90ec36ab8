"""Snapshots, the daemon's side: where ``[snapshot]`` sends them (the coordinator inside the
daemon stores what the workers upload), and the two durable stores the tests stand in for,
talked to by the real clients: S3 through moto, GCS through tests/fakes/gcs_fake.py."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from provisioner.config import load_settings, parse_settings
from provisioner.daemon.wiring import snapshot_url
from provisioner.errors import ConfigError


def test_snapshot_url_defaults_to_the_daemon_hosts_disk_and_appends_the_job(tmp_path):
    s = parse_settings({"job": {"id": "j1"}})
    assert snapshot_url(s, tmp_path / "snapshots") == (tmp_path / "snapshots").as_uri()
    s = parse_settings({"job": {"id": "j1"}, "snapshot": {"url": "s3://bkt/runs/"}})
    assert snapshot_url(s, tmp_path) == "s3://bkt/runs/j1"
    s = parse_settings({"job": {"id": "j1"}, "snapshot": {"url": "gs://bkt"}})
    assert snapshot_url(s, tmp_path) == "gs://bkt/j1"
    s = parse_settings({"snapshot": {"every_s": 0, "every_steps": 0}})
    assert snapshot_url(s, tmp_path) is None  # both off: no snapshots


def test_a_relative_snapshot_folder_is_read_from_the_config_files_folder(tmp_path,
                                                                         monkeypatch):
    cfg = tmp_path / "conf" / "run.toml"
    cfg.parent.mkdir()
    cfg.write_text('[job]\nid = "j2"\n[snapshot]\nurl = "snaps"\n[daemon]\n'
                   'state_path = "state/s.sqlite"\ntoken_path = "tok"\n')
    monkeypatch.chdir(tmp_path)
    a = load_settings(cfg)
    monkeypatch.chdir(cfg.parent)
    b = load_settings("run.toml")
    assert a == b
    assert a.daemon.state_path == str(cfg.parent / "state" / "s.sqlite")
    assert a.daemon.token_path == str(cfg.parent / "tok")
    assert snapshot_url(a, tmp_path) == (cfg.parent / "snaps").as_uri() + "/j2"
    # the default state file too: no matter where the daemon is started from
    cfg.write_text("")
    assert load_settings(cfg).daemon.state_path == str(cfg.parent / "spotring-state.sqlite")


@pytest.mark.parametrize("url, needle", [("ftp://b/p", "scheme 'ftp'"), ("s3://", "no bucket"),
                                         ("file://rel/dir", "absolute path")])
def test_bad_snapshot_urls_name_the_field(url, needle):
    with pytest.raises(ConfigError, match="snapshot.url") as err:
        parse_settings({"snapshot": {"url": url}})
    assert needle in str(err.value)
    with pytest.raises(ConfigError, match="snapshot.every_s"):
        parse_settings({"snapshot": {"every_s": float("inf")}})


def test_gcs_fake_serves_the_real_client(tmp_path):
    pytest.importorskip("google.cloud.storage")
    from google.api_core import exceptions as gexc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.fakes.gcs_fake import GcsFake

    with GcsFake(buckets=["snaps"]) as fake:
        client = storage.Client(project="p", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": fake.endpoint})
        bucket = client.bucket("snaps")
        bucket.blob("job/000010/meta.json").upload_from_string(b'{"step": 10}')
        big = os.urandom(9 * 1024 * 1024)  # over the client's multipart limit: resumable
        bucket.blob("job/000010/state.bin", chunk_size=4 * 1024 * 1024).upload_from_string(big)
        assert [b.name for b in client.list_blobs("snaps", prefix="job/")] == [
            "job/000010/meta.json", "job/000010/state.bin"]
        assert bucket.blob("job/000010/state.bin").download_as_bytes() == big
        out = io.BytesIO()  # ranged, chunked download with the checksum checked
        bucket.blob("job/000010/state.bin", chunk_size=2 * 1024 * 1024).download_to_file(out)
        assert out.getvalue() == big
        with pytest.raises(gexc.PreconditionFailed):
            bucket.blob("job/000010/meta.json").upload_from_string(b"x", if_generation_match=0)
        assert bucket.blob("job/000010/meta.json").exists()
        assert not bucket.blob("job/none").exists()
        bucket.copy_blob(bucket.blob("job/000010/meta.json"), bucket, "job/latest.json")
        bucket.blob("job/000010/meta.json").delete()
        assert fake.names("snaps") == ["job/000010/state.bin", "job/latest.json"]
        fake.fail_next(503, method="GET", path_contains="latest")  # retried by the client
        assert bucket.blob("job/latest.json").download_as_bytes() == b'{"step": 10}'
        with pytest.raises(gexc.NotFound):
            client.bucket("nobucket").blob("x").upload_from_string(b"1")


def test_a_snapshot_store_that_cannot_be_listed_is_one_line_naming_the_url(tmp_path):
    """Before anything starts, the daemon lists the store the coordinator will keep the
    snapshots in: a missing bucket (S3 on moto, GCS on the fake) or an unwritable folder is
    one line naming ``snapshot.url``; a good one passes."""
    pytest.importorskip("moto.server")
    pytest.importorskip("google.cloud.storage")
    from provisioner.daemon.wiring import _check_store, _trainer_snapshot
    from provisioner.errors import UserError
    from tests.fakes.aws_world import moto_endpoint
    from tests.fakes.gcs_fake import GcsFake

    snap = parse_settings({}).snapshot
    with moto_endpoint() as endpoint:
        s3 = parse_settings({"snapshot": {"url": "s3://snaps/p", "endpoint_url": endpoint}})
        with pytest.raises(UserError, match=r"snapshot.url s3://snaps/p/spotring-demo: cannot "
                                            r"list it \(NoSuchBucket"):
            _check_store(_trainer_snapshot(s3.snapshot, snapshot_url(s3, tmp_path)))
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="snaps")
        _check_store(_trainer_snapshot(s3.snapshot, snapshot_url(s3, tmp_path)))
    with GcsFake(buckets=["snaps"]) as fake:
        gs = parse_settings({"snapshot": {"url": "gs://other", "api_endpoint": fake.endpoint}})
        with pytest.raises(UserError, match="snapshot.url gs://other/spotring-demo: cannot list"):
            _check_store(_trainer_snapshot(gs.snapshot, snapshot_url(gs, tmp_path)))
    with pytest.raises(UserError, match="snapshot.url file:///sys/spotring"):
        _check_store(_trainer_snapshot(snap, "file:///sys/spotring"))


def test_a_moto_endpoint_does_not_hand_its_buckets_to_the_next_one():
    """moto keeps a server's state in this process's backends: a bucket one test made on
    its server was there on the next test's (in the same pytest worker), and the check above
    did not raise for "snaps". Each endpoint starts empty."""
    pytest.importorskip("moto.server")
    import boto3

    from tests.fakes.aws_world import moto_endpoint

    with moto_endpoint() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="left-behind")
    with moto_endpoint() as endpoint:
        names = [b["Name"] for b in boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1").list_buckets()["Buckets"]]
    assert "left-behind" not in names


def test_gcs_fake_as_the_storage_emulator(monkeypatch):
    """``STORAGE_EMULATOR_HOST`` (the client's own switch: anonymous credentials, this
    endpoint) reaches the fake too: a store built with the client's defaults can be tested."""
    pytest.importorskip("google.cloud.storage")
    from google.cloud import storage

    from tests.fakes.gcs_fake import GcsFake

    with GcsFake(buckets=["b"]) as fake:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.endpoint)
        client = storage.Client()
        client.bucket("b").blob("x/y").upload_from_string(b"hello")
        assert [b.name for b in client.list_blobs("b")] == ["x/y"]
        assert fake.data("b", "x/y") == b"hello"
