"""The AWS driver against moto's ``mock_aws``: launch (fleet and run_instances), tags and
idempotency, list, terminate, capacity failover signal, throttling retried by botocore's
retry config, and notices from EventBridge -> SQS plus the describe fallback."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from botocore.awsrequest import AWSResponse  # noqa: E402

from pricing.model import Offering  # noqa: E402
from pricing.sources.boto import make_client  # noqa: E402
from provisioner.config import AwsSettings  # noqa: E402
from provisioner.drivers.aws import (AWS_DRIVER_ACTIONS, TAG_JOB, TAG_OFFERING,  # noqa: E402
                                     TAG_TOKEN, AwsDriver)
from provisioner.drivers.base import (INTERRUPTION, PREEMPTED, REBALANCE,  # noqa: E402
                                      TERMINATED_NOTICE, CloudDriver, LaunchRequest)
from provisioner.errors import CapacityError, CredentialsError, DriverError  # noqa: E402

REGION = "us-east-1"
TEMPLATE = "spotring-worker"
OFF_B = Offering("aws", REGION, "us-east-1b", "g4dn.xlarge", "spot")
OFF_C = Offering("aws", REGION, "us-east-1c", "g5.xlarge", "spot")
EVENT_KINDS = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation",
               "EC2 Instance State-change Notification"]


@pytest.fixture()
def aws(monkeypatch):
    """A mocked account with a launch template and an EventBridge rule feeding an SQS queue."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    with moto.mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        ec2.create_launch_template(LaunchTemplateName=TEMPLATE, LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "t3.micro"})
        sqs = boto3.client("sqs", region_name=REGION)
        queue = sqs.create_queue(QueueName="spotring-notices")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue,
                                       AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events = boto3.client("events", region_name=REGION)
        events.put_rule(Name="spotring-ec2", EventPattern=json.dumps(
            {"source": ["aws.ec2"], "detail-type": EVENT_KINDS}))
        events.put_targets(Rule="spotring-ec2", Targets=[{"Id": "queue", "Arn": arn}])
        yield {"ec2": ec2, "sqs": sqs, "events": events, "queue": queue}


def settings(queue: str | None = None, **kw) -> AwsSettings:
    return AwsSettings(region=REGION, launch_template=TEMPLATE, queue_url=queue, **kw)


def request(token: str = "tok-1", count: int = 2, off: Offering = OFF_B) -> LaunchRequest:
    return LaunchRequest(off, count, "job-a", token, env={"SPOTRING_COORD": "10.0.0.1:29500"})


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: object):
        yield self._body


def inject(client, operation: str, responses: list[tuple[int, str]]) -> list[int]:
    """Answer the next len(responses) HTTP sends of ``operation`` with canned responses,
    before moto sees them; returns a list that counts every send (injected or not)."""
    sends: list[int] = []

    def handler(request, **_):
        sends.append(1)
        if responses:
            status, body = responses.pop(0)
            request.url = "https://injected.invalid/"  # so moto's own before-send skips it
            return AWSResponse(request.url, status, {}, _Raw(body.encode()))
        return None

    client.meta.events.register_first(f"before-send.ec2.{operation}", handler)
    return sends


def ec2_error(code: str) -> str:
    return (f"<Response><Errors><Error><Code>{code}</Code><Message>{code} (injected)</Message>"
            f"</Error></Errors><RequestID>r-1</RequestID></Response>")


def test_protocol_and_actions():
    assert isinstance(AwsDriver.__new__(AwsDriver), CloudDriver)
    assert "ec2:CreateFleet" in AWS_DRIVER_ACTIONS and "sqs:ReceiveMessage" in AWS_DRIVER_ACTIONS
    assert all(a.split(":")[0] in ("ec2", "sqs") for a in AWS_DRIVER_ACTIONS)


def test_missing_launch_template_is_a_clear_error(aws):
    with pytest.raises(DriverError, match="launch_template"):
        AwsDriver(AwsSettings(region=REGION))


@pytest.mark.parametrize("mode", ["fleet", "run-instances"])
def test_launch_tags_zone_and_list(aws, mode):
    driver = AwsDriver(settings(launch_mode=mode))
    result = driver.launch(request(count=2))
    assert len(result.instances) == 2 and not result.errors
    listed = {i.id: i for i in driver.list("job-a")}
    assert set(listed) == {i.id for i in result.instances}
    for inst in listed.values():
        assert inst.offering == OFF_B  # real zone, type and market read back from EC2
        assert inst.tags[TAG_JOB] == "job-a" and inst.tags[TAG_OFFERING] == OFF_B.key
        assert inst.tags[TAG_TOKEN] == inst.tags["token"] == "tok-1"
        assert inst.tags["spotring:env:SPOTRING_COORD"] == "10.0.0.1:29500"
    assert driver.list("another-job") == []


