"""``provision run`` itself, as a process, on the AWS driver against a moto server over HTTP:
it launches the fleet; a second daemon on the same state is refused; SIGKILLed and started
again from another directory (the config's relative ``state_path`` is read from the config
file's folder) it adopts the fleet (no orphan, no duplicate, nothing terminated); an
interruption through EventBridge -> SQS is replaced; SIGTERM with ``--on-exit terminate``
drains, exits 130 (as Ctrl-C) and leaves nothing running."""

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
from tests.fakes.wait import wait_for  # noqa: E402


@pytest.fixture(scope="module")
def world():
    w = AwsWorld()
    yield w
    w.close()


def write_inputs(world: AwsWorld, tmp: Path) -> Path:
    """A user price trace (fresh quotes for g4dn.xlarge in three zones) and the config."""
    now = datetime.now(timezone.utc) - timedelta(minutes=1)
    rows = ["time,cloud,region,zone,instance_type,market,price_per_hour,on_demand_per_hour,"
            "available"]
    for zone, price in (("us-east-1a", 0.161), ("us-east-1b", 0.172), ("us-east-1c", 0.183)):
        rows.append(f"{now.isoformat()},aws,us-east-1,{zone},g4dn.xlarge,spot,{price},0.526,")
    (tmp / "prices.csv").write_text("\n".join(rows) + "\n")
    (tmp / "ring-token").write_text("a-test-token\n")  # the daemon runs the coordinator
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[job]
id = "{JOB}"
[cloud]
driver = "aws"
[aws]
region = "us-east-1"
endpoint_url = "{world.endpoint}"
launch_template = "spotring-worker"
queue_url = "{world.queue_url}"
[source]
kind = "trace"
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
                             "--trace", str(tmp / "prices.csv"), "--on-exit", "terminate"],
                            cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)




def alive(world: AwsWorld) -> set[str]:
    return {i["InstanceId"] for i in world.instances(JOB)}


def test_provision_run_against_moto(world, tmp_path):
    cfg = write_inputs(world, tmp_path)
    first = start(cfg, tmp_path, 1)
    try:
        assert wait_for(lambda: len(alive(world)) == 2, 60), (tmp_path / "run1.log").read_text()
        fleet = alive(world)
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
