"""The daemon reads the cloud workers' shipped exit reports (provisioner/drivers/shiplog.py)
from the run's real artifacts store (a folder, moto S3): a failed boot is terminated at once
and reported with its exit code, its line of the docs table and its last lines, its offering
skipped as a capacity refusal is; a job error stops every launch and ends the run with its
own outcome; the join deadline quotes the boot lines that were shipped.

The objects are written as the boot scripts' shipper writes them (the boot harness,
tests/terraform/test_worker_boot.py, checks that format against the real scripts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.config import parse_settings
from provisioner.daemon.outcome import verdict
from provisioner.drivers.artifacts import DirStore
from provisioner.drivers.shiplog import StoreLogs, chunk_key, exit_key
from tests.fakes.ring import FakeRing
from tests.provisioner.daemon.test_daemon import world  # noqa: F401 - the fixture

REFUSAL = "spotring-boot: error: launch value SPOTRING_ZONE='Zone A' is not usable (exit 22)"


def _ship(store: DirStore, iid: str, unit: str, lines: list[str], code: int | None) -> None:
    """What a boot's shipper leaves: one chunk of lines, and the exit report when failed."""
    tmp = store.root.parent / "chunk.tmp"
    tmp.write_text("".join(f"{ln}\n" for ln in lines))
    store.put(chunk_key(iid, unit, 0), tmp)
    if code is not None:
        tmp.write_text(f"{code}\n" + "".join(f"{ln}\n" for ln in lines[-20:]))
        store.put(exit_key(iid, unit), tmp)


def test_a_failed_boot_is_terminated_at_once_and_reported(world, tmp_path: Path) -> None:  # noqa: F811
    store = DirStore(tmp_path / "artifacts")
    s = parse_settings({"fleet": {"max_size": 3, "markets": ["spot"], "max_zone_share": 0.5},
                        "daemon": {"join_deadline_s": 600}})
    d, clock, drv, st = world(settings=s, coordinator=FakeRing(), logs=StoreLogs(store))
    d.poll_prices(); d.plan_and_reconcile()
    first = {r.id: r.offering for r in st.live_instances()}
    bad, slow, _ = sorted(first)
    _ship(store, bad, "boot", ["spotring-boot: fetching the wheel", REFUSAL], 22)
    _ship(store, slow, "boot", ["spotring-boot: pip install (slow mirror)"], None)
    clock.advance(30)  # one round later: long before the join deadline
    d.plan_and_reconcile()
    rows = {r.id: r for r in st.instances()}
    assert rows[bad].ended_at is not None and "boot exit 22" in rows[bad].end_reason
    (ev,) = st.events(kinds=["boot-failed"])
    assert ev.instance_id == bad
    assert "`SPOTRING_ZONE` is not a group name" in ev.detail  # its docs line
    assert ev.detail.endswith(f"boot: {REFUSAL}")  # its last lines
    assert first[bad] in d.actuator.unavailable.members() and first[bad] in d.actuator.failed
    assert rows[slow].ended_at is None and d.actuator.job_error is None
    assert [r.offering for r in st.live_instances() if r.id not in first] != [first[bad]]
    # the join deadline quotes what the slow one shipped
    clock.advance(600)
    d.plan_and_reconcile()
    (late,) = [e for e in st.events(kinds=["join-deadline"]) if e.instance_id == slow]
    assert late.detail.endswith("last lines of its boot log:\nspotring-boot: pip install "
                                "(slow mirror)")
    assert (store.root / chunk_key(bad, "boot", 0)).is_file()  # nothing deleted
    # provision status shows both, with the failed boot's last error line
    from provisioner.daemon.view.status import summary
    from provisioner.daemon.view.tables import status_lines

    shown = status_lines(summary(st, events=50), 400)
    assert all("\n" not in ln for ln in shown)  # one line each; the boot's lines below them
    text = "\n".join(shown)
    assert f"{bad} boot-failed: boot exit 22: `SPOTRING_ZONE` is not a group name" in text
    assert f"             boot: {REFUSAL}" in text and f"{slow} join-deadline" in text


def test_a_job_error_stops_launching_and_ends_the_run(world, tmp_path: Path) -> None:  # noqa: F811
    moto = pytest.importorskip("moto")
    import boto3

    from provisioner.drivers.artifacts import S3Store

    with moto.mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="art")
        store = S3Store("art", "artifacts", "us-east-1")
        d, clock, drv, st = world(coordinator=FakeRing(), logs=StoreLogs(store))
        d.poll_prices(); d.plan_and_reconcile()
        first = sorted(r.id for r in st.live_instances())
        report = ("2\nTraceback (most recent call last):\nModuleNotFoundError: No module named "
                  "'torchvision'\nerror: job spotring_job: cannot import it\n")
        tmp = tmp_path / "r"
        tmp.write_text(report)
        store.put(exit_key(first[0], "spotring-worker@0.service"), tmp)
        clock.advance(30)
        d.plan_and_reconcile()
        (ev,) = st.events(kinds=["job-error"])
        assert "error: job spotring_job: cannot import it" in ev.detail
        assert "no more launches" in ev.detail
        assert {r.id for r in st.live_instances()} == set(first[1:])  # none launched instead
        clock.advance(3600)
        d.plan_and_reconcile()
        assert {r.id for r in st.live_instances()} <= set(first[1:])
        v = verdict({}, interrupted=False, crash_loop=None, until_epochs=None, elapsed_s=1.0,
                    duration_s=None, job_error=ev.detail)
        assert (v.outcome, v.exit_code, v.job_over) == ("job-error", 2, True)
        assert v.failure == ev.detail


class _Unreachable:
    """A store that is down: every read raises, as boto3 does without a network."""

    def reports(self, instance_id: str) -> list:
        raise OSError("connection refused")

    def tail(self, instance_id: str, unit: str = "boot", n: int = 20) -> list:
        raise OSError("connection refused")


def test_an_unreachable_store_does_not_stop_the_round(world) -> None:  # noqa: F811
    d, clock, drv, st = world(coordinator=FakeRing(), logs=_Unreachable())
    d.poll_prices(); d.plan_and_reconcile()
    first = {r.id for r in st.live_instances()}
    clock.advance(30)
    d.plan_and_reconcile()  # the reports cannot be read: the round still plans
    assert len(first) == 3 and {r.id for r in st.live_instances()} == first
    assert st.events(kinds=["error"]) == [] and d.errors == []