def test_same_token_never_launches_twice(aws):
    driver = AwsDriver(settings())
    first = driver.launch(request("tok-x", 3))
    # A new driver (a restarted daemon) retrying the same launch gets the same instances.
    again = AwsDriver(settings()).launch(request("tok-x", 3))
    assert {i.id for i in again.instances} == {i.id for i in first.instances}
    assert len(driver.list("job-a")) == 3
    other = driver.launch(request("tok-y", 1))
    assert len(other.instances) == 1 and len(driver.list("job-a")) == 4


def test_terminate_known_and_unknown_ids(aws):
    driver = AwsDriver(settings())
    ids = [i.id for i in driver.launch(request(count=2)).instances]
    driver.terminate(ids + ["i-0123456789abcdef0"])  # unknown id: not an error
    assert driver.list("job-a") == []
    driver.terminate(ids)  # already terminated: not an error
    driver.terminate([])


def test_wrong_region_is_refused(aws):
    driver = AwsDriver(settings())
    with pytest.raises(DriverError, match="us-east-1"):
        driver.launch(request(off=Offering("aws", "eu-west-1", "eu-west-1a", "g5.xlarge")))


def test_capacity_error_from_run_instances_names_the_offering(aws):
    ec2 = make_client("ec2", REGION)
    driver = AwsDriver(settings(launch_mode="run-instances"), ec2=ec2)
    inject(ec2, "RunInstances", [(400, ec2_error("InsufficientInstanceCapacity"))])
    with pytest.raises(CapacityError) as info:
        driver.launch(request(off=OFF_C))
    assert info.value.offering_key == OFF_C.key
    assert driver.list("job-a") == []
    # The next offering (the daemon's failover) launches.
    assert len(driver.launch(request("tok-2", off=OFF_B)).instances) == 2


def test_capacity_error_from_create_fleet_errors(aws):
    ec2 = make_client("ec2", REGION)
    driver = AwsDriver(settings(), ec2=ec2)
    body = ("<CreateFleetResponse><requestId>r</requestId><fleetId>fleet-1</fleetId><errorSet>"
            "<item><errorCode>InsufficientInstanceCapacity</errorCode><errorMessage>no g5 in "
            "us-east-1c</errorMessage><lifecycle>spot</lifecycle></item></errorSet>"
            "<fleetInstanceSet/></CreateFleetResponse>")
    inject(ec2, "CreateFleet", [(200, body)])
    with pytest.raises(CapacityError, match="us-east-1c"):
        driver.launch(request(off=OFF_C))


def test_throttling_is_retried_by_botocore(aws):
    ec2 = make_client("ec2", REGION)
    sends = inject(ec2, "CreateFleet", [(503, ec2_error("RequestLimitExceeded")),
                                        (400, ec2_error("ThrottlingException"))])
    driver = AwsDriver(settings(), ec2=ec2)
    result = driver.launch(request(count=1))
    assert len(result.instances) == 1
    assert len(sends) == 3  # two throttled sends, then the real one
    assert len(driver.list("job-a")) == 1


def test_throttling_past_the_retry_budget_is_a_driver_error(aws):
    ec2 = make_client("ec2", REGION, max_attempts=3)  # total attempts: 3 sends in all
    sends = inject(ec2, "DescribeInstances", [(503, ec2_error("RequestLimitExceeded"))] * 3)
    with pytest.raises(DriverError, match="RequestLimitExceeded"):
        AwsDriver(settings(), ec2=ec2).list("job-a")
    assert len(sends) == 3


def test_refused_credentials_are_a_credentials_error(aws):
    ec2 = make_client("ec2", REGION)
    inject(ec2, "DescribeInstances", [(401, ec2_error("AuthFailure"))])
    with pytest.raises(CredentialsError, match="AuthFailure"):
        AwsDriver(settings(), ec2=ec2).list("job-a")


def _put_event(events, kind: str, detail: dict) -> None:
    out = events.put_events(Entries=[{"Source": "aws.ec2", "DetailType": kind,
                                      "Detail": json.dumps(detail)}])
    assert out["FailedEntryCount"] == 0


