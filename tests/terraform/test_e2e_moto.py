"""End to end on an emulated AWS: `terraform apply` of terraform/aws against a moto server, the
daemon (`provision run`) configured from `terraform output -json` launches workers from the
module's launch template, a spot interruption event reaches the daemon's queue through the
module's EventBridge rule, and `terraform destroy` leaves nothing of the module behind.

The provider is pointed at moto by an override file written into a tmp copy of the module
(``moto_override.tf``); the repository copy is never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.terraform.conftest import REPO, Terraform, make_terraform, require_aws_mirror

pytestmark = [pytest.mark.terraform, pytest.mark.slow]

JOB = "e2e"
REGION = "us-east-1"
TOKEN = "e2e-" + "0123456789abcdef" * 2
SERVICES = ("ec2", "iam", "sqs", "events", "ssm", "sts", "s3")


def _override(endpoint: str) -> str:
    endpoints = "\n".join(f'    {s} = "{endpoint}"' for s in SERVICES)
    return f'''# test only: the AWS provider talks to a moto server
# moto enforces bucket policies, and its endpoint is plain HTTP: the module's deny of
# non-TLS requests to the artifacts bucket would refuse every call, so here it denies
# something no call does (the policy itself is checked by terraform test and checkov)
resource "aws_s3_bucket_policy" "artifacts" {{
  policy = jsonencode({{
    Version = "2012-10-17"
    Statement = [{{
      Sid = "TestOnlyNoTlsOnMoto", Effect = "Deny", Principal = "*",
      Action = "s3:PutBucketAcl", Resource = aws_s3_bucket.artifacts.arn
    }}]
  }})
}}

provider "aws" {{
  access_key                  = "testing"
  secret_key                  = "testing"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true

  endpoints {{
{endpoints}
  }}
}}
'''


@pytest.fixture()
def moto_endpoint(monkeypatch: pytest.MonkeyPatch):
    from moto.server import ThreadedMotoServer

    from tests.fakes.aws_world import reset_moto

    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # start from an empty account, not with what earlier tests in this pytest run left, so
    # "destroy leaves nothing" speaks of this module only
    reset_moto(f"http://{host}:{port}")
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def _clients(endpoint: str) -> dict:
    import boto3

    return {s: boto3.client(s, region_name=REGION, endpoint_url=endpoint)
            for s in ("ec2", "iam", "sqs", "events", "ssm", "s3")}


def _job_instances(ec2) -> list[dict]:
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": "tag:spotring:job", "Values": [JOB]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def _apply(tf: Terraform, aws: dict, endpoint: str) -> tuple[dict, str]:
    ec2 = aws["ec2"]
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])
    subnet_ids = sorted(s["SubnetId"] for s in subnets["Subnets"])[:2]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    (tf.workdir / "moto_override.tf").write_text(_override(endpoint))
    (tf.workdir / "e2e.auto.tfvars.json").write_text(json.dumps({
        "job_id": JOB, "job_module": "examples.digits", "vpc_id": vpc["VpcId"],
        "subnet_ids": subnet_ids, "worker_ami_id": ami, "daemon_ami_id": ami,
        "daemon_detailed_monitoring": False,  # moto lacks MonitorInstances
        "max_workers": 2, "spotring_wheel": str(_wheel())}))
    tf.env["TF_VAR_ring_token"] = TOKEN
    tf.init()
    tf.run("apply", "-auto-approve", "-input=false", "-no-color", timeout=420)
    return tf.outputs(), ami


def _wheel() -> Path:
    """The wheel of this checkout (what the module uploads and the daemon ships)."""
    from tests.fakes.instances import test_wheel

    return test_wheel()[0]


def _check_applied(aws: dict, outputs: dict, ami: str) -> None:
    from tests.terraform.iam_scan import required_actions
    from tests.terraform.test_iam_parity import CODE

    lt_id = outputs["launch_template_id"]["value"]
    lt = aws["ec2"].describe_launch_template_versions(LaunchTemplateId=lt_id)
    data = lt["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["ImageId"] == ami
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    # (moto's CreateFleet does not copy the profile onto instances, so it is checked here)
    assert data["IamInstanceProfile"]["Arn"] == outputs["worker_instance_profile_arn"]["value"]
    assert outputs["security_group_id"]["value"] in data["SecurityGroupIds"]

    sg = aws["ec2"].describe_security_groups(
        GroupIds=[outputs["security_group_id"]["value"]])["SecurityGroups"][0]
    assert sg["IpPermissions"], "the ring ports must be open to ring members"
    for perm in sg["IpPermissions"]:
        assert not perm.get("IpRanges") and not perm.get("Ipv6Ranges"), perm
        assert [p["GroupId"] for p in perm["UserIdGroupPairs"]] == [sg["GroupId"]], perm

    role = outputs["daemon_role_arn"]["value"].split("/")[-1]
    doc = aws["iam"].get_role_policy(RoleName=role, PolicyName="spotring-api")["PolicyDocument"]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    applied = {a for st in doc["Statement"] for a in
               ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    assert applied == required_actions(CODE)

    queue = outputs["queue_url"]["value"]
    policy = json.loads(aws["sqs"].get_queue_attributes(
        QueueUrl=queue, AttributeNames=["Policy"])["Attributes"]["Policy"])
    allows = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    assert [s["Principal"] for s in allows] == [{"Service": "events.amazonaws.com"}]
    rules = outputs["notice_rule_arns"]["value"]
    assert sorted(rules) == ["interruption", "rebalance", "state-change"]
    for name in rules:
        targets = aws["events"].list_targets_by_rule(Rule=f"spotring-{JOB}-{name}")["Targets"]
        assert [t["Arn"] for t in targets] == [outputs["queue_arn"]["value"]]


def _token_stays_secret(tf: Terraform, aws: dict, outputs: dict) -> None:
    """The token is in SSM and nowhere else: not in the state, the outputs, user data; and
    both the daemon host and the worker template ask for IMDSv2 (role credentials behind a
    session token)."""
    import base64

    assert aws["ssm"].get_parameter(Name=outputs["token_parameter"]["value"],
                                    WithDecryption=True)["Parameter"]["Value"] == TOKEN
    assert TOKEN not in tf.run("state", "pull").stdout
    assert TOKEN not in json.dumps(outputs)
    daemon = outputs["daemon_instance_id"]["value"]
    attr = aws["ec2"].describe_instance_attribute(InstanceId=daemon, Attribute="userData")
    assert TOKEN not in base64.b64decode(attr["UserData"]["Value"]).decode()
    lt = aws["ec2"].describe_launch_template_versions(
        LaunchTemplateId=outputs["launch_template_id"]["value"])["LaunchTemplateVersions"][0]
    assert TOKEN not in base64.b64decode(lt["LaunchTemplateData"]["UserData"]).decode()
    host = aws["ec2"].describe_instances(InstanceIds=[daemon])["Reservations"][0]["Instances"][0]
    assert host["MetadataOptions"]["HttpTokens"] == "required"
    assert host["PrivateIpAddress"] == outputs["daemon_settings"]["value"]["coordinator_host"]


def _daemon_config(aws: dict, outputs: dict, endpoint: str, tmp: Path,
                   shared_data: Path) -> Path:
    sys.path.insert(0, str(REPO / "terraform"))
    try:
        import render_config
    finally:
        sys.path.pop(0)
    token = tmp / "ring-token"
    token.write_text(TOKEN)
    # The daemon runs the ring's coordinator with the module's token path; off the host it
    # binds loopback (the module's fixed private address is not this machine's).
    config = render_config.render(outputs, endpoint_url=endpoint,
                                  state_path=str(tmp / "state.sqlite"), token_path=str(token),
                                  coordinator=("127.0.0.1", 0), wheel=str(_wheel()))
    _host_config_matches_rendered(aws, outputs, config)
    # Every cloud call goes to moto, but moto's spot price history is synthetic (below the
    # GPU price floors and stale, so sanity rejects all of it): prices come from the real
    # 2022 AWS trace instead, with the quote age limit opened up for its dates.
    config["source"] = {"kind": "trace", "regions": config["source"]["regions"], "trace": str(
        shared_data / "aws_spot_price_history" / "ericpauley_2022-05-31_all_types.csv.gz")}
    config["optimizer"] = {"max_quote_age_hours": 24.0 * 365 * 20}
    path = tmp / "spotring.toml"
    path.write_text(render_config.to_toml(config))
    return path


def _host_config_matches_rendered(aws: dict, outputs: dict, rendered: dict) -> None:
    """The config the module wrote into the daemon host's user data is the one
    render_config.py makes from the outputs (bar the test's endpoint and state path)."""
    import base64
    import tomllib

    from provisioner.config import parse_settings

    attr = aws["ec2"].describe_instance_attribute(
        InstanceId=outputs["daemon_instance_id"]["value"], Attribute="userData")
    script = base64.b64decode(attr["UserData"]["Value"]).decode()
    body = script.split("<<'SPOTRING_CONFIG'\n", 1)[1].split("\nSPOTRING_CONFIG\n", 1)[0]
    on_host = parse_settings(tomllib.loads(body), origin="daemon user data")
    ours = parse_settings(rendered, origin="render_config")
    assert on_host.aws.model_copy(update={"endpoint_url": None}) == ours.aws.model_copy(
        update={"endpoint_url": None})
    assert (on_host.job, on_host.fleet) == (ours.job, ours.fleet)
    # the same artifacts; the host ships its own copy of the wheel, this daemon the original
    assert on_host.cloud.model_copy(update={"wheel": None}) == ours.cloud.model_copy(
        update={"wheel": None})
    assert on_host.cloud.wheel == f"/opt/spotring-dist/{_wheel().name}"
    # the ring's snapshots in the module's bucket, the workers allowed to put there
    assert on_host.snapshot.model_copy(update={"endpoint_url": None}) == ours.snapshot.model_copy(
        update={"endpoint_url": None})
    assert on_host.snapshot.direct and on_host.snapshot.url.endswith("/snapshots")
    assert on_host.daemon.coordinator_host == outputs["daemon_settings"]["value"]["coordinator_host"]
    assert on_host.daemon.coordinator_port == outputs["daemon_settings"]["value"]["coordinator_port"]
    assert on_host.daemon.token_path == outputs["daemon_settings"]["value"]["token_path"]
    assert ours.daemon.token_path is not None and ours.daemon.coordinator_host == "127.0.0.1"


def _interruption_reaches_the_queue(aws: dict, outputs: dict, instance_id: str) -> None:
    from provisioner.drivers.aws_notices import parse_message
    from provisioner.drivers.base import INTERRUPTION

    detail = {"instance-id": instance_id, "instance-action": "terminate"}
    put = aws["events"].put_events(Entries=[{
        "Source": "aws.ec2", "DetailType": "EC2 Spot Instance Interruption Warning",
        "Detail": json.dumps(detail), "Resources": [f"arn:aws:ec2:{REGION}::instance/{instance_id}"]}])
    assert put["FailedEntryCount"] == 0
    messages = aws["sqs"].receive_message(QueueUrl=outputs["queue_url"]["value"],
                                          MaxNumberOfMessages=10).get("Messages", [])
    notices = [parse_message(m["Body"]) for m in messages]
    assert [(n.instance_id, n.kind) for n in notices if n] == [(instance_id, INTERRUPTION)]


def test_apply_daemon_launches_from_the_template_and_destroy_leaves_nothing(
        tmp_path: Path, moto_endpoint: str, shared_data: Path) -> None:
    require_aws_mirror()
    tf = make_terraform(tmp_path, "aws")
    aws = _clients(moto_endpoint)
    outputs, ami = _apply(tf, aws, moto_endpoint)
    try:
        _check_applied(aws, outputs, ami)
        _token_stays_secret(tf, aws, outputs)
        config = _daemon_config(aws, outputs, moto_endpoint, tmp_path, shared_data)
        # Daemon.start() recovers, polls prices and plans (launching) before the duration
        # starts to count, so 1 s of run time is enough to see its launches.
        proc = subprocess.run([sys.executable, "-m", "provisioner.cli", "-v", "run", "--config",
                               str(config), "--duration", "1s", "--on-exit", "keep"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=180,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert proc.returncode == 0, proc.stderr[-5000:]
        workers = _job_instances(aws["ec2"])
        assert workers, f"the daemon launched nothing:\n{proc.stderr[-5000:]}"
        lt_id = outputs["launch_template_id"]["value"]
        for inst in workers:
            assert inst["ImageId"] == ami
            # (moto's CreateFleet gives instances the VPC's default group instead of the
            # template's; the template's groups are checked in _check_applied)
            assert inst["SubnetId"] in outputs["subnet_ids"]["value"]
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            assert tags.get("aws:ec2launchtemplate:id", lt_id) == lt_id
        # every launch pins the wheel terraform uploaded (the daemon found it stored already)
        from provisioner.drivers.artifacts import sha256_of

        artifacts = outputs["daemon_settings"]["value"]["artifacts"]
        wheel_url = f"{artifacts}{sha256_of(_wheel())}/{_wheel().name}"
        for inst in workers:
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            assert tags["spotring:env:SPOTRING_WHEEL"] == wheel_url
            assert tags["spotring:env:SPOTRING_WHEEL_SHA256"] == sha256_of(_wheel())
        bucket = artifacts.removeprefix("s3://").split("/", 1)[0]
        assert [o["Key"] for o in aws["s3"].list_objects_v2(Bucket=bucket)["Contents"]] == [
            wheel_url.removeprefix(f"s3://{bucket}/")]
        _interruption_reaches_the_queue(aws, outputs, workers[0]["InstanceId"])
        aws["ec2"].terminate_instances(InstanceIds=[i["InstanceId"] for i in workers])
    finally:
        tf.run("destroy", "-auto-approve", "-input=false", "-no-color", "-refresh=false",
               timeout=420)
    assert tf.run("state", "list", "-no-color").stdout.strip() == ""
    ec2 = aws["ec2"]
    assert ec2.describe_launch_templates(Filters=[
        {"Name": "launch-template-name", "Values": [f"spotring-{JOB}-worker"]}])[
        "LaunchTemplates"] == []
    assert not [g for g in ec2.describe_security_groups()["SecurityGroups"]
                if g["GroupName"].startswith(f"spotring-{JOB}")]
    assert not [r for r in aws["iam"].list_roles()["Roles"]
                if r["RoleName"].startswith(f"spotring-{JOB}")]
    assert aws["sqs"].list_queues().get("QueueUrls", []) == []
    assert aws["events"].list_rules(NamePrefix=f"spotring-{JOB}")["Rules"] == []
    assert aws["ssm"].describe_parameters()["Parameters"] == []
    assert not [b for b in aws["s3"].list_buckets()["Buckets"]
                if b["Name"].startswith(f"spotring-{JOB}")]
    daemon = outputs["daemon_instance_id"]["value"]
    state = ec2.describe_instances(InstanceIds=[daemon])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] == "terminated"
