"""Fake cloud instances that boot the rendered terraform boot scripts for real.

Design: a fake instance is a process tree of its own: ``unshare`` gives it a mount namespace
(its own /etc, a copy of this host's, and empty /opt and /var/lib, so ``useradd``, the token
file and the systemd units land in a temporary root, never in the real /etc) and a PID
namespace (killing its pid 1 kills everything it started, as a VM's processes go with the
VM). Its environment is a VM's: ``PATH`` shims (tests/fakes/boot_shims: ``systemctl`` runs a
unit's ExecStart as its User=, ``journalctl`` reads its output, ``aws``/``gcloud`` read the
token and the wheel from the moto server and the GCP fakes and ship the log chunks there,
``nvidia-smi`` lists fake GPUs), and its metadata service through
``http_proxy`` (:mod:`tests.fakes.metadata`, answering from the instance's moto tags or
fake-GCP metadata). Nothing of the boot script is changed: it is rendered by terraform's own
``templatefile`` (:func:`render`) from terraform/aws or terraform/gcp and run by bash as root.

The *image* (:class:`Image`) is this host's Python bind-mounted at /opt/python, its
site-packages a folder of links to this test environment's packages (torch, numpy, sklearn:
what a GPU image ships) minus spotring's own, plus the job module of the test; the boot
script's venv sees them with ``--system-site-packages`` and installs spotring from the wheel
the daemon shipped, so the workers run the wheel, not the checkout.

:class:`AwsInstances` and :class:`GcpInstances` watch the emulated cloud (moto, the GCP fake)
from a thread: an instance of the job that appears is booted (the launch template's user data,
or the VM's ``startup-script``); one that is gone (terminated, deleted, preempted) is killed.

Rule for callers: needs root (mount and PID namespaces) and terraform; check
:func:`unavailable` and skip with its reason. Use the runners as context managers; they kill
every instance they booted on exit.
"""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tests.fakes.metadata import AwsView, GcpView, MetadataServer

REPO = Path(__file__).resolve().parents[2]
SHIMS = Path(__file__).with_name("boot_shims")
TEMPLATES = {"aws": REPO / "terraform/aws/templates/worker-user-data.sh.tftpl",
             "gcp": REPO / "terraform/gcp/templates/worker-startup.sh.tftpl"}
#: The image's Python, as the boot script is told (the module's worker_python).
IMAGE_PYTHON = "/opt/python/bin/python3"

#: The job of the fake instances' workers: a small regression whose training steps take a
#: little while (so a notice finds the ring mid-run), with plenty of epochs.
BOOT_JOB = '''"""The job of the boot tests' fake instances (written into the fake image)."""
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer.job import Job


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(0.05)
        return self.body(x)


def make_job(seed: int = 0) -> Job:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 8, generator=g)
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(2048, 1, generator=g)
    model = Net()
    return Job(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
               loss_fn=nn.functional.mse_loss, train_set=TensorDataset(x, y),
               global_batch=32, epochs=1000, loader_workers=0)
'''
BOOT_JOB_MODULE = "spotring_boot_job"


