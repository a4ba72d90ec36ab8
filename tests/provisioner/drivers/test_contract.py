"""One contract, every driver: what the daemon relies on of a CloudDriver, run against AWS
(moto's ``mock_aws``), GCP (the real REST client against tests/fakes/gcp_fake.py) and the
local driver (processes running tests/fakes/local_worker.py).

The contract (provisioner/drivers/base.py): a driver is a CloudDriver; ``can_place`` accepts
its own offerings; a launch returns its instances tagged with the job and the token, and the
same token never launches twice; ``list(job)`` holds exactly the job's live instances (none
of another job's); ``terminate`` ends them and ignores ids already terminated; ``notices()`` is a list
of Notice and empty when nothing happened.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Iterator

import pytest

from pricing.model import Offering
from provisioner.drivers.base import CloudDriver, LaunchRequest, Notice
from tests.conftest import REPO
from tests.fakes.wait import wait_for

JOB, OTHER = "contract-job", "contract-other"


def _aws(stack: ExitStack, tmp_path) -> tuple[CloudDriver, Offering]:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    from provisioner.config import AwsSettings
    from provisioner.drivers.aws import AwsDriver

    mp = stack.enter_context(pytest.MonkeyPatch.context())
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        mp.setenv(k, v)
    stack.enter_context(moto.mock_aws())
    boto3.client("ec2", region_name="us-east-1").create_launch_template(
        LaunchTemplateName="spotring-worker",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"})
    driver = AwsDriver(AwsSettings(region="us-east-1", launch_template="spotring-worker"))
    return driver, Offering("aws", "us-east-1", "us-east-1b", "g4dn.xlarge", "spot")


def _gcp(stack: ExitStack, tmp_path) -> tuple[CloudDriver, Offering]:
    pytest.importorskip("google.cloud.compute_v1")
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    from provisioner.config import GcpSettings
    from provisioner.drivers.gcp import GcpDriver
    from tests.fakes.gcp_fake import GcpFake

    fake = stack.enter_context(GcpFake())
    driver = GcpDriver(GcpSettings(project="spotring-test", zones=["us-central1-a"],
                                   startup_script="python -m trainer worker"),
                       credentials=AnonymousCredentials(),
                       client_options=ClientOptions(api_endpoint=fake.endpoint))
    return driver, Offering("gcp", "us-central1", "us-central1-a", "g2-standard-8", "spot")


def _local(stack: ExitStack, tmp_path) -> tuple[CloudDriver, Offering]:
    from datetime import datetime, timezone

    from provisioner.drivers.local import LocalDriver

    out = tmp_path / "out"
    out.mkdir()
    fake = REPO / "tests" / "fakes" / "local_worker.py"
    driver = LocalDriver(tmp_path / "cloud",
                         lambda spec: [sys.executable, str(fake), str(out), spec.instance_id],
                         clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc),
                         availability=lambda o, t: None, terminate_grace_s=1.0)
    stack.callback(lambda: driver.terminate([i.id for j in (JOB, OTHER)
                                             for i in driver.list(j)]))
    return driver, Offering("local", "local-1", "local-1a", "p3.2xlarge", "spot")


@pytest.fixture(params=["aws", "gcp", "local"])
def cloud(request, tmp_path) -> Iterator[tuple[CloudDriver, Offering]]:
    with ExitStack() as stack:
        yield {"aws": _aws, "gcp": _gcp, "local": _local}[request.param](stack, tmp_path)


def test_driver_contract(cloud):
    driver, off = cloud
    assert isinstance(driver, CloudDriver) and driver.name
    assert driver.can_place(off)
    first = driver.launch(LaunchRequest(off, 2, JOB, "contract-tok-1"))
    assert len(first.instances) == 2 and not first.errors
    assert all(i.offering == off for i in first.instances)
    again = driver.launch(LaunchRequest(off, 2, JOB, "contract-tok-1"))  # same token
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    other = driver.launch(LaunchRequest(off, 1, OTHER, "contract-tok-2"))
    ids = {i.id for i in first.instances}
    listed = driver.list(JOB)
    assert {i.id for i in listed} == ids
    assert all(i.tags.get("token") == "contract-tok-1" for i in listed)
    assert {i.id for i in driver.list(OTHER)} == {i.id for i in other.instances}
    assert all(isinstance(n, Notice) for n in driver.notices())
    victim = sorted(ids)[0]
    driver.terminate([victim])
    assert wait_for(lambda: {i.id for i in driver.list(JOB)} == ids - {victim}, 20.0)
    driver.terminate([victim])  # already terminated: not an error
    driver.terminate(sorted(ids - {victim}))
    assert wait_for(lambda: driver.list(JOB) == [], 20.0)
    assert {i.id for i in driver.list(OTHER)} == {i.id for i in other.instances}
    driver.terminate([i.id for i in other.instances])
