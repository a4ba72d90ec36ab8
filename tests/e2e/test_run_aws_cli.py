"""``provision run`` itself, as a process, on the AWS driver against a moto server over HTTP:
it launches the fleet; a second daemon on the same state is refused; SIGKILLed and started
again from another directory (the config's relative ``state_path`` is read from the config
file's folder) it adopts the fleet (no orphan, no duplicate, nothing terminated); an
interruption through EventBridge -> SQS is replaced; SIGTERM with ``--on-exit terminate``
drains, exits 130 (as Ctrl-C) and leaves nothing running. The job is a file of the user's
(``--job .../src/train.py``, no ``--code``): its folder travels with every launch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

pytest.importorskip("moto.server")

from tests.fakes.aws_world import AwsWorld  # noqa: E402

pytestmark = pytest.mark.slow
JOB = "cli-aws"
from tests.conftest import REPO  # noqa: E402
from tests.fakes.wait import BOOT_S, wait_for  # noqa: E402


@pytest.fixture(scope="module")
def world():
    w = AwsWorld()
    yield w
    w.close()


BUCKET = "cli-aws-artifacts"


def write_inputs(world: AwsWorld, tmp: Path) -> Path:
    """A user price trace (fresh quotes for g4dn.xlarge in three zones) and the config."""
    now = datetime.now(timezone.utc) - timedelta(minutes=1)
    rows = ["time,cloud,region,zone,instance_type,market,price_per_hour,on_demand_per_hour,"
            "available"]
    for zone, price in (("us-east-1a", 0.161), ("us-east-1b", 0.172), ("us-east-1c", 0.183)):
        rows.append(f"{now.isoformat()},aws,us-east-1,{zone},g4dn.xlarge,spot,{price},0.526,")
    (tmp / "prices.csv").write_text("\n".join(rows) + "\n")
    (tmp / "ring-token").write_text("a-test-token\n")  # the daemon runs the coordinator
    from tests.fakes.user_code import make_project

    make_project(tmp / "project")
    import boto3

    from tests.fakes.instances import test_wheel

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=world.endpoint)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[job]
id = "{JOB}"
[aws]
region = "us-east-1"
endpoint_url = "{world.endpoint}"
launch_template = "spotring-worker"
queue_url = "{world.queue_url}"
[source]
kind = "trace"
[cloud]
driver = "aws"
artifacts = "s3://{BUCKET}/artifacts"
wheel = "{test_wheel()[0]}"
[fleet]
max_size = 2
markets = ["spot"]
[daemon]
state_path = "state.sqlite"
token_path = "ring-token"
notice_poll_s = 0.5
plan_s = 600
""")
    return cfg


def start(cfg: Path, tmp: Path, n: int, cwd: Path = REPO) -> subprocess.Popen:
    log = open(tmp / f"run{n}.log", "w")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "provisioner.cli", "run", "--config", str(cfg),
                             "--trace", str(tmp / "prices.csv"), "--on-exit", "terminate",
                             "--job", str(tmp / "project" / "src" / "train.py")],
                            cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)




def alive(world: AwsWorld) -> set[str]:
    return {i["InstanceId"] for i in world.instances(JOB)}


