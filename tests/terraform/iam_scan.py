"""Which IAM actions a Python module's boto3 calls need, and which a Terraform policy grants.

Design: calls are found with :mod:`ast` (``client.describe_subnets(...)``,
``client.get_paginator("describe_instances")``) and named through botocore's own service
models, so a method counts only if it is a real operation of EC2, SQS, S3 or the Price List API;
a method name that two services share is resolved by the receiver's text (``self._sqs``,
``client("ec2", ...)``). IAM actions that an operation needs beyond its own name (a launch that
tags and passes a role) come from :data:`IMPLIED`, as documented by AWS.

Rule: when the code starts calling a new operation, the policy in terraform/aws/iam.tf must
grant it, and when it stops, the grant goes (tests/terraform/test_iam_parity.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import hcl2

SERVICES = ("ec2", "sqs", "pricing", "s3")

#: Operations whose IAM action has another name (batch calls are authorised per entry).
ACTION_NAME = {
    "sqs:DeleteMessageBatch": "sqs:DeleteMessage",
    "sqs:SendMessageBatch": "sqs:SendMessage",
    "sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
    "s3:HeadObject": "s3:GetObject",  # S3 authorises HEAD as a read of the object
    "s3:ListObjectsV2": "s3:ListBucket",  # a listing is authorised on the bucket
}

#: Further actions a call needs (AWS EC2 docs: "Grant permission to tag resources during
#: creation"; "EC2 Fleet prerequisites": CreateFleet launches with the caller's RunInstances
#: permission; an instance profile in the launch template needs iam:PassRole).
IMPLIED = {
    "ec2:RunInstances": frozenset({"ec2:CreateTags", "iam:PassRole"}),
    "ec2:CreateFleet": frozenset({"ec2:RunInstances", "ec2:CreateTags", "iam:PassRole"}),
}


@functools.cache
def operations(service: str) -> dict[str, str]:
    """snake_case method name -> IAM-style action (``ec2:DescribeSubnets``) for a service."""
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model(service)
    prefix = model.signing_name if service != "pricing" else "pricing"
    return {xform_name(op): f"{prefix}:{op}" for op in model.operation_names}


def _service_for(method: str, receiver: str, where: str) -> str | None:
    found = [s for s in SERVICES if method in operations(s)]
    if len(found) <= 1:
        return found[0] if found else None
    named = [s for s in found if s in receiver]
    if len(named) != 1:
        raise ValueError(f"{where}: {receiver}.{method} is an operation of {', '.join(found)}; "
                         f"name the client after its service (e.g. self._{found[0]})")
    return named[0]


def called_actions(path: Path) -> dict[str, set[str]]:
    """IAM actions of the boto3 operations called in ``path`` -> the lines calling them."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        if (method == "get_paginator" and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            method = node.args[0].value
        where = f"{path.name}:{node.lineno}"
        service = _service_for(method, ast.unparse(node.func.value), where)
        if service is None:
            continue
        action = operations(service)[method]
        action = ACTION_NAME.get(action, action)
        out.setdefault(action, set()).add(where)
    return out


def required_actions(paths: list[Path]) -> set[str]:
    """Every IAM action the code in ``paths`` needs, implied ones included."""
    called: set[str] = set()
    for p in paths:
        called |= set(called_actions(p))
    return called.union(*(IMPLIED.get(a, frozenset()) for a in called))


def _unquote(value: object) -> str:
    text = str(value)
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def policy_statements(tf_file: Path, document: str) -> list[dict]:
    """The statements of ``data "aws_iam_policy_document" "<document>"`` in ``tf_file``."""
    with tf_file.open(encoding="utf-8") as fh:
        parsed = hcl2.load(fh)
    for block in parsed.get("data", []):
        for kind, docs in block.items():
            if _unquote(kind) != "aws_iam_policy_document":
                continue
            for name, body in docs.items():
                if _unquote(name) == document:
                    return list(body.get("statement", []))
    raise LookupError(f"{tf_file}: no data \"aws_iam_policy_document\" \"{document}\"")


def granted_actions(tf_file: Path, document: str) -> set[str]:
    """The actions an Allow policy document grants (literal action lists only)."""
    actions: set[str] = set()
    for st in policy_statements(tf_file, document):
        if _unquote(st.get("effect", '"Allow"')) != "Allow":
            continue
        raw = st.get("actions", [])
        if isinstance(raw, str):
            raise ValueError(f"{tf_file}: {document}: actions must be a literal list, got {raw}")
        actions |= {_unquote(a) for a in raw}
    return actions
