"""The GCP driver through the real google-cloud-compute REST client against the local fake
(tests/fakes/gcp_fake.py): SPOT VMs with GPUs, labels, idempotent launches, list, delete,
preemption operations, and injected 429/503/quota/stockout errors."""

from __future__ import annotations

import pytest

pytest.importorskip("google.cloud.compute_v1")

from google.api_core.client_options import ClientOptions  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402

from pricing.model import Offering  # noqa: E402
from provisioner.config import GcpSettings, parse_settings  # noqa: E402
from provisioner.drivers.base import (PREEMPTED, RUNNING, TERMINATED_NOTICE,  # noqa: E402
                                      CloudDriver, LaunchRequest)
from provisioner.drivers.gcp import GcpDriver, instance_name, split_instance_type  # noqa: E402
from provisioner.errors import CapacityError, ConfigError, DriverError  # noqa: E402
from tests.fakes.gcp_fake import GcpFake, matches  # noqa: E402

PROJECT = "spotring-test"
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"
V100 = Offering("gcp", "us-central1", ZONE_A, "n1-standard-8+nvidia-tesla-v100x2", "spot")
L4_B = Offering("gcp", "us-central1", ZONE_B, "g2-standard-8", "spot")


@pytest.fixture(scope="module")
def fake():
    with GcpFake() as server:
        yield server


@pytest.fixture()
def driver(fake):
    clock = [0.0]
    d = GcpDriver(GcpSettings(project=PROJECT, startup_script="python -m trainer worker"),
                  credentials=AnonymousCredentials(),
                  client_options=ClientOptions(api_endpoint=fake.endpoint),
                  monotonic=lambda: clock[0], fallback_interval_s=30)
    d.clock = clock  # type: ignore[attr-defined]
    yield d
    # leave the module-scoped fake empty for the next test
    with fake.lock:
        fake.instances.clear()
        fake.failures.clear()
        fake.stockout_zones.clear()
        fake.operations.clear()  # a later driver must not read this test's preemptions
        fake.noticed.clear()


def req(token: str, count: int = 1, off: Offering = V100, job: str = "job-a") -> LaunchRequest:
    return LaunchRequest(off, count, job, token, env={"SPOTRING_COORD": "10.0.0.1:29500"})


def test_instance_type_spelling():
    assert split_instance_type("n1-standard-8+v100x2") == ("n1-standard-8", "nvidia-tesla-v100", 2)
    assert split_instance_type("n1-highmem-4+nvidia-tesla-k80") == (
        "n1-highmem-4", "nvidia-tesla-k80", 1)
    assert split_instance_type("a2-highgpu-1g") == ("a2-highgpu-1g", None, 0)
    with pytest.raises(DriverError, match="machine type"):
        split_instance_type("N1 standard")
    assert instance_name("j", "t", 0) == instance_name("j", "t", 0) != instance_name("j", "t", 1)
    assert instance_name("a", "t", 0)[:12] != instance_name("a-b", "t", 0)[:12]


def test_settings_and_protocol():
    assert isinstance(GcpDriver.__new__(GcpDriver), CloudDriver)
    with pytest.raises(DriverError, match="gcp.project"):
        GcpDriver(GcpSettings())
    with pytest.raises(ConfigError, match="gcp.project"):
        parse_settings({"gcp": {"project": "Bad Project"}})


def test_filter_matching_of_the_fake():
    inst = {"labels": {"spotring-job": "a"}, "status": "RUNNING"}
    assert matches(inst, 'labels.spotring-job = "a"')
    assert not matches(inst, 'labels.spotring-job = "b"')
    assert matches(inst, '(labels.spotring-job = "a") AND (status != "STOPPED")')


def test_launch_spot_vm_with_gpus_labels_and_list(driver, fake):
    result = driver.launch(req("tok-1", 2))
    assert [i.id for i in result.instances] == [f"{ZONE_A}/{instance_name('job-a', 'tok-1', i)}"
                                                for i in range(2)]
    body = fake.alive(PROJECT)[0]
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["guestAccelerators"] == [{
        "acceleratorType": f"zones/{ZONE_A}/acceleratorTypes/nvidia-tesla-v100",
        "acceleratorCount": 2}]
    assert body["machineType"] == f"zones/{ZONE_A}/machineTypes/n1-standard-8"
    assert body["labels"]["spotring-job"] == "job-a"
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["spotring-env-SPOTRING_COORD"] == "10.0.0.1:29500"
    listed = driver.list("job-a")
    assert {i.id for i in listed} == {i.id for i in result.instances}
    assert all(i.offering == V100 and i.state == RUNNING for i in listed)
    assert all(i.tags["token"] == "tok-1" and i.tags["job"] == "job-a" for i in listed)
    assert driver.list("job-b") == []


