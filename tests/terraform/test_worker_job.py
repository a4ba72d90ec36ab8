"""The worker bootstraps train the job the daemon launched them for: ``provision run --job``
reaches a worker as its launch's SPOTRING_JOB (an AWS tag, GCP metadata), read at boot; with
none, or with anything but a module name, the module's ``job_module``.

The job-choosing lines of each template are run for real in bash, with ``curl`` replaced by a
script that plays the metadata server."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = [ROOT / "terraform/aws/templates/worker-user-data.sh.tftpl",
             ROOT / "terraform/gcp/templates/worker-startup.sh.tftpl"]


def choose_job(template: Path, tag: str | None, tmp: Path) -> str:
    text = template.read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("job=$(curl"))
    snippet = "\n".join(lines[start:start + 2]).replace("${job_module}", "examples.digits")
    assert "--job $job" in text
    fake = tmp / "bin" / "curl"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/bash\n" + ('printf %s "$FAKE_TAG"\n' if tag is not None
                                         else "exit 22\n"))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "FAKE_TAG": tag or ""}
    out = subprocess.run(["bash", "-c", 'set -euo pipefail\nimds_token=x\n' + snippet
                          + '\nprintf %s "$job"'], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.parts[-3])
@pytest.mark.parametrize(("tag", "job"), [
    ("users_pkg.jobs.resnet", "users_pkg.jobs.resnet"),  # the daemon's --job
    (None, "examples.digits"),  # no tag: the module's job_module
    ("x; touch /tmp/pwned", "examples.digits"),  # not a module name: never in the unit
    ("", "examples.digits"),
])
def test_the_launch_names_the_job(template: Path, tag: str | None, job: str,
                                  tmp_path: Path) -> None:
    assert choose_job(template, tag, tmp_path) == job


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.parts[-3])
def test_the_unit_starts_the_chosen_job(template: Path) -> None:
    exec_start = [line for line in template.read_text().splitlines()
                  if line.startswith("ExecStart=")]
    assert len(exec_start) == 1 and re.search(r"--job \$job ", exec_start[0])