@pytest.mark.timeout(900)
def test_provision_run_against_moto(world, tmp_path):
    cfg = write_inputs(world, tmp_path)
    first = start(cfg, tmp_path, 1)
    try:
        assert wait_for(lambda: len(alive(world)) == 2, BOOT_S), \
            (tmp_path / "run1.log").read_text()
        fleet = alive(world)
        # every launch pins the wheel the daemon stored with the run ([cloud] artifacts)
        from provisioner.drivers.artifacts import sha256_of
        from tests.fakes.instances import test_wheel

        from provisioner.drivers.code import pack

        wheel, sha = test_wheel()
        assert sha == sha256_of(wheel)
        code = pack(tmp_path / "project" / "src", tmp_path / "project" / "src" / "train.py",
                    tmp_path)
        for inst in world.instances(JOB):
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            assert tags["spotring:env:SPOTRING_WHEEL"] == \
                f"s3://{BUCKET}/artifacts/{sha}/{wheel.name}"
            assert tags["spotring:env:SPOTRING_WHEEL_SHA256"] == sha
            # and the job's folder (--code's default), packed as the packer packs it
            assert tags["spotring:env:SPOTRING_JOB"] == "train.py"
            assert tags["spotring:env:SPOTRING_CODE"] == \
                f"s3://{BUCKET}/artifacts/{code.sha256}/code.tar.gz"
            assert tags["spotring:env:SPOTRING_CODE_SHA256"] == code.sha256
        coordinator = _meta(tmp_path, "coordinator")
        assert coordinator and coordinator["port"] > 0
        busy = start(cfg, tmp_path, 9)
        assert busy.wait(60) == 2  # one daemon per state file
        assert "in use by another `provision run`" in (tmp_path / "run9.log").read_text()
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert alive(world) == fleet  # a crash leaves the fleet running...
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        # the user edits the code before the restart: the run keeps the code its ring runs
        (tmp_path / "project" / "src" / "helper.py").write_text("# edited\n")
        second = start(cfg, tmp_path, 2, cwd=elsewhere)
        try:
            time.sleep(0.5)
            # ...and the restarted daemon adopts it: no stray terminated, nothing added.
            assert wait_for(lambda: _events(tmp_path).count("started") >= 2, 60), \
                (tmp_path / "run2.log").read_text()
            assert alive(world) == fleet
            assert not (elsewhere / "state.sqlite").exists()  # the same state, found again
            # the coordinator on the address the workers dial (port 0 in the config)
            assert _meta(tmp_path, "coordinator") == coordinator
            assert "terminated" not in _events(tmp_path)
            victim = sorted(fleet)[0]
            world.interrupt(victim)
            assert wait_for(lambda: len(alive(world) - fleet) == 1, 30), \
                (tmp_path / "run2.log").read_text()
            tokens = [t["Value"] for i in world.instances(JOB, alive_only=False)
                      for t in i.get("Tags", []) if t["Key"] == "spotring:token"]
            assert len(tokens) == 3  # ever launched: the fleet of two, then one replacement
            (new,) = [i for i in world.instances(JOB) if i["InstanceId"] not in fleet]
            tags = {t["Key"]: t["Value"] for t in new["Tags"]}
            assert tags["spotring:env:SPOTRING_CODE_SHA256"] == code.sha256
            assert "code: changed since this run started" in (tmp_path / "run2.log").read_text()
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 130, (tmp_path / "run2.log").read_text()  # stopped
    finally:
        if first.poll() is None:
            first.kill()
    assert alive(world) == set()  # --on-exit terminate


def _meta(tmp: Path, key: str):
    from provisioner.daemon.state import State

    path = tmp / "state.sqlite"
    if not path.exists():
        return None
    st = State.read_only(path)
    try:
        return st.get_meta(key)
    finally:
        st.close()


def _events(tmp: Path) -> list[str]:
    from provisioner.daemon.state import State

    path = tmp / "state.sqlite"
    if not path.exists():
        return []
    st = State.read_only(path)
    try:
        return [e.kind for e in st.events()]
    finally:
        st.close()


@pytest.mark.parametrize(("setup", "says"), [
    ("profile", "AWS_PROFILE"),
    ("wheel", "[cloud] wheel"),
    ("bucket", "[cloud] artifacts"),
    ("symlink", "src/leak is a symlink to /etc, outside the folder"),
    ("git", "git could not check out no-such-tag"),
])
def test_a_run_that_cannot_start_says_why_in_one_line(world, tmp_path, setup, says):
    """An AWS profile that does not exist, a wheel that is not there, an artifacts bucket
    that does not exist, a code folder with a symlink out of it, a git ref that is not there:
    one line naming it and the fix, exit 2, and nothing started (no
    state file, no instance)."""
    cfg = write_inputs(world, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if setup == "profile":
        env["AWS_PROFILE"] = "spotring-no-such-profile"
        env["AWS_CONFIG_FILE"] = str(tmp_path / "no-aws-config")
    elif setup == "wheel":
        cfg.write_text(cfg.read_text().replace('wheel = "', 'wheel = "/nonexistent/'))
    elif setup == "bucket":
        cfg.write_text(cfg.read_text().replace(f"s3://{BUCKET}/", "s3://no-such-bucket-x/"))
    job: list[str] = []
    if setup == "symlink":
        (tmp_path / "project" / "src" / "leak").symlink_to("/etc")
        job = ["--job", "project/src/train.py", "--code", "project"]
    if setup == "git":  # resolved on this host, before anything starts
        subprocess.run(["git", "init", "-q", str(tmp_path / "project")], check=True)
        job = ["--job", "src/train.py", "--code",
               f"git+file://{tmp_path / 'project'}@no-such-tag"]
    done = subprocess.run([sys.executable, "-m", "provisioner.cli", "run", "--config", str(cfg),
                           "--trace", str(tmp_path / "prices.csv"), *job], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "state.sqlite").exists() and alive(world) == set()
