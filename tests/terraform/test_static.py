"""Static checks of terraform/: fmt, validate, `terraform test` with a mocked AWS provider,
and checkov (no failed check; every skip carries its reason inline)."""

from __future__ import annotations

import subprocess

import pytest

from tests.terraform.conftest import TF_ROOT, Terraform, terraform_binary

pytestmark = pytest.mark.terraform


def test_fmt_is_clean() -> None:
    proc = subprocess.run([terraform_binary(), "fmt", "-check", "-recursive", "-diff", "-no-color",
                           str(TF_ROOT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"run `terraform fmt -recursive terraform`:\n{proc.stdout}"


def test_aws_module_validates(aws_module: Terraform) -> None:
    out = aws_module.run("validate", "-no-color").stdout
    assert "The configuration is valid" in out


def test_aws_module_passes_its_terraform_tests_with_a_mock_provider(aws_module: Terraform) -> None:
    proc = aws_module.run("test", "-no-color", check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "0 failed" in proc.stdout and "passed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("module", ["aws", "gcp"])
def test_checkov_finds_no_failed_check(checkov_report: dict[str, dict[str, list]], module: str) -> None:
    report = checkov_report[module]
    assert len(report["passed_checks"]) >= 20, f"checkov checked almost nothing in terraform/{module}"
    failed = [f"{c['check_id']} {c['check_name']} at {c['resource']} "
              f"({c['file_path']}:{c['file_line_range'][0]})" for c in report["failed_checks"]]
    assert not failed, "checkov failures (fix, or skip inline with a reason):\n" + "\n".join(failed)


@pytest.mark.parametrize("module", ["aws", "gcp"])
def test_every_checkov_skip_is_justified(checkov_report: dict[str, dict[str, list]], module: str) -> None:
    skipped = checkov_report[module]["skipped_checks"]
    unjustified = [f"{c['check_id']} at {c['resource']}" for c in skipped
                   if len((c.get("check_result", {}).get("suppress_comment") or "").strip()) < 20]
    assert not unjustified, ("write the reason after the check id: "
                             "#checkov:skip=CKV_...:why this is safe\n" + "\n".join(unjustified))
