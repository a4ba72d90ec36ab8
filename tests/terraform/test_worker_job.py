"""The worker bootstraps train the job the daemon launched them for: ``provision run --job``
reaches a worker as its launch's SPOTRING_JOB (an AWS tag, GCP metadata), read at boot; with
none, or with anything but a module name, the module's ``job_module``. The worker also says
its zone (``--zone``, from the metadata server), which the hybrid mode groups by.

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


def boot_choices(template: Path, tag: str | None, zone: str | None, tmp: Path) -> list[str]:
    """(job, zone) as the template's boot lines choose them, run in bash against a fake
    metadata server (``curl``: the tag or the zone by URL; None: not found, exit 22)."""
    text = template.read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("job=$(curl"))
    end = next(i for i, line in enumerate(lines) if line.startswith('[[ "$zone"'))
    snippet = ("\n".join(lines[start:end + 1]).replace("${job_module}", "examples.digits")
               .replace("$${", "${"))  # what terraform's templatefile renders
    assert "--job $job --zone $zone" in text
    fake = tmp / "bin" / "curl"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/bash\nurl=${@: -1}\n"
                    'case "$url" in *SPOTRING_JOB) v=$FAKE_TAG;; *zone) v=$FAKE_ZONE;; esac\n'
                    '[ "$v" = "<none>" ] && exit 22\nprintf %s "$v"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
           "FAKE_TAG": "<none>" if tag is None else tag,
           "FAKE_ZONE": "<none>" if zone is None else zone}
    out = subprocess.run(["bash", "-c", "set -euo pipefail\nimds_token=x\n" + snippet
                          + '\nprintf "%s\\n%s" "$job" "$zone"'], env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout.split("\n")


def choose_job(template: Path, tag: str | None, tmp: Path) -> str:
    return boot_choices(template, tag, "us-east-1a", tmp)[0]


@pytest.mark.parametrize(("template", "answer", "zone"), [
    (TEMPLATES[0], "us-east-1a", "us-east-1a"),
    (TEMPLATES[1], "projects/123456/zones/us-central1-a", "us-central1-a"),
    (TEMPLATES[0], None, "unknown"),  # no metadata: one zone of its own, not a failed boot
    (TEMPLATES[1], "x y; reboot", "unknown"),
], ids=["aws", "gcp", "aws-none", "gcp-odd"])
def test_the_worker_knows_its_zone(template: Path, answer: str | None, zone: str,
                                   tmp_path: Path) -> None:
    assert boot_choices(template, None, answer, tmp_path)[1] == zone


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
    assert len(exec_start) == 1 and re.search(r"--job \$job --zone \$zone ", exec_start[0])
