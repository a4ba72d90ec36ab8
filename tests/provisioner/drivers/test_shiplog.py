"""The workers' shipped logs as the daemon reads them: one contract over every artifacts
store (a folder, S3 on moto, GCS on the fake): chunks in order per unit, instance ids with a
``/`` (GCP's ``<zone>/<name>``), exit reports parsed and classified; the wording of each boot
exit code is the docs table's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from provisioner.drivers.artifacts import DirStore
from provisioner.drivers.boot import BootExit
from provisioner.drivers.shiplog import (BOOT_EXITS, Failure, StoreLogs, chunk_key, exit_key,
                                         explain, parse_report)
from tests.conftest import REPO


def _contract(store: Any, tmp: Path) -> None:
    """What every store must do for the shipped logs (keys as the boot's shipper writes)."""
    def put(key: str, text: str) -> None:
        f = tmp / "obj"
        f.write_text(text)
        store.put(key, f)

    gcp = "us-central1-a/spotring-x-1"
    put(chunk_key(gcp, "boot", 0), "a\nb\n")
    put(chunk_key(gcp, "boot", 1), "c\n")
    put(chunk_key(gcp, "spotring-worker@0.service", 0), "w0\n")
    put(chunk_key("i-1", "boot", 0), "other\n")
    for seq in range(2, 12):  # 8 digits: chunk 10 comes after chunk 9
        put(chunk_key(gcp, "boot", seq), f"n{seq}\n")
    put(exit_key(gcp, "boot"), "22\nspotring-boot: fetching\nspotring-boot: error: x (exit 22)\n")
    logs = StoreLogs(store)
    assert logs.lines(gcp, "boot")[:3] == [("boot", "a"), ("boot", "b"), ("boot", "c")]
    assert [ln for _, ln in logs.lines(gcp, "boot")][-2:] == ["n10", "n11"]
    assert logs.lines(gcp)[-1] == ("spotring-worker@0.service", "w0")
    assert logs.tail(gcp, n=3) == ["n9", "n10", "n11"]
    assert logs.instances() == sorted(["i-1", gcp])
    [report] = logs.reports(gcp)
    assert (report.unit, report.code, report.failure) == ("boot", 22, Failure.BOOT)
    assert report.lines[-1] == "spotring-boot: error: x (exit 22)"
    assert logs.reports("i-1") == [] and logs.lines("i-none") == []
    with pytest.raises(KeyError):
        store.read("logs/none")


def test_a_folder_store(tmp_path: Path) -> None:
    _contract(DirStore(tmp_path / "art"), tmp_path)


def test_s3_on_moto(tmp_path: Path) -> None:
    moto = pytest.importorskip("moto")
    import boto3

    from provisioner.drivers.artifacts import S3Store

    with moto.mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="runs")
        _contract(S3Store("runs", "artifacts", "us-east-1"), tmp_path)


def test_gcs_on_the_fake(tmp_path: Path) -> None:
    pytest.importorskip("google.cloud.storage")
    from provisioner.drivers.artifacts import GcsStore
    from tests.fakes.gcs_fake import GcsFake

    with GcsFake(buckets=["runs"]) as gcs:
        _contract(GcsStore("runs", "artifacts", gcs.endpoint), tmp_path)


def test_reports_are_classified_and_explained() -> None:
    job = parse_report("i-1", "spotring-worker@1.service", "2\nModuleNotFoundError: x\n")
    assert job.failure is Failure.JOB and "the job failed" in explain(job)
    assert parse_report("i-1", "boot", "20\nnot importable\n").failure is Failure.JOB
    assert parse_report("i-1", "spotring-worker@0.service", "5\n").failure is Failure.BOOT
    odd = parse_report("i-1", "boot", "garbage\nmore\n")
    assert odd.code == -1 and odd.lines == ("garbage", "more")
    assert "unexpected failure" in explain(parse_report("i-1", "boot", "1\n"))


def test_every_boot_exit_is_worded_as_the_docs_table_says() -> None:
    text = (REPO / "docs" / "deploy.md").read_text()
    table = text.split("### Boot exit codes", 1)[1].split("###", 1)[0]
    rows = {int(m[0]): (m[1], m[2]) for m in re.findall(r"^\| (\d+) \| (.+?) \| (.+?) \|$",
                                                         table, flags=re.M)}
    assert BOOT_EXITS == {c: rows[c] for c in BOOT_EXITS}
    assert set(BOOT_EXITS) == {int(c) for c in BootExit}
