"""The daemon's IAM policy in terraform/aws grants exactly what the AWS code calls.

The code side is found by scanning pricing/sources/aws.py, provisioner/drivers/aws.py and
provisioner/drivers/artifacts.py for boto3 operations (paginators included); the policy side by
parsing iam.tf with python-hcl2.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.terraform.conftest import REPO, TF_ROOT
from tests.terraform.iam_scan import (called_actions, granted_actions, policy_statements,
                                      required_actions)

IAM_TF = TF_ROOT / "aws" / "iam.tf"
SOURCE = REPO / "pricing" / "sources" / "aws.py"
DRIVER = REPO / "provisioner" / "drivers" / "aws.py"
ARTIFACTS = REPO / "provisioner" / "drivers" / "artifacts.py"  # the wheel shipped to S3
CODE = [SOURCE, DRIVER, ARTIFACTS]


def test_the_scanner_maps_calls_paginators_and_batches(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent("""
        def f(self, ec2, sqs):
            ec2.get_paginator("describe_spot_price_history").paginate(InstanceTypes=["g5.xlarge"])
            self._sqs.delete_message_batch(QueueUrl="q", Entries=[])
            self.client("pricing", "us-east-1").get_products(ServiceCode="AmazonEC2")
            ec2.run_instances(MinCount=1, MaxCount=1)
            response.get("Instances", [])   # not an AWS operation
            self.launch(request)            # not an AWS operation
    """))
    assert set(called_actions(sample)) == {"ec2:DescribeSpotPriceHistory", "sqs:DeleteMessage",
                                           "pricing:GetProducts", "ec2:RunInstances"}
    assert required_actions([sample]) == {"ec2:DescribeSpotPriceHistory", "sqs:DeleteMessage",
                                          "pricing:GetProducts", "ec2:RunInstances",
                                          "ec2:CreateTags", "iam:PassRole"}


@pytest.fixture(scope="module")
def required() -> set[str]:
    missing = [str(p.relative_to(REPO)) for p in CODE if not p.exists()]
    if missing:
        pytest.fail(f"AWS code not found: {', '.join(missing)}")
    return required_actions(CODE)


def test_policy_allows_every_call_the_code_makes(required: set[str]) -> None:
    granted = granted_actions(IAM_TF, "daemon_api")
    where = {a: sorted(lines) for p in CODE for a, lines in called_actions(p).items()}
    missing = {a: where.get(a, ["implied by another call"]) for a in required - granted}
    assert not missing, f"add to daemon_api in {IAM_TF.relative_to(REPO)}: {missing}"


def test_policy_allows_nothing_the_code_does_not_call(required: set[str]) -> None:
    extra = granted_actions(IAM_TF, "daemon_api") - required
    assert not extra, (f"remove from daemon_api in {IAM_TF.relative_to(REPO)} (no code calls "
                       f"them): {sorted(extra)}")


def test_driver_declares_the_actions_it_calls() -> None:
    from provisioner.drivers.aws import AWS_DRIVER_ACTIONS

    # The driver's list leaves out iam:PassRole (granted on the worker role only).
    assert set(AWS_DRIVER_ACTIONS) | {"iam:PassRole"} == required_actions([DRIVER])


def test_no_wildcard_actions_and_no_wildcard_resources_for_mutations() -> None:
    for st in policy_statements(IAM_TF, "daemon_api"):
        actions = [a.strip('"') for a in st["actions"]]
        assert not any("*" in a for a in actions), actions
        resources = st["resources"]
        mutating = [a for a in actions if not a.split(":")[1].startswith(("Describe", "Get"))]
        if resources == ['"*"']:
            assert not mutating, f"{st.get('sid')}: {mutating} must name resources"
        if mutating and not {"ec2:CreateFleet"} >= set(mutating):
            assert st.get("condition") or all("${local.ec2_arn}:instance" not in str(r)
                                              for r in resources), st.get("sid")


def test_the_token_policy_reads_one_parameter_only() -> None:
    statements = policy_statements(IAM_TF, "read_ring_token")
    assert [s["actions"] for s in statements] == [['"ssm:GetParameter"']]
    assert statements[0]["resources"] == ["${aws_ssm_parameter.ring_token.arn}"]
