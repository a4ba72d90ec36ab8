"""End to end over HTTP: the daemon (its apscheduler jobs running) on the real GCP driver
against the local Compute Engine fake (tests/fakes/gcp_world.py). It launches a SPOT fleet
labelled with the job; a preemption (the ``compute.instances.preempted`` operation the driver
watches) closes the instance and a replacement is launched in another zone within 5 s (notice
period shortened to 0.3 s); a stocked-out zone gives CapacityError, the daemon records
'no-capacity' and launches elsewhere in the same round, without flapping after; a failed or
slow insert leaves no VM the state does not hold; a restart adopts the fleet and deletes a
stray; ``stop("terminate")`` leaves nothing."""

from __future__ import annotations


import pytest

pytest.importorskip("google.cloud.compute_v1")

from pricing.model import Offering  # noqa: E402
from tests.fakes.gcp_world import L4_TYPE, V100_TYPE, ZONES, GcpWorld, build_daemon  # noqa: E402
from tests.fakes.ring import FakeRing as FakeCoordinator  # noqa: E402
from tests.fakes.wait import wait_for  # noqa: E402

pytestmark = pytest.mark.slow

#: offering instance type -> the VM's machine type and guest accelerator (name, count)
EXPECTED_VM = {V100_TYPE: ("n1-standard-8", "nvidia-tesla-v100", 1),
               L4_TYPE: ("g2-standard-8", None, 0)}


@pytest.fixture(scope="module")
def world():
    with GcpWorld() as w:
        yield w




def assert_cloud_matches_state(world, job, d):
    """The fake holds exactly the state's live instances, each a SPOT VM of its offering."""
    rows = {r.id: r for r in d.state.live_instances()}
    cloud = world.instances(job)
    assert set(cloud) == set(rows)
    for iid, vm in cloud.items():
        off = rows[iid].offering
        assert off.zone == iid.split("/")[0] == vm["zone"].rsplit("/", 1)[-1]
        sched = vm["scheduling"]
        assert sched["provisioningModel"] == "SPOT"
        assert sched["instanceTerminationAction"] == "DELETE"
        assert vm["labels"]["spotring-job"] == job
        meta = {i["key"]: i["value"] for i in vm["metadata"]["items"]}
        assert meta["spotring-offering"] == off.key
        machine, gpu, count = EXPECTED_VM[off.instance_type]
        assert vm["machineType"] == f"zones/{off.zone}/machineTypes/{machine}"
        if gpu is not None:  # N1 + guest accelerator: the GPU the offering names
            assert vm["guestAccelerators"] == [{
                "acceleratorType": f"zones/{off.zone}/acceleratorTypes/{gpu}",
                "acceleratorCount": count}]
        else:  # the GPU comes with the machine type
            assert "guestAccelerators" not in vm
    return rows


def test_fleet_preemption_replacement_and_terminate(world, tmp_path):
    job = "e2e-gcp-preempt"
    coord = FakeCoordinator()
    d = build_daemon(world, world.settings(job, notice_poll_s=0.3, plan_s=600.0),
                     tmp_path / "state.sqlite", coordinator=coord)
    d.start()
    try:
        live = assert_cloud_matches_state(world, job, d)
        assert len(live) == 3
        assert any(r.offering.instance_type == V100_TYPE for r in live.values()), \
            "the plan holds no N1+GPU type: the guestAccelerators check proved nothing"
        # the ring's members named as a real GCP worker names itself (its startup script:
        # the metadata server's zone and name, then its GPU): not after the daemon's ids
        coord.speeds = {f"{vm['zone'].rsplit('/', 1)[-1]}/{vm['name']}/0": 400.0
                        for vm in world.instances(job).values()}
        assert {w.phase for w in d.status().instances} == {"active"}  # every worker matched
        victim = sorted(live)[0]
        revoked_zone = live[victim].offering.zone

        world.preempt(victim)
        replaced = wait_for(lambda: victim not in {r.id for r in d.state.live_instances()}
                            and len(d.state.live_instances()) == 3, timeout_s=5.0)
        assert replaced, "the preempted VM was not closed and replaced within 5 s"
        rows = assert_cloud_matches_state(world, job, d)
        new = [r for r in rows.values() if r.id not in live]
        assert len(new) == 1 and new[0].offering.zone != revoked_zone
        killed = d.state.events(kinds=["killed"])
        assert [(e.instance_id, e.detail) for e in killed] == [(victim, "gcp-operations")]
        assert d.notice_to_launch_s, "the replacement did not come from the notice"
        closed = {r.id: r for r in d.state.instances()}[victim]
        assert closed.ended_at is not None
    finally:
        d.stop("terminate")
    assert world.instances(job) == {}
    assert not d.errors


