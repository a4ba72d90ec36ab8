"""The terraform modules' snapshot grants as the clouds' fakes enforce them.

Design: the tests that check who may write a ring's snapshots use the grants *the modules
declare*, not a copy: :func:`aws_policy` turns a ``data "aws_iam_policy_document"`` of
``terraform/aws/snapshots.tf`` into the IAM JSON moto evaluates (the bucket ARN and the job's
prefix substituted), and :func:`gcs_create_prefixes` reads the object prefixes of the
workers' conditioned ``objectCreator`` in ``terraform/gcp/artifacts.tf``.
:func:`enforce_iam` makes moto check every later request against its IAM users' policies
(in process: the mocks and a ``ThreadedMotoServer`` alike).

Rule for callers: substitute only through these functions; a reference this module does not
know fails loudly (a policy the test cannot evaluate must not pass as allowed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.terraform.conftest import TF_ROOT
from tests.terraform.iam_scan import _unquote, policy_statements

SNAPSHOTS_TF = TF_ROOT / "aws" / "snapshots.tf"
GCP_ARTIFACTS_TF = TF_ROOT / "gcp" / "artifacts.tf"


def _subst(text: str, bucket: str, job: str) -> str:
    out = (_unquote(text).replace("${aws_s3_bucket.artifacts.arn}", f"arn:aws:s3:::{bucket}")
           .replace("${local.snapshot_job_prefix}", f"snapshots/{job}"))
    if "${" in out:
        raise ValueError(f"cannot evaluate {text!r}: extend tests/terraform/snapshot_grants.py")
    return out


#: moto 5.2.6 authorises an S3 ListObjectsV2 request as the IAM action "s3:ListObjectsV2";
#: AWS authorises it as "s3:ListBucket" (what the modules grant; there is no IAM action
#: s3:ListObjectsV2). The policy moto evaluates grants moto's name beside AWS's, so the
#: tests check the modules' grant and not moto's spelling (moto 5.2.5 and before used
#: s3:ListBucket, and an extra action is inert there).
MOTO_ACTION_ALIASES = {"s3:ListBucket": ("s3:ListObjectsV2",)}


def aws_policy(document: str, bucket: str, job: str) -> str:
    """``document`` of terraform/aws/snapshots.tf as IAM policy JSON for ``bucket``/``job``
    (with :data:`MOTO_ACTION_ALIASES` beside the actions moto spells otherwise)."""
    statements: list[dict[str, Any]] = []
    for st in policy_statements(SNAPSHOTS_TF, document):
        actions = [_unquote(a) for a in st["actions"]]
        out: dict[str, Any] = {
            "Effect": _unquote(st.get("effect", '"Allow"')),
            "Action": actions + [m for a in actions for m in MOTO_ACTION_ALIASES.get(a, ())],
            "Resource": [_subst(r, bucket, job) for r in st["resources"]]}
        for c in st.get("condition", []):
            out.setdefault("Condition", {}).setdefault(_unquote(c["test"]), {})[
                _unquote(c["variable"])] = [_subst(v, bucket, job) for v in c["values"]]
        statements.append(out)
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def iam_user(iam: Any, name: str, policy: str) -> dict[str, str]:
    """An IAM user holding ``policy``; returns its keys as AWS_* environment values."""
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="spotring-snapshots", PolicyDocument=policy)
    k = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": k["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": k["SecretAccessKey"],
            "AWS_DEFAULT_REGION": "us-east-1"}


def act_as(monkeypatch: pytest.MonkeyPatch, keys: dict[str, str]) -> None:
    """This process (and the processes it starts) from now on holds ``keys`` only, as a host
    with that role would: no session token, and boto3's cached default session dropped."""
    import boto3

    for k in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    for k, v in keys.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)


def enforce_iam(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on moto authorises every request against its IAM users' policies."""
    from moto import settings

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)


def gcs_create_prefixes(job: str) -> list[str]:
    """The object prefixes the workers' conditioned objectCreator (``worker-ship``) allows,
    read from its IAM condition in terraform/gcp/artifacts.tf."""
    text = GCP_ARTIFACTS_TF.read_text()
    m = re.search(r'worker-ship = \{.*?where\s*=\s*\[([^\]]*)\]', text, re.S)
    if not m:
        raise ValueError(f"{GCP_ARTIFACTS_TF}: no worker-ship grant with a `where` list")
    out = []
    for raw in re.findall(r'"([^"]*)"', m.group(1)):
        p = raw.replace("${local.artifacts_prefix}", "artifacts").replace(
            "${local.snapshot_job_prefix}", f"snapshots/{job}")
        if "${" in p:
            raise ValueError(f"cannot evaluate {raw!r}: extend tests/terraform/snapshot_grants.py")
        out.append(p)
    return out