def unavailable() -> str | None:
    """Why fake instances cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "fake instances need root (mount and PID namespaces, useradd in their own /etc)"
    if shutil.which("terraform") is None:
        return "terraform not installed (it renders the boot scripts)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
                            "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make mount and PID namespaces here: {probe.stderr.strip()[:120]}"
    return None


# -- the image -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """A worker image: ``python_home`` is mounted at /opt/python, ``site`` as its
    site-packages."""

    python_home: Path
    site: Path

    @property
    def site_mount(self) -> str:
        lib = next((self.python_home / "lib").glob("python3.*"))
        return f"/opt/python/lib/{lib.name}/site-packages"


def make_image(python_home: Path | None = None, modules: Mapping[str, str] | None = None
               ) -> Image:
    """An image of ``python_home`` (default: this environment's base Python) whose packages are
    this environment's, minus spotring's own, plus ``modules`` (name -> source). The folder is
    made under /tmp readable by the workers' user (``image.site``; removed at exit at the
    latest)."""
    import sysconfig

    home = python_home or Path(sys.base_prefix)
    here = Path(sysconfig.get_paths()["purelib"])
    folder = Path(tempfile.mkdtemp(prefix="spotring-image-", dir="/tmp"))
    atexit.register(shutil.rmtree, folder, True)  # also when a test stops half way
    folder.chmod(0o755)
    skip = ("spotring", "__editable__", "_sandboxing", "distutils-precedence")
    for entry in here.iterdir():
        if not entry.name.startswith(skip) and entry.name not in ("__pycache__",):
            (folder / entry.name).symlink_to(entry)
    for name, source in (modules or {BOOT_JOB_MODULE: BOOT_JOB}).items():
        (folder / f"{name}.py").write_text(source)
    return Image(home, folder)


@functools.lru_cache(maxsize=1)
def test_wheel() -> tuple[Path, str]:
    """The wheel of this checkout (built once per process into a temporary folder) and its
    SHA-256: what a daemon run from this checkout ships (provisioner/drivers/artifacts.py)."""
    from provisioner.drivers.artifacts import build_wheel, sha256_of, source_tree

    src = source_tree()
    assert src is not None, "the tests run from a checkout"
    out = Path(tempfile.mkdtemp(prefix="spotring-test-wheel-"))
    atexit.register(shutil.rmtree, out, True)
    wheel = build_wheel(src, out)
    return wheel, sha256_of(wheel)


# -- rendering -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _render(template: str, values_json: str) -> str:
    with tempfile.TemporaryDirectory(prefix="spotring-render-") as tmp:
        root = Path(tmp)
        (root / "main.tf").write_text(
            f'output "script" {{\n  value = templatefile({json.dumps(template)}, '
            f'jsondecode(file("values.json")))\n}}\n')
        (root / "values.json").write_text(values_json)
        (root / "terraformrc").write_text("# spotring tests: no user CLI config\n")
        env = dict(os.environ, TF_CLI_CONFIG_FILE=str(root / "terraformrc"),
                   TF_DATA_DIR=str(root / "tfdata"), TF_IN_AUTOMATION="1", TF_INPUT="0",
                   CHECKPOINT_DISABLE="1")
        for args in (["init", "-input=false", "-no-color"],
                     ["apply", "-auto-approve", "-input=false", "-no-color"]):
            subprocess.run(["terraform", *args], cwd=root, env=env, check=True,
                           capture_output=True, timeout=120)
        return subprocess.run(["terraform", "output", "-raw", "script"], cwd=root, env=env,
                              check=True, capture_output=True, text=True, timeout=60).stdout


def render(cloud: str, values: Mapping[str, str]) -> str:
    """The worker boot script of terraform/``cloud`` rendered by terraform's ``templatefile``
    from ``values`` (the map the module passes it)."""
    return _render(str(TEMPLATES[cloud]), json.dumps(dict(values), sort_keys=True))


# -- one instance --------------------------------------------------------------------------------

@dataclass
class Sandbox:
    """One fake instance booting ``script`` (see the module docstring)."""

    root: Path
    script: str
    image: Image
    env: dict[str, str]
    gpus: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> "Sandbox":
        r = self.root
        for sub in ("opt", "var-lib", "tmp", "shims", "journal", "units"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "opt").chmod(0o755)
        (r / "var-lib").chmod(0o755)
        subprocess.run(["cp", "-a", "/etc", str(r / "etc")], check=True)
        # the image's linker finds its Python's library (ldconfig runs inside, on this /etc)
        (r / "etc" / "ld.so.conf.d").mkdir(exist_ok=True)
        (r / "etc" / "ld.so.conf.d" / "opt-python.conf").write_text("/opt/python/lib\n")
        for name, target in (("systemctl", "systemctl.py"), ("aws", "aws.py"),
                             ("gcloud", "gcloud.py"), ("nvidia-smi", "nvidia_smi.py"),
                             ("journalctl", "journalctl.py")):
            shim = r / "shims" / name
            shim.write_text(f'#!/bin/sh\nexec {sys.executable} {SHIMS / target} "$@"\n')
            shim.chmod(0o755)
        (r / "boot.sh").write_text(self.script)
        env = {"PATH": f"{r / 'shims'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:"
                       f"/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "TMPDIR": str(r / "tmp"),
               "SPOTRING_SANDBOX": str(r), "SPOTRING_FAKE_GPUS": str(self.gpus),
               "no_proxy": "127.0.0.1,localhost", **self.env}
        spec = {"mounts": [[str(r / "etc"), "/etc"], [str(r / "opt"), "/opt"],
                           [str(r / "var-lib"), "/var/lib"],
                           [str(self.image.python_home), "/opt/python"],
                           [str(self.image.site), self.image.site_mount]],
                "script": str(r / "boot.sh"), "log": str(r / "boot.log"),
                "rc": str(r / "boot.rc"), "env": env}
        (r / "spec.json").write_text(json.dumps(spec))
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
             "--kill-child=SIGKILL", "--mount-proc", sys.executable,
             str(SHIMS / "instance_init.py"), str(r / "spec.json")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, start_new_session=True)
        return self

    def kill(self) -> None:
        """The VM vanishes: every process of the instance is killed at once."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def rc(self) -> int | None:
        """The boot script's exit code (None while it runs)."""
        try:
            return int((self.root / "boot.rc").read_text())
        except (OSError, ValueError):
            return None

    def log(self) -> str:
        """The instance's boot log (what cloud-init or google-startup-scripts keep)."""
        try:
            return (self.root / "boot.log").read_text(errors="replace")
        except OSError:
            return ""

    def journal(self, unit: str) -> str:
        try:
            return (self.root / "journal" / f"{unit}.log").read_text(errors="replace")
        except OSError:
            return ""

    def units(self) -> dict[str, dict[str, Any]]:
        """unit -> {"runs": [{pid, rc, started}]} of the units systemctl started."""
        out = {}
        for p in (self.root / "units").glob("*.service.json"):
            try:
                out[p.name.removesuffix(".json")] = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
        return out

    def unit_file(self, name: str) -> str:
        return (self.root / "etc" / "systemd" / "system" / name).read_text()