def test_notices_from_eventbridge_through_sqs(aws):
    driver = AwsDriver(settings(aws["queue"]), fallback_interval_s=1e9)
    a, b = [i.id for i in driver.launch(request(count=2)).instances]
    _put_event(aws["events"], EVENT_KINDS[0], {"instance-id": a, "instance-action": "terminate"})
    _put_event(aws["events"], EVENT_KINDS[1], {"instance-id": b})
    _put_event(aws["events"], EVENT_KINDS[2], {"instance-id": b, "state": "running"})  # ignored
    # Unknown and malformed messages are ignored and deleted, never an error.
    aws["sqs"].send_message(QueueUrl=aws["queue"], MessageBody=json.dumps(
        {"detail-type": "EC2 Fleet Spot Instance Request Error", "detail": {}}))
    aws["sqs"].send_message(QueueUrl=aws["queue"], MessageBody="not json")
    notices = driver.notices()
    kinds = {(n.instance_id, n.kind) for n in notices}
    assert kinds == {(a, INTERRUPTION), (b, REBALANCE)}
    warning = next(n for n in notices if n.kind == INTERRUPTION)
    assert (warning.deadline - warning.time).total_seconds() == 120
    assert driver.notices() == []  # delivered once, queue drained
    attrs = aws["sqs"].get_queue_attributes(QueueUrl=aws["queue"], AttributeNames=["All"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"
    assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"
    # A state change to shutting-down is a notice; the same kind twice is delivered once.
    for _ in range(2):
        _put_event(aws["events"], EVENT_KINDS[2], {"instance-id": a, "state": "shutting-down"})
    assert [(n.instance_id, n.kind) for n in driver.notices()] == [(a, TERMINATED_NOTICE)]


def test_a_notice_taken_off_the_queue_survives_a_failing_call_in_the_same_poll(aws):
    """The queue's messages are deleted once read; when the describe fallback of the same
    poll fails (throttled past the retry budget), the poll raises and the notice read before
    is returned by the next poll, not lost (an instance left "live" and never replaced)."""
    ec2 = make_client("ec2", REGION, max_attempts=1)
    driver = AwsDriver(settings(aws["queue"]), ec2=ec2, fallback_interval_s=0)
    (a,) = [i.id for i in driver.launch(request(count=1)).instances]
    _put_event(aws["events"], EVENT_KINDS[0], {"instance-id": a, "instance-action": "terminate"})
    inject(ec2, "DescribeInstances", [(503, ec2_error("RequestLimitExceeded"))])
    with pytest.raises(DriverError, match="RequestLimitExceeded"):
        driver.notices()
    attrs = aws["sqs"].get_queue_attributes(QueueUrl=aws["queue"], AttributeNames=["All"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"  # it was deleted
    assert [(n.instance_id, n.kind) for n in driver.notices()] == [(a, INTERRUPTION)]
    assert driver.notices() == []


def test_describe_fallback_finds_instances_gone_without_an_event(aws):
    clock = [0.0]
    driver = AwsDriver(settings(), monotonic=lambda: clock[0], fallback_interval_s=30,
                       now=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))
    a, b, c = [i.id for i in driver.launch(request(count=3)).instances]
    assert driver.notices() == []  # first fallback: all running
    aws["ec2"].terminate_instances(InstanceIds=[a])  # taken away behind our back
    driver.terminate([b])  # our own termination is not a notice
    clock[0] = 10.0
    assert driver.notices() == []  # fallback not due yet
    clock[0] = 31.0
    notices = driver.notices()
    assert [n.instance_id for n in notices] == [a]
    assert notices[0].kind in (PREEMPTED, TERMINATED_NOTICE)
    clock[0] = 70.0
    assert driver.notices() == []  # delivered once
    assert {i.id for i in driver.list("job-a")} == {c}


def test_can_place_only_its_region_and_configured_zones(aws):
    open_driver = AwsDriver(settings(), ec2=aws["ec2"])
    assert open_driver.can_place(OFF_B) and open_driver.can_place(OFF_C)
    assert not open_driver.can_place(Offering("aws", "us-west-2", "us-west-2a", "g5.xlarge"))
    assert not open_driver.can_place(Offering("gcp", "us-central1", "*", "g2-standard-4"))
    subnet = aws["ec2"].describe_subnets(Filters=[
        {"Name": "availability-zone", "Values": ["us-east-1b"]}])["Subnets"][0]["SubnetId"]
    fenced = AwsDriver(settings(subnets={"us-east-1b": subnet}), ec2=aws["ec2"])
    assert fenced.can_place(OFF_B) and not fenced.can_place(OFF_C)


def test_a_zone_id_offering_lands_in_that_zones_default_subnet(aws):
    subnets = aws["ec2"].describe_subnets()["Subnets"]
    target = next(s for s in subnets if s["AvailabilityZone"] == "us-east-1c")
    off = Offering("aws", REGION, target["AvailabilityZoneId"], "g5.xlarge", "spot")
    driver = AwsDriver(settings(), ec2=aws["ec2"])
    result = driver.launch(request(token="tok-zone-id", count=1, off=off))
    got = aws["ec2"].describe_instances(InstanceIds=[result.instances[0].id])
    assert got["Reservations"][0]["Instances"][0]["SubnetId"] == target["SubnetId"]