def test_stockout_fails_over_and_records_no_capacity(world, tmp_path):
    job = "e2e-gcp-stockout"
    cheapest = ZONES[0]  # the plan's first choice (see gcp_world.market)
    world.stockout(cheapest)
    d = build_daemon(world, world.settings(job, notice_poll_s=0.3, plan_s=600.0),
                     tmp_path / "state.sqlite")
    try:
        d.start()  # plan_s is 600: the failover happens within the start round itself
        refused = d.state.events(kinds=["no-capacity"])
        assert refused and all(Offering.from_key(e.offering).zone == cheapest for e in refused)
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in refused[0].detail
        rows = assert_cloud_matches_state(world, job, d)
        assert len(rows) == 3, "the fleet did not fail over to the other zones"
        assert all(r.offering.zone != cheapest for r in rows.values())
        assert "capacity failover" in d.state.decisions()[-1][2]
        for _ in range(3):  # later rounds keep the fleet where it is: no drain-and-relaunch
            d.plan_and_reconcile("test")
        assert {r.id for r in d.state.live_instances()} == set(rows)
        assert not d.state.events(kinds=["drain"]) and len(d.state.instances()) == 3
        assert not [k for k in d.state.decisions()[-1][1] if f"/{cheapest}/" in k]
    finally:
        world.stockout(cheapest, on=False)
        d.stop("terminate")
    assert world.instances(job) == {}
    assert not d.errors


def test_failed_or_slow_inserts_leave_no_untracked_vm(world, tmp_path, monkeypatch):
    """A launch of two VMs whose second insert fails, and an insert still running when the
    driver stops waiting: every VM in the cloud is one the state holds (none paid for
    untracked until a restart), and the fleet fills up."""
    import provisioner.drivers.gcp as gcp

    job = "e2e-gcp-partial"
    monkeypatch.setattr(gcp, "OPERATION_TIMEOUT_S", 0.5)
    # The plan's first launch is two VMs in zone -a: the first goes in, the second gets a 500.
    world.fake.fail_next(500, method="POST", path_contains=f"/zones/{ZONES[0]}/instances",
                         after=1, message="backend broke")
    world.fake.slow_inserts(ZONES[1])  # zone -b's insert is still running after 0.5 s
    d = build_daemon(world, world.settings(job, notice_poll_s=0.3, plan_s=600.0),
                     tmp_path / "state.sqlite")
    try:
        d.start()
        errors = d.state.events(kinds=["launch-error"])
        assert [e.detail for e in errors if "backend broke" in e.detail], errors
        rows = assert_cloud_matches_state(world, job, d)
        assert {r.offering.zone for r in rows.values()} == {ZONES[0], ZONES[1]}
        assert {vm["status"] for vm in world.instances(job).values()} == {"RUNNING",
                                                                          "PROVISIONING"}
        world.fake.slow_inserts(ZONES[1], on=False)
        d.plan_and_reconcile("test")  # the VM the 500 refused is launched again
        assert len(assert_cloud_matches_state(world, job, d)) == 3
    finally:
        world.fake.slow_inserts(ZONES[1], on=False)
        d.stop("terminate")
    assert world.instances(job) == {}
    assert not d.errors


def test_restart_adopts_the_fleet_and_an_unknown_vm_of_the_job(world, tmp_path):
    """A new daemon on the same state finds its VMs by label and token and keeps them; a VM
    labelled with the job that no known launch made is adopted, not deleted (it may be the
    job's, launched under a state file this daemon does not have)."""
    from provisioner.drivers.base import LaunchRequest
    from tests.fakes.gcp_world import market

    job = "e2e-gcp-restart"
    settings = world.settings(job)
    d = build_daemon(world, settings, tmp_path / "state.sqlite")
    d.recover(); d.poll_prices(); d.plan_and_reconcile("start")
    fleet = {r.id for r in d.state.live_instances()}
    assert len(fleet) == 3
    d.state.close()
    unknown = world.driver(settings).launch(LaunchRequest(
        market().quotes[0].offering, 1, job, "unknown-token")).instances[0].id
    d2 = build_daemon(world, settings, tmp_path / "state.sqlite")
    d2.recover()
    assert {r.id for r in d2.state.live_instances()} == fleet | {unknown}
    assert set(world.instances(job)) == fleet | {unknown}
    d2.stop("terminate")
    assert world.instances(job) == {}


