"""The config terraform/gcp writes onto its daemon VM is one the daemon accepts.

No Google provider is available here, so the module cannot be planned; its config template is
rendered by terraform itself (``templatefile`` in a provider-less root module) and parsed
with the daemon's settings model.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from provisioner.config import parse_settings
from tests.terraform.conftest import TF_ROOT, make_terraform

pytestmark = pytest.mark.terraform

STARTUP = "#!/bin/bash\necho \"it's <ok> & $HOME\" \\\n  --flag\n"


def test_the_gcp_daemon_config_template_renders_a_valid_config(tmp_path: Path) -> None:
    template = TF_ROOT / "gcp" / "templates" / "daemon-config.toml.tftpl"
    values = {"job_id": "gcp-job", "job_module": "examples.digits", "max_workers": 3,
              "project": "my-training-project", "zones": ["us-central1-a", "us-central1-b"],
              "network": "global/networks/default",
              "worker_image": "projects/debian-cloud/global/images/family/debian-12",
              "worker_disk_gb": 100, "service_account": "w@my-training-project.iam.gserviceaccount.com",
              "startup_script": STARTUP, "coordinator_host": "10.128.0.5", "coordinator_port": 29500,
              "token_path": "/etc/spotring/ring-token"}
    root = tmp_path / "render"
    root.mkdir()
    (root / "main.tf").write_text(
        f'output "config" {{\n  value = templatefile({json.dumps(str(template))}, '
        f'jsondecode(file("values.json")))\n}}\n')
    (root / "values.json").write_text(json.dumps(values))
    tf = make_terraform(tmp_path, "gcp")  # only for the isolated environment
    tf.workdir = root
    tf.run("init", "-input=false", "-no-color")
    tf.run("apply", "-auto-approve", "-input=false", "-no-color")
    text = tf.run("output", "-raw", "config").stdout
    settings = parse_settings(tomllib.loads(text), origin="terraform/gcp daemon config")
    assert settings.cloud.driver == "gcp" and settings.source.kind == "gcp"
    assert settings.gcp.project == "my-training-project"
    assert settings.gcp.zones == ["us-central1-a", "us-central1-b"]
    assert settings.gcp.startup_script == STARTUP
    assert settings.gcp.service_account == values["service_account"]
    assert (settings.daemon.coordinator_host, settings.daemon.coordinator_port) == ("10.128.0.5", 29500)
    # the daemon runs the ring's coordinator only when it has the token
    assert settings.daemon.token_path == "/etc/spotring/ring-token"
