"""Fixtures for the Terraform checks: the terraform binary, the AWS provider mirror, checkov.

Design: every check runs on a copy of a module in a tmp dir with its own ``TF_DATA_DIR`` and
an empty CLI config, so the repository never gets a ``.terraform`` dir, a lock file or state.
Where terraform, the provider mirror or checkov's virtualenv is absent, the tests that need it
are skipped with a message that says what to install; they never fail for that.

Rule for tests: run terraform only through :class:`Terraform` (it sets the environment).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TF_ROOT = REPO / "terraform"
PLUGIN_DIR = Path(os.environ.get("SPOTRING_TF_PLUGIN_DIR", "/opt/tf-plugins"))
AWS_PROVIDER = PLUGIN_DIR / "registry.terraform.io" / "hashicorp" / "aws"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"


@dataclass
class Terraform:
    """``terraform`` in one working directory, isolated from the user's CLI config."""

    binary: str
    workdir: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
        """Run ``terraform ARGS`` (no colour, no input); raise AssertionError with the output
        when ``check`` and the exit code is not 0."""
        proc = subprocess.run([self.binary, *args], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"terraform {' '.join(args)} exited {proc.returncode}\n"
                                 f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
        return proc

    def init(self) -> None:
        """Init against the local provider mirror (the registry is not reachable)."""
        self.run("init", "-input=false", "-no-color", f"-plugin-dir={PLUGIN_DIR}")

    def outputs(self) -> dict:
        return json.loads(self.run("output", "-json", "-no-color").stdout)


def terraform_binary() -> str:
    found = shutil.which("terraform")
    if found is None:
        pytest.skip("terraform not installed (install terraform >= 1.10 to run the module checks)")
    return found


def require_aws_mirror() -> None:
    if not AWS_PROVIDER.is_dir():
        pytest.skip(f"no AWS provider mirror at {AWS_PROVIDER} (set SPOTRING_TF_PLUGIN_DIR to a "
                    f"directory laid out like `terraform providers mirror` output)")


def make_terraform(tmp: Path, module: str) -> Terraform:
    """A copy of ``terraform/<module>`` in ``tmp`` with an isolated terraform environment."""
    binary = terraform_binary()
    workdir = tmp / module
    shutil.copytree(TF_ROOT / module, workdir)
    cli_config = tmp / "terraformrc"
    cli_config.write_text("# spotring tests: no user CLI config\n")
    env = dict(os.environ, TF_CLI_CONFIG_FILE=str(cli_config), TF_DATA_DIR=str(tmp / "tfdata"),
               TF_IN_AUTOMATION="1", TF_INPUT="0", CHECKPOINT_DISABLE="1")
    env.pop("TF_LOG", None)
    return Terraform(binary, workdir, env)


@pytest.fixture(scope="session")
def aws_module(tmp_path_factory: pytest.TempPathFactory) -> Terraform:
    """terraform/aws copied and initialised once per session (validate and terraform test)."""
    tf = make_terraform(tmp_path_factory.mktemp("tf-aws"), "aws")
    require_aws_mirror()
    tf.init()
    return tf


@pytest.fixture(scope="session")
def checkov_report() -> dict[str, dict[str, list]]:
    """checkov's results per module (``aws``, ``gcp``): passed, failed and skipped checks.

    One scan of terraform/ (checkov's start-up dominates its run time), split by file path.
    """
    if not CHECKOV.exists():
        pytest.skip(f"checkov not installed at {CHECKOV} (./dev setup creates .venv-checkov)")
    proc = subprocess.run([str(CHECKOV), "-d", str(TF_ROOT), "--framework", "terraform",
                           "-o", "json", "--compact", "--skip-download"],
                          capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, BC_SKIP_MAPPING="TRUE"))
    if not proc.stdout.strip():
        raise AssertionError(f"checkov produced no report: {proc.stderr[-3000:]}")
    data = json.loads(proc.stdout)
    data = data[0] if isinstance(data, list) else data
    assert data["summary"]["parsing_errors"] == 0, data["results"].get("parsing_errors")
    report: dict[str, dict[str, list]] = {}
    for module in ("aws", "gcp"):
        report[module] = {
            kind: [c for c in data["results"].get(kind, [])
                   if c["file_path"].lstrip("/").startswith(f"{module}/")]
            for kind in ("passed_checks", "failed_checks", "skipped_checks")}
    return report
