"""Cloud runs keep their snapshots while the daemon is away (issue 30, item 10), under the
grants the terraform modules declare, enforced by the fakes: moto checks every S3 request
against the IAM policies of terraform/aws/snapshots.tf (actions and resources; moto does not
evaluate the ``s3:prefix`` condition of the daemon's listing, terraform test checks it); the GCS fake holds the worker to the
conditioned objectCreator of terraform/gcp/artifacts.tf.

The coordinator is away: rank 0's snapshot goes to the bucket itself (signed with the
token-derived key) under the job's prefix; it cannot write elsewhere, overwrite, delete, read
or list; a restarted coordinator's vault (the daemon's grant) lists, verifies and loads it,
and forgets the oldest. No ring here (tests/e2e/test_snapshot_stores.py has the real one)."""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable

import pytest
import torch

from tests.terraform.snapshot_grants import (act_as, aws_policy, enforce_iam,
                                             gcs_create_prefixes, iam_user)
from trainer.protocol.admission import derive_key
from trainer.state import snapshot as snap
from trainer.state.direct import DirectWriter, direct_entry

KEY = derive_key(b"t" * 32, b"snapshot manifest")
BUCKET, JOB = "spotring-job-artifacts", "job-a"


class _Away:
    """The coordinator's connection while the daemon restarts."""

    def __init__(self) -> None:
        raise ConnectionRefusedError("the coordinator does not answer")


class _Through:
    """A restarted coordinator's blob endpoint, as a worker's connection sees it."""

    def __init__(self, vault: snap.Vault) -> None:
        self.vault = vault

    def blob_get(self, name: str, off: int, n: int) -> bytes:
        return self.vault.get(name, off, n)


def _commit(vault: snap.Vault, step: int) -> str:
    """The daemon's coordinator stores a snapshot (any bytes: only listed, never loaded)."""
    data, name = b"z" * 64, snap.name_for(step)
    vault.put(name, 0, data)
    m = snap.Manifest(name, step, 0, step * 4, len(data), hashlib.sha256(data).hexdigest(),
                      "job", time.time())
    vault.commit(name, m.to_json().encode())
    return name


def _direct(url: str, **endpoints: Any) -> snap.Snapshotter:
    """Rank 0's snapshotter with the coordinator away, writing where the coordinator of a
    cloud run (listening on a private address) published its ``direct = true`` store."""
    entry = direct_entry(snap.SnapshotSettings(url, direct=True, **endpoints), "10.0.1.10")
    return snap.Snapshotter(_Away, every_steps=10, every_s=3600.0,
                            direct=DirectWriter.from_config(entry, KEY))


def _take(s: snap.Snapshotter, step: int) -> None:
    s.take(step, lambda: {"step": step, "w": torch.full((3,), float(step))}, "job", 0, step)
    s.wait()


def _the_worker_writes_its_prefix_only(url: str, other: str, denied: type[Exception],
                                       store: Callable[[str], snap.BlobStore],
                                       old: str, can_overwrite: bool,
                                       **endpoints: Any) -> None:
    s = _direct(url, **endpoints)
    _take(s, 20)
    assert s.failed is None and s.direct == 1
    elsewhere = _direct(other, **endpoints)  # another job's prefix (or any other place)
    _take(elsewhere, 20)
    assert elsewhere.direct == 0 and elsewhere.failed and "the store itself" in elsewhere.failed
    mine = store(url)
    attempts = [lambda: mine.delete(old),  # no delete,
                lambda: mine.read(old, 0, 8),  # no read, no list
                mine.names]
    if not can_overwrite:  # GCS's objectCreator; S3's PutObject can (the bucket versions it,
        # and a replaced snapshot fails its signed SHA-256: the vault tries the older one)
        attempts.append(lambda: mine.put_bytes(old, b"forged"))
    for attempt in attempts:
        with pytest.raises(denied):
            attempt()