# -- the fleets --------------------------------------------------------------------------------

class _Instances:
    """Boots a :class:`Sandbox` for each instance of a job that appears in an emulated cloud
    and kills it when the instance is gone (a thread polls every 0.2 s)."""

    def __init__(self, base: Path, image: Image, *, gpus: int = 0,
                 env: Mapping[str, str] | None = None) -> None:
        self.base, self.image, self.gpus = base, image, gpus
        self.env = dict(env or {})  # added to every boot's (e.g. PIP_FIND_LINKS)
        self.boxes: dict[str, Sandbox] = {}
        self.servers: dict[str, MetadataServer] = {}
        self.gone: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-instances")
        self.errors: list[str] = []

    def _alive(self) -> dict[str, Any]:
        raise NotImplementedError

    def _boot(self, iid: str, raw: Any) -> tuple[str, MetadataServer, dict[str, str]]:
        raise NotImplementedError

    def __enter__(self) -> "_Instances":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            for box in self.boxes.values():
                box.kill()
            for server in self.servers.values():
                server.__exit__(None, None, None)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a test reads .errors
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def poll(self) -> None:
        alive = self._alive()
        with self._lock:
            for iid, raw in alive.items():
                if iid not in self.boxes and iid not in self.gone:
                    script, server, env = self._boot(iid, raw)
                    self.servers[iid] = server
                    root = self.base / hashlib.sha1(iid.encode()).hexdigest()[:12]
                    self.boxes[iid] = Sandbox(root, script, self.image, {**env, **self.env},
                                              gpus=self.gpus).start()
            for iid, box in self.boxes.items():
                if iid not in alive and iid not in self.gone:
                    self.gone.add(iid)
                    box.kill()

    def box(self, iid: str) -> Sandbox | None:
        with self._lock:
            return self.boxes.get(iid)

    def all_boxes(self) -> dict[str, Sandbox]:
        """The boxes booted so far, a copy: the poll thread adds to ``boxes`` while a test
        reads it (iterating it directly raised "dictionary changed size during iteration"
        in a fresh-clone run, when the daemon's second instance appeared mid-read)."""
        with self._lock:
            return dict(self.boxes)


class AwsInstances(_Instances):
    """The moto instances of ``job`` boot their launch template's user data."""

    def __init__(self, world: Any, job: str, base: Path, image: Image, **kw: Any) -> None:
        super().__init__(base, image, **kw)
        self.world, self.job = world, job
        self.views: dict[str, AwsView] = {}

    def _alive(self) -> dict[str, Any]:
        return {i["InstanceId"]: i for i in self.world.instances(self.job)}

    def user_data(self) -> str:
        from tests.fakes.aws_world import TEMPLATE

        versions = self.world.ec2.describe_launch_template_versions(
            LaunchTemplateName=TEMPLATE, Versions=["$Default"])["LaunchTemplateVersions"]
        return base64.b64decode(versions[0]["LaunchTemplateData"]["UserData"]).decode()

    def _boot(self, iid: str, raw: Any) -> tuple[str, MetadataServer, dict[str, str]]:
        view = AwsView(self.world.ec2, iid)
        self.views[iid] = view
        server = MetadataServer(view).__enter__()
        env = {"http_proxy": server.endpoint, "AWS_ENDPOINT_URL": self.world.endpoint,
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": self.world.ec2.meta.region_name}
        return self.user_data(), server, env


class GcpInstances(_Instances):
    """The fake-GCP VMs of ``job`` boot their ``startup-script`` metadata."""

    def __init__(self, world: Any, job: str, base: Path, image: Image, *, storage: str,
                 **kw: Any) -> None:
        super().__init__(base, image, **kw)
        self.world, self.job, self.storage = world, job, storage

    def _alive(self) -> dict[str, Any]:
        return self.world.instances(self.job)

    def _boot(self, iid: str, raw: Any) -> tuple[str, MetadataServer, dict[str, str]]:
        from tests.fakes.gcp_world import PROJECT

        zone, _, name = iid.partition("/")
        server = MetadataServer(GcpView(self.world.fake, PROJECT, zone, name)).__enter__()
        items = {i["key"]: i["value"] for i in raw.get("metadata", {}).get("items", [])}
        env = {"http_proxy": server.endpoint,
               "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": self.world.endpoint + "/",
               "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": self.storage + "/"}
        return items.get("startup-script", "#!/bin/bash\nexit 0\n"), server, env


def wait_rc(box: Sandbox, timeout_s: float, step_s: float = 0.1) -> int | None:
    """The boot script's exit code once it ended (None after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if box.rc is not None:
            return box.rc
        time.sleep(step_s)
    return box.rc

