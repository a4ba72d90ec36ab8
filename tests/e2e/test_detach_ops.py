"""The operations of issue 18 on a real daemon, as a user types them: ``provision run
--detach --job FILE --on-exit keep --metrics-port 0``, then ``list``, ``logs``, a scrape of
/metrics over HTTP, Ctrl-C (SIGINT) to the daemon, which keeps its fleet, and ``down``,
which ends it. Waits are generous and nothing is timed: a loaded 2-core machine passes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest

from provisioner.drivers.local import running
from tests.fakes.local_run import JOB, REPO
from tests.fakes.wait import wait_for

pytestmark = pytest.mark.slow


def provision(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "provisioner", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(600)
def test_detach_list_logs_metrics_keep_then_down(tmp_path):
    env = {**os.environ, "SPOTRING_STATE_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    job = tmp_path / "myjob.py"  # the user's job: a copy of the example, outside the repo
    shutil.copy(REPO / "examples" / "digits.py", job)
    wd = tmp_path / "w"
    pid = None
    try:
        r = provision("run", "--detach", "--job", str(job), "--workdir", str(wd),
                      "--outages-per-hour", "0", "--max-size", "2", "--until-epochs", "100000",
                      "--on-exit", "keep", "--metrics-port", "0", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        pid = int(re.search(r"pid (\d+)", r.stdout).group(1))
        assert str(wd / "daemon.log") in r.stdout and "provision logs" in r.stdout

        runs = json.loads(provision("list", "--json", env=env).stdout)
        assert [(x["pid"], x["workdir"], x["job"]) for x in runs] == [(pid, str(wd), str(job))]

        def training() -> bool:
            ring = json.loads(provision("status", "--workdir", str(wd), "--json",
                                        env=env).stdout or "{}").get("ring") or {}
            return int(ring.get("step") or 0) >= 5 and int(ring.get("world") or 0) >= 2
        assert wait_for(training, 300, step_s=2.0)

        log = provision("logs", str(wd), env=env).stdout
        url = re.search(r"metrics: (http://127\.0\.0\.1:\d+/metrics)", log).group(1)

        seen: list[str] = []

        def scraped() -> bool:
            seen.append(urllib.request.urlopen(url, timeout=30).read().decode())
            return "spotring_worker_samples_per_s{" in seen[-1]
        assert wait_for(scraped, 120, step_s=1.0), seen[-1:]
        assert "spotring_savings_usd" in seen[-1] and "spotring_steps_lost" in seen[-1]

        workers = running(wd / "cloud", JOB)
        assert len(workers) == 2
        r = provision("down", str(wd), env=env)  # the daemon holds the run: refused
        assert r.returncode == 2 and f"pid {pid}" in r.stderr, r.stderr

        os.kill(pid, signal.SIGINT)  # Ctrl-C: drains, keeps the fleet (--on-exit keep)
        follow = provision("logs", str(wd), "-f", env=env)  # ends when the daemon exits
        assert follow.returncode == 0 and "stopped: interrupted" in follow.stdout
        assert wait_for(lambda: provision("list", "--json", env=env).stdout.strip() == "[]", 60)
        assert {w["id"] for w in running(wd / "cloud", JOB)} == {w["id"] for w in workers}

        r = provision("down", str(wd), "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert sorted(json.loads(r.stdout)["terminated"]) == sorted(w["id"] for w in workers)
        assert wait_for(lambda: running(wd / "cloud", JOB) == [], 60)
        st = json.loads(provision("status", "--workdir", str(wd), "--json", env=env).stdout)
        assert st["fleet"] == [] and st["fleet_kept"] is False
        r = provision("down", str(wd), env=env)
        assert r.returncode == 0 and "nothing to terminate" in r.stdout
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for w in running(wd / "cloud", JOB):
            try:
                os.killpg(w["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(300)
def test_detach_with_bad_input_shows_the_error_and_leaves_nothing(tmp_path):
    env = {**os.environ, "SPOTRING_STATE_HOME": str(tmp_path / "home")}
    wd = tmp_path / "w"
    r = provision("run", "--detach", "--workdir", str(wd), "--trace", str(tmp_path / "no.csv"),
                  env=env)
    assert r.returncode == 2 and "no.csv" in r.stderr, r.stdout + r.stderr
    assert not wd.exists()