def _the_restarted_vault_resumes(vault: snap.Vault) -> None:
    ms = vault.manifests()
    assert [m.step for m in ms] == [10, 20] and all(m.verify(KEY) for m in ms)
    tree = snap.fetch(_Through(vault), ms[-1])
    assert tree["step"] == 20 and torch.equal(tree["w"], torch.full((3,), 20.0))
    _commit(vault, 30)  # and it keeps the bucket: the oldest forgotten (its delete grant)
    assert [m.step for m in vault.manifests()] == [20, 30]


def test_aws_rank0_puts_under_the_jobs_prefix_only_and_the_daemon_resumes_from_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    from botocore.exceptions import ClientError

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{BUCKET}/snapshots/{JOB}"
    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam")
        daemon = iam_user(iam, "daemon", aws_policy("daemon_snapshots", BUCKET, JOB))
        worker = iam_user(iam, "worker", aws_policy("worker_snapshots", BUCKET, JOB))
        enforce_iam(monkeypatch)

        def as_(who: dict[str, str]) -> None:  # as another host with these keys would
            act_as(monkeypatch, who)

        as_(daemon)
        vault = snap.Vault(snap.open_store(snap.SnapshotSettings(url)), keep=2, key=KEY)
        try:
            old = _commit(vault, 10)
            as_(worker)  # the daemon dies; rank 0 takes the next snapshot
            _the_worker_writes_its_prefix_only(
                url, f"s3://{BUCKET}/snapshots/job-b", ClientError,
                lambda u: snap.open_store(snap.SnapshotSettings(u)), old, True)
            as_(daemon)  # the daemon back: a new vault on the same bucket
            _the_restarted_vault_resumes(
                snap.Vault(snap.open_store(snap.SnapshotSettings(url)), keep=2, key=KEY))
        finally:
            vault.close()


def test_gcs_rank0_creates_under_the_jobs_prefix_only_and_the_daemon_resumes_from_it() -> None:
    pytest.importorskip("google.cloud.storage")
    from google.api_core.exceptions import Forbidden

    from tests.fakes.gcs_fake import GcsFake

    url = f"gs://{BUCKET}/snapshots/{JOB}"
    with GcsFake(buckets=[BUCKET]) as fake:
        ep = {"api_endpoint": fake.endpoint}
        vault = snap.Vault(snap.open_store(snap.SnapshotSettings(url, **ep)), keep=2, key=KEY)
        try:
            old = _commit(vault, 10)
            fake.creator_only(gcs_create_prefixes(JOB))  # the worker's conditioned grant
            _the_worker_writes_its_prefix_only(
                url, f"gs://{BUCKET}/snapshots/job-b", Forbidden,
                lambda u: snap.open_store(snap.SnapshotSettings(u, **ep)), old, False, **ep)
            fake.creator_only(None)  # the daemon back
            _the_restarted_vault_resumes(
                snap.Vault(snap.open_store(snap.SnapshotSettings(url, **ep)), keep=2, key=KEY))
        finally:
            vault.close()
        assert all(n.startswith(f"snapshots/{JOB}/") for n in fake.names(BUCKET))


def test_the_daemon_of_a_module_publishes_its_bucket_to_the_workers(tmp_path: Any) -> None:
    """The config the modules write (terraform/render_config.py renders the same) makes the
    coordinator publish the job's snapshot prefix as the workers' direct store; a cloud
    config that does not say ``direct`` publishes none (its workers may hold no grant)."""
    import tomllib

    from provisioner.config import parse_settings
    from provisioner.daemon.wiring import _trainer_snapshot, snapshot_url
    from tests.terraform.test_examples_and_render import OUTPUTS, render_config

    config = render_config.render(OUTPUTS)
    settings = parse_settings(tomllib.loads(render_config.to_toml(config)))
    ring = _trainer_snapshot(settings.snapshot, snapshot_url(settings, tmp_path))
    host = settings.daemon.coordinator_host  # a private address: workers on other hosts
    assert direct_entry(ring, host) == {"url": "s3://spotring-e2e-artifacts-x/snapshots/e2e",
                                        "endpoint_url": None, "api_endpoint": None}
    del config["snapshot"]["direct"]
    plain = parse_settings(config)
    assert direct_entry(_trainer_snapshot(plain.snapshot, snapshot_url(plain, tmp_path)),
                        host) is None
