"""Worker entry point: bad job, unreachable coordinator, wrong token: clear exits, ring untouched."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.ringutil import REPO, TOKEN
from trainer.control.coordinator import Coordinator

pytestmark = pytest.mark.slow


def _worker(tmp: Path, address: str, job: str, token: bytes = TOKEN, *extra: str
            ) -> subprocess.CompletedProcess[str]:
    tf = tmp / f"token-{len(token)}"
    tf.write_bytes(token)
    tf.chmod(0o600)
    return subprocess.run(
        [sys.executable, "-m", "trainer", "worker", "--coordinator", address, "--token-file",
         str(tf), "--job", job, "--name", "cli", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


@pytest.fixture()
def coord() -> Coordinator:
    c = Coordinator("127.0.0.1", 0, TOKEN, heartbeat_timeout_s=2.0)
    c.start()
    yield c
    c.stop()


def test_job_that_fails_to_import_stops_before_joining(tmp_path: Path, coord: Coordinator
                                                       ) -> None:
    host, port = coord.address
    r = _worker(tmp_path, f"{host}:{port}", "tests/trainer/jobs/broken.py")
    assert r.returncode == 2
    assert "tests/trainer/jobs/broken.py" in r.stderr and "spotring_no_such_module" in r.stderr
    assert "fix the job file" in r.stderr
    time.sleep(0.2)
    assert coord.events() == [] and coord.members() == []  # the coordinator never saw it


def test_unreachable_coordinator_retries_then_exits_clearly(tmp_path: Path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # a port nobody listens on
    t0 = time.monotonic()
    r = _worker(tmp_path, f"127.0.0.1:{port}", "tests/trainer/jobs/probe.py", TOKEN,
                "--connect-timeout", "3")
    assert r.returncode == 3
    assert f"127.0.0.1:{port} unreachable" in r.stderr and "attempts" in r.stderr
    assert time.monotonic() - t0 < 90


def test_wrong_token_exits_refused_and_is_logged(tmp_path: Path, coord: Coordinator) -> None:
    host, port = coord.address
    r = _worker(tmp_path, f"{host}:{port}", "tests/trainer/jobs/probe.py", b"wrong-token")
    assert r.returncode == 4 and "refused" in r.stderr and "--token-file" in r.stderr
    assert "wrong-token" not in r.stderr
    assert coord.stats()["rejected"]["refused"] == 1  # refused at the control port
    assert coord.events() == [] and coord.plan() is None  # it never got further


def test_a_token_file_others_can_read_gets_a_warning_with_the_fix(tmp_path: Path) -> None:
    tf = tmp_path / "token"
    tf.write_bytes(TOKEN)
    tf.chmod(0o644)
    r = subprocess.run(
        [sys.executable, "-m", "trainer", "worker", "--coordinator", "127.0.0.1:9",
         "--token-file", str(tf), "--job", "tests/trainer/jobs/probe.py",
         "--connect-timeout", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 3  # it went on (and found no coordinator there)
    assert f"chmod 600 {tf}" in r.stderr and "WARNING" in r.stderr


def test_bad_address_is_a_usage_error(tmp_path: Path) -> None:
    r = _worker(tmp_path, "nonsense", "tests/trainer/jobs/probe.py")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr


def test_standalone_coordinator_admits_the_token_and_stops_on_sigterm(tmp_path: Path) -> None:
    import signal

    from trainer.protocol import messages as mb
    from trainer.worker.client import connect, join

    tf, port = _token_and_port(tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-m", "trainer", "coordinator", "--host", "127.0.0.1", "--port",
         str(port), "--token-file", str(tf)], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    try:
        store = connect("127.0.0.1", port, TOKEN, budget_s=90)
        assert join(store, mb.Hello("w", 1.0)) >= 1
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert f"listening on 127.0.0.1:{port}" in out and "admitted" in out


def test_serve_until_over_returns_the_outcome_after_lingering() -> None:
    import threading

    from trainer.__main__ import serve_until_over
    from trainer.protocol.messages import JobOutcome

    seen = iter([JobOutcome.RUNNING, JobOutcome.RUNNING, JobOutcome.DONE])
    assert serve_until_over(lambda: next(seen), threading.Event(), linger_s=0.0,
                            poll_s=0.001) is JobOutcome.DONE
    stop = threading.Event()
    stop.set()  # SIGTERM or Ctrl-C before the end: no outcome, exit 0
    assert serve_until_over(lambda: JobOutcome.RUNNING, stop, poll_s=0.001) is None


def test_standalone_coordinator_exits_by_itself_when_the_job_is_done(tmp_path: Path) -> None:
    """A one-epoch job: the worker finishes, then the coordinator says so and exits 0."""
    tf, port = _token_and_port(tmp_path)
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "REG_EPOCHS": "1"}
    coord = subprocess.Popen(
        [sys.executable, "-m", "trainer", "coordinator", "--host", "127.0.0.1", "--port",
         str(port), "--token-file", str(tf), "--linger", "1"], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    worker = subprocess.Popen(
        [sys.executable, "-m", "trainer", "worker", "--coordinator", f"127.0.0.1:{port}",
         "--token-file", str(tf), "--job", "tests/trainer/jobs/regression.py", "--name", "w0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = coord.communicate(timeout=300)  # generous: a loaded 2-core machine
    finally:
        for p in (coord, worker):
            if p.poll() is None:
                p.kill()
        wout, _ = worker.communicate(timeout=60)
    assert coord.returncode == 0, out + wout
    assert "the job is over (done)" in out and "coordinator exiting" in out


def _token_and_port(tmp_path: Path) -> tuple[Path, int]:
    """A 0600 token file and a free port for a standalone coordinator."""
    import socket

    tf = tmp_path / "token"
    tf.write_bytes(TOKEN + b"\n")
    tf.chmod(0o600)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return tf, port


def test_a_mode_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "trainer", "worker", "--coordinator", "127.0.0.1:1",
         "--token-file", str(tmp_path / "t"), "--job", "examples/digits.py"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "SPOTRING_MODE": "bogus"})
    assert r.returncode == 2 and "SPOTRING_MODE" in r.stderr, r.stderr
