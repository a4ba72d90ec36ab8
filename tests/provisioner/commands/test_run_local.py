"""provision run / status / revoke: bad input is one line and exit 2 with nothing running."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pricing.model import Offering
from provisioner.cli import main
from provisioner.commands.run import parse_duration
from provisioner.errors import UserError
from provisioner.daemon.state import State

from tests.conftest import REPO  # noqa: E402


class Result:
    def __init__(self, returncode, out, err):
        self.returncode, self.stdout, self.stderr = returncode, out, err


@pytest.fixture
def provision(capsys, monkeypatch):
    """Run the CLI in this process (from the repository root), like the console script."""
    monkeypatch.chdir(REPO)

    def run(*args):
        code = main(list(args))
        cap = capsys.readouterr()
        return Result(code, cap.out, cap.err)
    return run


def no_workers_left(wd: Path) -> bool:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return str(wd) not in out


def test_missing_trace_is_one_line_exit_2(tmp_path, provision):
    r = provision("run", "--trace", str(tmp_path / "nope.csv"), "--workdir", str(tmp_path / "w"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "nope.csv" in r.stderr and "no such" in r.stderr


def test_trace_without_usable_offerings_exit_2(tmp_path, provision):
    trace = tmp_path / "cpu.csv"
    trace.write_text("time,cloud,region,zone,instance_type,market,price_per_hour,"
                     "on_demand_per_hour,available\n"
                     "2026-01-01T00:00:00Z,aws,us-east-1,us-east-1a,m5.large,spot,0.03,0.096,1\n")
    wd = tmp_path / "w"
    r = provision("run", "--trace", str(trace), "--workdir", str(wd))
    assert r.returncode == 2, r.stderr
    assert "no usable offerings" in r.stderr and "m5.large" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert not (wd / "state.sqlite").exists() and no_workers_left(wd)


def test_ports_in_use_exit_2_and_nothing_left_running(tmp_path, provision):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        wd = tmp_path / "w"
        r = provision("run", "--metrics-port", str(port), "--workdir", str(wd))
        assert r.returncode == 2 and "already in use" in r.stderr, r.stderr
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[daemon]\ncoordinator_port = {port}\n')
        r = provision("run", "--config", str(cfg), "--workdir", str(wd))
        assert r.returncode == 2 and "coordinator_port" in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0
    assert no_workers_left(wd)
    assert not list((wd / "cloud" / "instances").glob("*.json"))


def test_bad_duration_speed_and_config(tmp_path, capsys):
    assert parse_duration("90m") == 5400 and parse_duration("2h") == 7200
    assert parse_duration("30") == 30
    with pytest.raises(UserError, match="--duration"):
        parse_duration("soon")
    assert main(["run", "--speed", "0"]) == 2
    assert "--speed" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nplan_s = -1\n")
    assert main(["run", "--config", str(cfg)]) == 2
    assert "daemon.plan_s" in capsys.readouterr().err


def test_status_reads_fleet_spend_and_events(tmp_path, capsys):
    st = State(tmp_path / "state.sqlite")
    off = Offering("local", "local-1", "local-1a", "p3.2xlarge")
    st.set_meta("started_at", 0.0)
    st.set_meta("job", {"id": "j", "driver": "local"})
    st.record_price(off, 0.0, 3.6)
    st.adopt("loc-1", off, 0.0)
    st.record_event(100.0, "launch", "loc-1", off, "deficit")
    st.record_metrics(1800.0, [("spend", "", 1.8)])
    st.close()
    assert main(["status", "--workdir", str(tmp_path), "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["spend_usd"] == pytest.approx(1.8) and doc["hours"] == 0.5
    assert [f["id"] for f in doc["fleet"]] == ["loc-1"]
    assert doc["events"][0]["kind"] == "launch"
    assert main(["status", "--workdir", str(tmp_path)]) == 0
    assert "loc-1" in capsys.readouterr().out
    assert main(["revoke", "loc-1", "--workdir", str(tmp_path)]) == 2


@pytest.mark.slow
def test_ctrl_c_drains_stops_and_reports(tmp_path):
    import signal
    import time

    wd = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, "-m", "provisioner.cli", "run", "--workdir", str(wd),
                             "--no-dashboard", "--outages-per-hour", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end and proc.poll() is None:
            db = wd / "state.sqlite"
            if db.exists() and len(list((wd / "cloud" / "instances").glob("*.json"))) >= 2:
                st = State(db)
                started = st.events(kinds=["started"])
                st.close()
                if started:
                    break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out  # Ctrl-C: drained, reported, then 128 + SIGINT
    assert "stopped: interrupted" in out and (wd / "report" / "report.md").exists()
    st = State(wd / "state.sqlite")
    assert st.live_instances() == [] and st.events()[-1].kind == "stopped"
    assert no_workers_left(wd)


def test_dashboard_renders_fleet_prices_progress_and_events():
    from datetime import datetime, timezone

    from rich.console import Console

    from provisioner.daemon.view.status import Status, WorkerRow
    from provisioner.daemon.view.dashboard import render
    from provisioner.daemon.state import Event

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    key = "local/local-1/local-1a/p3.2xlarge/spot"
    st = Status(t0.replace(hour=2), {key: 2}, 1, {key: 0.9123}, 1.82, 3.456, 2500.0,
                {"epoch": 4, "step": 90, "accuracy": 0.9712, "steps_lost": 1},
                (Event(t0.timestamp() + 60, "notice", "loc-1", key, "trace: outage"),),
                workers={"loc-1": 1200.0, "loc-2": 1300.0},
                instances=(WorkerRow("loc-1", key, "draining", 1200.0, 0.9123),
                           WorkerRow("loc-2", key, "active", 1300.0, 0.9123),
                           WorkerRow("loc-3", key, "booting", None, 0.9123)))
    con = Console(width=160, height=40, record=True)
    con.print(render(st, t0.timestamp(), width=160, height=40))  # wide: the market too
    text = con.export_text()
    for needle in ("2.00 h", "$3.4560", "2.5k samples/s", "0.971", "p3.2xlarge local-1a", "0.9123",
                   "draining", "loc-2", "booting", "notice", "trace: outage"):
        assert needle in text, needle


def test_cloud_run_without_credentials_or_template_is_one_line_exit_2(tmp_path, provision,
                                                                       monkeypatch, shared_data):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    state = tmp_path / "state.sqlite"
    cfg = tmp_path / "aws.toml"
    cfg.write_text(f'[cloud]\ndriver = "aws"\n[daemon]\nstate_path = "{state}"\n')
    r = provision("run", "--config", str(cfg))
    assert r.returncode == 2 and "launch_template" in r.stderr, r.stderr
    cfg.write_text(f'[cloud]\ndriver = "aws"\n[aws]\nlaunch_template = "spotring-worker"\n'
                   f'[daemon]\nstate_path = "{state}"\n')
    trace = shared_data / "spot_availability_traces/cant_be_late/availability/1-node/aws-02-15-2023"
    r = provision("run", "--config", str(cfg), "--trace", str(trace))
    assert r.returncode == 2 and "credentials" in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_workers_that_never_join_stop_the_run_with_their_error(tmp_path, provision):
    job = tmp_path / "broken_job.py"
    # it builds on the daemon's host (provision run builds every job once before launching)
    # and breaks only in the workers (a worker's environment has SPOTRING_SLOWDOWN): what
    # the daemon then has left to find is workers that never join
    job.write_text('import os\nif os.environ.get("SPOTRING_SLOWDOWN"):\n'
                   '    raise RuntimeError("broken on purpose")\n'
                   'from spotring_examples.digits import make_job  # noqa: F401\n')
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[job]\njob_file = "{job}"\n[fleet]\nmarkets = ["spot"]\nmax_size = 2\n')
    wd = tmp_path / "w"
    r = provision("run", "--config", str(cfg), "--workdir", str(wd), "--no-dashboard",
                  "--speed", "120")
    assert r.returncode == 2, r.stderr
    assert "exited before any joined" in r.stderr and "broken on purpose" in r.stderr
    assert no_workers_left(wd)
    st = State(wd / "state.sqlite")
    assert st.live_instances() == []


def test_cloud_run_token_path_must_be_readable(tmp_path, provision, shared_data):
    cfg = tmp_path / "aws.toml"
    cfg.write_text(f'[cloud]\ndriver = "aws"\n[aws]\nlaunch_template = "spotring-worker"\n'
                   f'[daemon]\nstate_path = "{tmp_path / "s.sqlite"}"\n'
                   f'token_path = "{tmp_path / "missing-token"}"\n')
    trace = shared_data / "spot_availability_traces/cant_be_late/availability/1-node/aws-02-15-2023"
    r = provision("run", "--config", str(cfg), "--trace", str(trace))
    assert r.returncode == 2 and "daemon.token_path" in r.stderr, r.stderr