def test_retried_launch_never_doubles(driver, fake):
    first = driver.launch(req("tok-2", 2))
    again = driver.launch(req("tok-2", 2))  # a restarted daemon retrying the same token
    assert [i.id for i in again.instances] == [i.id for i in first.instances]
    assert len(fake.alive(PROJECT)) == 2


def test_terminate_and_unknown_ids(driver, fake):
    ids = [i.id for i in driver.launch(req("tok-3", 2)).instances]
    driver.terminate(ids + [f"{ZONE_A}/sr-does-not-exist"])
    assert driver.list("job-a") == [] and fake.alive(PROJECT) == []
    with pytest.raises(DriverError, match="zone"):
        driver.terminate(["no-slash"])


def test_preemption_operation_is_a_notice_once(driver, fake):
    a, b = [i.id for i in driver.launch(req("tok-4", 2)).instances]
    assert driver.notices() == []
    fake.preempt(PROJECT, ZONE_A, a.split("/")[1])
    driver.terminate([b])  # our own delete is not a notice
    notices = driver.notices()
    assert [(n.instance_id, n.kind) for n in notices] == [(a, PREEMPTED)]
    driver.clock[0] = 100.0  # the list fallback runs too, and must not repeat it
    assert driver.notices() == []


def test_a_preemption_with_notice_is_an_interruption_to_drain(driver, fake):
    """SPOT VMs ask for the 120 s preemption notice; a preemption operation on a VM that is
    still there (its notice running: instance/preempted is TRUE on it) is an interruption with
    a deadline, so the daemon drains it instead of deleting it under its worker."""
    from datetime import timedelta

    from provisioner.drivers.base import INTERRUPTION
    from provisioner.drivers.gcp_notices import SOFT_OFF_S

    (a,) = [i.id for i in driver.launch(req("tok-13", 1)).instances]
    body = fake.alive(PROJECT)[0]
    assert body["scheduling"]["preemptionNoticeDuration"] == {"seconds": "120"}
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["spotring-env-SPOTRING_GPUS"] == "2"  # the offering's V100s: one worker each
    fake.preempt(PROJECT, ZONE_A, a.split("/")[1], notice_s=3600)
    assert fake.is_preempted(PROJECT, ZONE_A, a.split("/")[1])
    (n,) = driver.notices()
    assert (n.instance_id, n.kind) == (a, INTERRUPTION)
    assert n.deadline - n.time == timedelta(seconds=120 + SOFT_OFF_S)
    assert driver.notices() == []  # each operation once
    driver.terminate([a])


def test_unknown_operation_types_are_ignored():
    from datetime import datetime, timezone

    from provisioner.drivers.gcp_notices import Operation, parse_operation

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_operation(Operation("1", "compute.instances.setLabels", "z/vm", ""), 120, now) \
        is None
    gone = parse_operation(Operation("2", "compute.instances.preempted", "z/vm",
                                     "2026-01-01T00:00:05+00:00"), 120, now)
    assert gone is not None and gone.kind == PREEMPTED and gone.deadline is None
    assert gone.time == datetime(2026, 1, 1, 0, 0, 5, tzinfo=timezone.utc)


def test_list_fallback_catches_a_vm_deleted_elsewhere(driver, fake):
    (a,) = [i.id for i in driver.launch(req("tok-5", 1)).instances]
    driver.notices()
    with fake.lock:
        fake.instances.pop((PROJECT, ZONE_A, a.split("/")[1]))
    assert driver.notices() == []  # fallback not due yet
    driver.clock[0] = 31.0
    assert [(n.instance_id, n.kind) for n in driver.notices()] == [(a, TERMINATED_NOTICE)]


