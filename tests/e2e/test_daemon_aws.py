"""End to end over HTTP: the daemon on the AWS driver against a moto server
(``ThreadedMotoServer``). It launches a fleet; a spot interruption warning goes through
EventBridge -> SQS; the worker is drained, a replacement is requested within 5 s (notice
period shortened to 0.3 s), and the revoked zone is avoided."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("moto.server")

from tests.fakes.aws_world import AwsWorld, build_daemon  # noqa: E402
from tests.fakes.ring import FakeRing as FakeCoordinator  # noqa: E402
from tests.fakes.wait import wait_for  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world():
    w = AwsWorld()
    yield w
    w.close()




def test_interruption_drains_and_replaces_in_another_zone(world, tmp_path):
    coord = FakeCoordinator()
    settings = world.settings("e2e-notice", notice_poll_s=0.3, plan_s=600.0)
    d = build_daemon(settings, tmp_path / "state.sqlite", coordinator=coord)
    d.start()
    try:
        live = {r.id: r for r in d.state.live_instances()}
        cloud = {i["InstanceId"]: i for i in world.instances("e2e-notice")}
        assert len(live) == 3 and set(live) == set(cloud)
        for iid, row in live.items():  # the state's offering is where EC2 put it
            assert row.offering.zone == cloud[iid]["Placement"]["AvailabilityZone"]
            assert row.offering.instance_type == cloud[iid]["InstanceType"]
        coord.speeds = {i: 50.0 for i in live}
        victim = sorted(live)[0]
        revoked_zone = live[victim].offering.zone

        t0 = time.monotonic()
        world.interrupt(victim)
        replaced = wait_for(lambda: len(set(r.id for r in d.state.live_instances())
                                        - set(live)) >= 1, timeout_s=5.0)
        elapsed = time.monotonic() - t0
        assert replaced, "no replacement launched within 5 s of the interruption event"
        assert (victim, "revocation notice") in coord.drains
        rows = {r.id: r for r in d.state.live_instances()}
        assert rows[victim].draining_since is not None  # drained, not killed
        new = [r for r in rows.values() if r.id not in live]
        assert len(new) == 1 and new[0].offering.zone != revoked_zone
        assert d.notice_to_launch_s and d.notice_to_launch_s[0] <= elapsed
        assert {i["InstanceId"] for i in world.instances("e2e-notice")} == set(rows)
        kinds = [e.kind for e in d.state.events()]
        assert "notice" in kinds and kinds.index("notice") < len(kinds) - 1 - kinds[::-1].index(
            "launch")
        # The 2-minute window ends: EC2 takes the instance; the daemon closes it, no 2nd launch.
        world.ec2.terminate_instances(InstanceIds=[victim])
        world.state_change(victim, "shutting-down")
        gone = wait_for(lambda: victim not in {r.id for r in d.state.live_instances()}, 10.0)
        assert gone
        assert len(d.state.live_instances()) == 3
    finally:
        d.stop("terminate")
    assert world.instances("e2e-notice") == []


def test_restart_adopts_the_fleet_and_an_unknown_instance_of_the_job(world, tmp_path):
    """A restart on the same state adopts its fleet; an instance tagged with the job that no
    intent of this state launched (another state file, a lost one) is adopted too, never
    terminated without proof; the plan then drains the surplus through the ring."""
    settings = world.settings("e2e-restart", queue=False)
    d = build_daemon(settings, tmp_path / "state.sqlite")
    d.recover(); d.poll_prices(); d.plan_and_reconcile("start")
    fleet = {r.id for r in d.state.live_instances()}
    assert len(fleet) == 3
    d.state.close()
    from pricing.model import Offering
    from provisioner.drivers.aws import AwsDriver
    from provisioner.drivers.base import LaunchRequest

    unknown = AwsDriver(settings.aws).launch(LaunchRequest(
        Offering("aws", "us-east-1", "us-east-1a", "g4dn.xlarge"), 1, "e2e-restart",
        "unknown-token")).instances[0].id
    d2 = build_daemon(settings, tmp_path / "state.sqlite")
    d2.recover()
    assert {r.id for r in d2.state.live_instances()} == fleet | {unknown}
    assert {i["InstanceId"] for i in world.instances("e2e-restart")} == fleet | {unknown}
    # a fresh state file (the daemon started from another directory) kills nothing either
    d3 = build_daemon(settings, tmp_path / "fresh.sqlite")
    d3.recover()
    assert {r.id for r in d3.state.live_instances()} == fleet | {unknown}
    assert {i["InstanceId"] for i in world.instances("e2e-restart")} == fleet | {unknown}
    d3.state.close()
    d2.stop("terminate")
    assert world.instances("e2e-restart") == []
