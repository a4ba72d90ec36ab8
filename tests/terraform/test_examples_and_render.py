"""terraform/examples/*.tfvars match their modules' variables, and terraform/render_config.py
turns `terraform output -json` into a config the daemon accepts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hcl2
import pytest

from provisioner.config import parse_settings
from tests.terraform.conftest import TF_ROOT

sys.path.insert(0, str(TF_ROOT))
import render_config  # noqa: E402  (a script beside the modules, not a package)

sys.path.remove(str(TF_ROOT))


def _variables(module: str) -> dict[str, dict]:
    with (TF_ROOT / module / "variables.tf").open() as fh:
        blocks = hcl2.load(fh)["variable"]
    return {name.strip('"'): body for block in blocks for name, body in block.items()}


@pytest.mark.parametrize("module", ["aws", "gcp"])
def test_example_tfvars_set_only_declared_variables_and_every_required_one(module: str) -> None:
    with (TF_ROOT / "examples" / f"{module}.tfvars").open() as fh:
        given = {k for k in hcl2.load(fh) if not k.startswith("__")}
    declared = _variables(module)
    assert given <= set(declared), f"unknown variables: {sorted(given - set(declared))}"
    required = {n for n, body in declared.items() if "default" not in body}
    # The ring token is ephemeral: it comes from TF_VAR_ring_token, never from a file.
    assert required - given == {"ring_token"}


@pytest.mark.parametrize("module", ["aws", "gcp"])
def test_every_variable_is_described_and_inputs_are_validated(module: str) -> None:
    declared = _variables(module)
    undocumented = [n for n, body in declared.items() if len(body.get("description", "")) < 15]
    assert not undocumented
    validated = [n for n, body in declared.items() if "validation" in body]
    assert len(validated) >= len(declared) // 2, f"only {validated} have validation blocks"


OUTPUTS = {"daemon_settings": {"sensitive": False, "value": {
    "job_id": "e2e", "job_file": "examples.digits", "region": "us-east-1",
    "price_regions": ["us-east-1"], "max_workers": 2, "launch_template_id": "lt-0123456789abcdef0",
    "queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/spotring-e2e-notices",
    "subnets": {"us-east-1a": "subnet-0123456789abcdef0", "use1-az1": "subnet-0123456789abcdef0"},
    "coordinator_host": "10.0.1.10", "coordinator_port": 29500, "token_path": "/etc/spotring/t",
    "state_path": "/var/lib/spotring/state.sqlite",
    "artifacts": "s3://spotring-e2e-artifacts-x/artifacts/",
    "wheel": "/opt/spotring-dist/spotring-0.1.0-py3-none-any.whl",
    "snapshot_url": "s3://spotring-e2e-artifacts-x/snapshots"}}}


def test_rendered_config_is_what_the_daemon_reads() -> None:
    import tomllib

    text = render_config.to_toml(render_config.render(OUTPUTS, endpoint_url="http://127.0.0.1:5000"))
    settings = parse_settings(tomllib.loads(text))
    assert settings.cloud.driver == "aws" and settings.source.kind == "aws"
    assert settings.aws.launch_template_id == "lt-0123456789abcdef0"
    assert settings.aws.subnets["use1-az1"] == "subnet-0123456789abcdef0"
    assert settings.aws.endpoint_url == "http://127.0.0.1:5000"
    assert (settings.daemon.coordinator_host, settings.daemon.coordinator_port) == ("10.0.1.10", 29500)
    assert settings.daemon.token_path == "/etc/spotring/t"  # the daemon runs the coordinator
    assert settings.fleet.max_size == 2 and settings.job.id == "e2e"
    # the run's artifacts (the daemon ships its wheel there); the host's wheel path is not
    # taken from the outputs
    assert settings.cloud.artifacts == "s3://spotring-e2e-artifacts-x/artifacts/"
    assert settings.cloud.wheel is None
    # the ring's snapshots in the module's bucket, where the workers may put them while the
    # daemon is away (snapshots.tf grants them that)
    assert settings.snapshot.url == "s3://spotring-e2e-artifacts-x/snapshots"
    assert settings.snapshot.direct is True
    assert settings.snapshot.endpoint_url == "http://127.0.0.1:5000"  # moto serves S3 too


def test_incomplete_outputs_name_the_missing_field(tmp_path: Path, capsys) -> None:
    broken = {"daemon_settings": {"value": {k: v for k, v in OUTPUTS["daemon_settings"]["value"].items()
                                            if k != "queue_url"}}}
    with pytest.raises(render_config.RenderError, match="queue_url"):
        render_config.render(broken)
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(broken))
    assert render_config.main([str(path)]) == 2
    assert "queue_url" in capsys.readouterr().err


def test_a_config_the_daemon_would_reject_is_not_printed(tmp_path: Path, capsys) -> None:
    bad = json.loads(json.dumps(OUTPUTS))
    bad["daemon_settings"]["value"]["job_id"] = "Not A Job Id"
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(bad))
    assert render_config.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "job.id" in captured.err


def test_the_module_template_and_the_script_agree_on_the_keys() -> None:
    template = (TF_ROOT / "aws" / "templates" / "daemon-config.toml.tftpl").read_text()
    rendered = render_config.to_toml(render_config.render(OUTPUTS))
    keys = {line.split("=")[0].strip() for line in rendered.splitlines()
            if "=" in line and not line.startswith('"')}
    for key in keys:
        assert f"\n{key} = " in template, f"{key} is rendered by the script but not by the module"