def test_429_and_503_are_retried(driver, fake):
    fake.fail_next(429, method="POST", path_contains="/instances", reason="rateLimitExceeded")
    fake.fail_next(503, method="GET", path_contains="aggregated", times=2)
    assert len(driver.launch(req("tok-6", 1)).instances) == 1
    assert len(driver.list("job-a")) == 1
    posts = [p for m, p in fake.requests if m == "POST"]
    assert len(posts) >= 2  # the throttled insert was sent again


def test_persistent_errors_become_driver_errors(driver, fake):
    fake.fail_next(500, method="GET", path_contains="aggregated", message="backend broke")
    with pytest.raises(DriverError, match="backend broke"):
        driver.list("job-a")


def test_stockout_and_quota_are_capacity_errors(driver, fake):
    fake.stockout(ZONE_B)
    with pytest.raises(CapacityError) as info:
        driver.launch(req("tok-7", 1, off=L4_B))
    assert info.value.offering_key == L4_B.key
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(info.value)
    fake.fail_next(403, method="POST", path_contains=ZONE_A, reason="quotaExceeded",
                   message="Quota 'NVIDIA_V100_GPUS' exceeded. Limit: 0.0 in region us-central1.")
    with pytest.raises(CapacityError, match="V100"):
        driver.launch(req("tok-8", 1))
    # failover to the next offering works
    assert len(driver.launch(req("tok-9", 1)).instances) == 1




def test_no_credentials_is_a_clear_error(monkeypatch, tmp_path):
    from provisioner.errors import CredentialsError

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud ADC file
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server either
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    with pytest.raises(CredentialsError, match="application-default"):
        GcpDriver(GcpSettings(project=PROJECT))


def test_a_credential_refresh_failure_is_one_line_with_the_fix(fake, tmp_path, monkeypatch):
    """Credentials found but not renewable: a refresh token Google refuses (revoked, an expired
    login) and a token endpoint this host cannot reach (Application Default Credentials of
    `gcloud auth application-default login`, offline here). google-auth's RefreshError on the
    first call is a CredentialsError naming the fix, in one line."""
    from google.oauth2.credentials import Credentials

    from provisioner.errors import CredentialsError

    revoked = Credentials(token=None, refresh_token="r", client_id="1.apps", client_secret="s",
                          token_uri=_refusing_token_server())
    d = GcpDriver(GcpSettings(project=PROJECT), credentials=revoked,
                  client_options=ClientOptions(api_endpoint=fake.endpoint))
    with pytest.raises(CredentialsError) as err:
        d.list("job-a")
    assert "could not be refreshed" in str(err.value) and "invalid_grant" in str(err.value)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(_user_credentials(tmp_path)))
    d = GcpDriver(GcpSettings(project=PROJECT, api_endpoint=fake.endpoint))
    with pytest.raises(CredentialsError) as err:
        d.list("job-a")
    for text in (str(err.value),):
        assert "could not be refreshed" in text and "GOOGLE_APPLICATION_CREDENTIALS" in text
        assert "\n" not in text and len(text) < 600


def _refusing_token_server() -> str:
    """An OAuth token endpoint that refuses every grant (a revoked refresh token)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"error": "invalid_grant",
                               "error_description": "Token has been expired or revoked."}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/token"


def _user_credentials(tmp_path):
    """An ``authorized_user`` ADC file (what `gcloud auth application-default login` writes;
    its token endpoint is Google's, which this host cannot reach)."""
    import json

    path = tmp_path / "adc.json"
    path.write_text(json.dumps({"type": "authorized_user", "client_id": "1.apps",
                                "client_secret": "s", "refresh_token": "r",
                                "quota_project_id": PROJECT}))
    return path


def test_partial_stockout_returns_what_was_launched(driver, fake, monkeypatch):
    real = GcpDriver._resource
    calls = []

    def resource(self, request, name):  # the zone runs dry after the first VM
        calls.append(name)
        if len(calls) == 2:
            fake.stockout(ZONE_A)
        return real(self, request, name)

    monkeypatch.setattr(GcpDriver, "_resource", resource)
    result = driver.launch(req("tok-12", 3))
    assert len(result.instances) == 1 and "ZONE_RESOURCE_POOL_EXHAUSTED" in result.errors[0]
    assert len(fake.alive(PROJECT)) == 1
