"""The wheel as a user gets it (issue 18): built from the tree, installed into a fresh virtualenv.

What is real: ``pip wheel`` builds the wheel from a copy of the tree (so build/ and
*.egg-info never land in the checkout); ``pip install --no-deps --no-index`` installs it into a
new virtualenv; ``provision``, ``python -m provisioner`` and ``python -m trainer`` run from
that venv, outside the checkout, so nothing is imported from the source tree. What is not:
the third-party dependencies are read from this test's own environment (a ``.pth`` line)
rather than downloaded again, and the optional cloud SDKs (boto3, the Google clients) are
hidden from the fresh venv by an import hook, as if the ``aws``/``gcp`` extras were not
installed: the CLI must still work, and say which extra a cloud command needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "pricing", "provisioner", "trainer", "examples")

HIDE_EXTRAS = '''\
"""Test hook: the optional cloud SDKs are not installed (spotring[aws], spotring[gcp])."""
import importlib.abc
import sys


class _Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("boto3", "botocore", "google"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hidden())
'''


def pip(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tree without build isolation (no index needed)."""
    root = tmp_path_factory.mktemp("pkg")
    src = root / "src"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"), str(src),
        cwd=root)
    (wheel,) = (root / "dist").glob("spotring-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(built: Path) -> Path:
    """A fresh virtualenv holding the wheel and nothing else of spotring's."""
    env = built.parent.parent / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    pip("--python", str(env / "bin" / "python"), "install", "--no-deps", "--no-index", "-q",
        str(built), cwd=env)
    site = Path(subprocess.run([str(env / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "zz_spotring_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(deps)))
    (site / "_hide_cloud_sdks.py").write_text(HIDE_EXTRAS)
    (site / "hide_cloud_sdks.pth").write_text("import _hide_cloud_sdks\n")
    return env


def run(venv: Path, *argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    argv = (str(venv / "bin" / argv[0]), *argv[1:])
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_wheel_holds_the_cli_the_examples_and_loose_dependencies(built):
    from setuptools import find_packages

    with zipfile.ZipFile(built) as whl:
        names = set(whl.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(whl.read(info).decode())
        entry = whl.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "provision = provisioner.cli:main" in entry
    for path in ("provisioner/__main__.py", "provisioner/clio.py", "trainer/__main__.py",
                 "spotring_examples/__init__.py", "spotring_examples/digits.py",
                 "spotring_examples/config.toml"):
        assert path in names, path
    # pyproject.toml lists the packages (examples/ is mapped): none of the tree's is missing
    for package in find_packages(str(REPO), include=["pricing*", "provisioner*", "trainer*"]):
        assert f"{package.replace('.', '/')}/__init__.py" in names, f"{package} not in the wheel"
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)
    requires = meta.get_all("Requires-Dist")
    torch = [r for r in requires if r.startswith("torch")]
    assert torch and all("==" not in r and ">=" in r for r in torch), torch
    sdks = [r for r in requires if r.startswith(("boto3", "google"))]
    assert sdks and all("extra ==" in r for r in sdks), sdks  # only through the extras
    assert {"aws", "gcp", "test"} <= set(meta.get_all("Provides-Extra"))


def test_installed_cli_runs_without_the_cloud_sdks(venv, tmp_path):
    version = run(venv, "provision", "--version", cwd=tmp_path)
    with open(REPO / "pyproject.toml", "rb") as f:
        expected = tomllib.load(f)["project"]["version"]
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"provision (spotring) {expected}"
    helped = run(venv, "provision", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "simulate" in helped.stdout, helped.stderr
    dash_m = run(venv, "python", "-m", "provisioner", "--help", cwd=tmp_path)
    assert dash_m.returncode == 0 and dash_m.stdout.startswith("usage: python -m provisioner")
    # the SDKs really are absent there, and the code comes from the installed wheel
    probe = run(venv, "python", "-c", "import provisioner, spotring_examples\n"
                "print(provisioner.__file__, spotring_examples.__file__)\n"
                "import boto3", cwd=tmp_path)
    assert "No module named 'boto3'" in probe.stderr
    assert str(REPO) not in probe.stdout and probe.stdout.count(str(venv)) == 2, probe.stdout


def test_installed_simulate_runs_without_the_cloud_sdks(venv, tmp_path, shared_data):
    trace = shared_data / "gcp_gpu_price_history" / "gcp_gpu_vm_prices_history.csv.gz"
    if not trace.is_file():
        pytest.skip(f"{trace} not found")
    done = run(venv, "provision", "simulate", "--trace", str(trace), "--work", "1e8",
               "--policy", "spotring", "on-demand", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert set(figures) == {"spotring", "on-demand"}
    assert figures["spotring"]["total_cost_usd"] < figures["on-demand"]["total_cost_usd"]


@pytest.mark.parametrize("source, extra", [("aws", "aws"), ("gcp", "gcp")])
def test_a_cloud_command_without_its_sdk_names_the_extra(venv, tmp_path, source, extra):
    done = run(venv, "provision", "prices", "--source", source, "--region", "r1", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'spotring[{extra}]'" in lines[0], done.stderr


def test_packaged_example_is_a_job_the_trainer_loads_by_name(venv, tmp_path):
    done = run(venv, "python", "-c", "from trainer.job import load_job\n"
               "job = load_job('spotring_examples.digits', 0)\n"
               "print(len(job), job.global_batch)", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1437", "64"]


@pytest.mark.slow
def test_installed_provision_run_trains_the_packaged_example(venv, tmp_path):
    """The local cloud from the installed wheel: workers are ``python -m trainer`` of the fresh
    venv training ``spotring_examples.digits`` (one epoch)."""
    (tmp_path / "c.toml").write_text('[job]\njob_file = "spotring_examples.digits"\n'
                                     '[fleet]\nmax_size = 2\nmarkets = ["spot"]\n')
    done = run(venv, "provision", "run", "--config", "c.toml", "--until-epochs", "1",
               "--speed", "120", "--no-dashboard", "--outages-per-hour", "0",
               "--workdir", "wd", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    # "the job finished", or on a busy machine "1 epochs done" seen first: either way the
    # fresh venv's workers joined a ring and trained samples of the packaged job
    end = re.search(r"stopped: (the job finished|1 epochs done)\. spend \$[\d.]+ for "
                    r"([\d,]+) samples.*?(\d+) joins", done.stdout)
    assert end, done.stdout
    assert int(end.group(2).replace(",", "")) > 0 and int(end.group(3)) >= 1, done.stdout
    assert (tmp_path / "wd" / "report" / "report.md").is_file()