def test_unreachable_api_is_a_driver_error(world):
    """No answer at the endpoint (connection refused) is a DriverError naming the setting, not
    a raw requests exception escaping the driver's error edge."""
    from provisioner.config import parse_settings
    from provisioner.errors import DriverError

    settings = parse_settings({"cloud": {"driver": "gcp"}, "gcp": {
        "project": "spotring-e2e", "api_endpoint": "http://127.0.0.1:9"}})
    with pytest.raises(DriverError, match=r"cannot reach the Compute API.*api_endpoint"):
        world.driver(settings).list("e2e-gcp-unreachable")


# -- the boot path for real: the rendered startup script on fake VMs -----------------------------

def test_real_workers_boot_train_and_drain_on_the_preemption_notice(world, tmp_path):
    """The daemon's GCP driver launches SPOT VMs whose startup-script is the rendered worker
    script; each boots for real (tests/fakes/instances.py): the shipped wheel from GCS, the token
    from Secret Manager, a worker named ``<zone>/<vm name>/0``, the driver's own instance id,
    so the daemon finds it. A preemption with its notice (``instance/preempted`` TRUE, the
    ``compute.instances.preempted`` operation) drains the worker at a step boundary; the daemon
    deletes the VM as soon as its worker left and launches a replacement, which joins. Then a
    planned drain of the VM that survived (the plan moving away from the revoked zone): it
    waits while that worker holds the ring alone, and once the replacement has joined the
    worker leaves at a step boundary and its VM goes. Nobody is ever dropped: the drop issue
    32 reports came from a planned drain of a GCP worker deleting its VM at once (no member had
    the VM's id, so the daemon took it for one not in the ring), after which only the heartbeat
    timeout told the coordinator. No step is lost."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from provisioner.config import parse_settings
    from provisioner.plan.reconcile import Removal
    from tests.fakes import instances as fi
    from tests.fakes.cloud_run import CloudRun, free_port, new_token
    from tests.fakes.gcp_world import PROJECT, market
    from tests.fakes.gcs_fake import GcsFake

    why = fi.unavailable()
    if why:
        pytest.skip(why)
    from pricing.sources.trace import TraceSource

    job, bucket, token, port = "e2e-gcp-boot", "e2e-gcp-boot-artifacts", new_token(), free_port()
    world.fake.set_secret(PROJECT, f"{job}-ring-token", token)
    script = fi.render("gcp", {
        "project": PROJECT, "secret": f"{job}-ring-token", "coordinator": f"127.0.0.1:{port}",
        "token_path": "/etc/spotring/ring-token", "job_module": "spotring_boot_job",
        "extra_args": "", "python": fi.IMAGE_PYTHON, "artifacts": f"gs://{bucket}/artifacts/",
        "wheel_url": "", "wheel_sha256": "", "index_requirement": ""})
    wheel, _sha = fi.test_wheel()
    image = fi.make_image()
    with GcsFake(buckets=[bucket]) as gcs:
        base = world.settings(job, max_size=2, notice_poll_s=0.5, plan_s=600.0,
                              drain_timeout_s=600.0).model_dump()
        base["gcp"]["startup_script"] = script
        settings = parse_settings({**base, "cloud": {"driver": "gcp", "wheel": str(wheel),
                                                     "artifacts": f"gs://{bucket}/artifacts"},
                                   "snapshot": {"api_endpoint": gcs.endpoint}})
        try:
            with fi.GcpInstances(world, job, tmp_path / "vms", image,
                                 storage=gcs.endpoint) as vms, CloudRun(
                    settings, world.driver(settings), TraceSource([], snapshot=market()),
                    tmp_path / "state.sqlite", port=port, token=token,
                    launch_env={"SPOTRING_JOB": "spotring_boot_job", "SPOTRING_DEVICE": "cpu",
                                "SPOTRING_GPUS": "1"}) as run:
                d = run.daemon

                def booted() -> str | None:
                    bad = {i: b.log() for i, b in vms.all_boxes().items() if b.rc not in (None, 0)}
                    return f"a boot failed: {bad}" if bad else None

                fleet = set(run.live())
                assert len(fleet) == 2
                assert wait_for(lambda: run.members_of() == {i: [f"{i}/0"] for i in fleet}
                                and len(run.active()) == 2, 150, abort=booted), run.members_of()
                assert {w.phase for w in d.status().instances} == {"active"}
                names = storage.Client(project="x", credentials=AnonymousCredentials(),
                                       client_options={"api_endpoint": gcs.endpoint}).bucket(
                    bucket).list_blobs(prefix="artifacts/")
                shipped = ("artifacts/logs/", "artifacts/exits/")  # the workers' own lines
                assert [b.name.rsplit("/", 1)[-1] for b in names
                        if not b.name.startswith(shipped)] == [wheel.name]
                assert wait_for(lambda: run.step() >= 5, 60)

                victim = sorted(fleet)[0]
                survivor = f"{sorted(fleet)[1]}/0"
                zone, _, name = victim.partition("/")
                world.fake.preempt(PROJECT, zone, name, notice_s=120.0)
                assert wait_for(lambda: victim not in run.live(), 60), run.members_of()
                assert {r.id: r for r in d.state.instances()}[victim].end_reason == \
                    "its workers left the ring"
                assert victim not in world.instances(job)  # deleted, not left for its notice
                assert f"{victim}/0" in {e["name"] for e in run.events("leave")}
                assert wait_for(lambda: len(set(run.live()) - fleet) == 1, 60), run.live()
                (new,) = set(run.live()) - fleet
                # The drop issue 32 reports: the plan moves the survivor (its zone is avoided
                # now). A planned drain is a drain at a step boundary, and while its worker
                # holds the ring's state alone (the replacement not in yet) it waits.
                kept = survivor.rpartition("/")[0]
                off = run.live()[kept].offering
                if new not in run.members_of():
                    d.actuator.drain(Removal(kept, off, "planned: test"))
                    assert run.live()[kept].draining_since is None and survivor in run.active()
                    assert [e for e in d.state.events(kinds=["reconcile-note"])
                            if e.instance_id == kept]
                assert wait_for(lambda: run.members_of().get(new) == [f"{new}/0"]
                                and len(run.active()) == 2, 150, abort=booted), run.members_of()
                assert wait_for(lambda: run.step() >= 5, 60)
                d.actuator.drain(Removal(kept, off, "planned: test"))
                assert wait_for(lambda: kept not in run.live(), 60), run.members_of()
                assert survivor in {e["name"] for e in run.events("leave")}
                assert {r.id: r for r in d.state.instances()}[kept].end_reason == \
                    "its workers left the ring"
                assert wait_for(lambda: run.step() >= 5, 60)  # the ring trains on
                assert run.steps_lost() == 0 and run.events("lost") == [], run.events("lost")
                assert not vms.errors
        finally:
            fi.shutil.rmtree(image.site, ignore_errors=True)
    assert world.instances(job) == {}


@pytest.mark.parametrize("adc", ["none", "unrefreshable"])
def test_provision_run_without_usable_gcp_credentials_says_so_in_one_line(world, tmp_path, adc):
    """`provision run` on GCP with no Application Default Credentials at all, or with ones
    whose access token cannot be refreshed (the token endpoint out of reach, as for a revoked
    login): one line naming the fix, exit 2, no traceback."""
    import json
    import os
    import subprocess
    import sys
    from datetime import datetime, timedelta, timezone

    from tests.conftest import REPO
    from tests.fakes.gcp_world import PROJECT, ZONES

    now = (datetime.now(timezone.utc) - timedelta(minutes=1)).isoformat()
    (tmp_path / "prices.csv").write_text(
        "time,cloud,region,zone,instance_type,market,price_per_hour,on_demand_per_hour,"
        "available\n" + "".join(f"{now},gcp,us-central1,{z},g2-standard-8,spot,0.48,0.85,\n"
                                for z in ZONES))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[job]
id = "cli-gcp-creds"
[cloud]
driver = "gcp"
[gcp]
project = "{PROJECT}"
zones = {json.dumps(list(ZONES))}
api_endpoint = "{world.endpoint}"
[source]
kind = "trace"
[fleet]
max_size = 1
markets = ["spot"]
[daemon]
state_path = "state.sqlite"
""")
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env.update(PYTHONPATH=str(REPO), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
               GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9")
    if adc == "unrefreshable":
        (tmp_path / "adc.json").write_text(json.dumps({
            "type": "authorized_user", "client_id": "1.apps", "client_secret": "s",
            "refresh_token": "r", "quota_project_id": PROJECT}))
        env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "adc.json")
    done = subprocess.run([sys.executable, "-m", "provisioner.cli", "run", "--config", str(cfg),
                           "--trace", str(tmp_path / "prices.csv")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("provision run: error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "gcloud auth application-default login" in lines[0]
    assert ("could not be refreshed" in lines[0]) == (adc == "unrefreshable")
    assert world.instances("cli-gcp-creds") == {}
