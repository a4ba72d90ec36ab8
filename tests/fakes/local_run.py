"""``provision run`` on the local cloud as a child process, and what its work directory says,
for the end-to-end tests (tests/e2e/test_local_run.py) and the benchmarks
(benchmarks/daemon_crash.py, benchmarks/ring_loss.py).

Design: :class:`RunProcess` starts the real command line (``python -m provisioner.cli run
--workdir W ...``) with its output in a log file beside the work directory, and reads the
run only the way another terminal would: the state through
:meth:`provisioner.daemon.state.State.read_only` (the ring's last stats are its ``ring``
meta, written with every metrics record), the live workers through
:func:`provisioner.drivers.local.running`, the workers' per-step metrics from
``W/workers/*.jsonl``.

Rule for callers: call :meth:`RunProcess.close` (or use it as a context manager): it kills
the daemon if it still runs and every worker of the job left in the work directory.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provisioner.daemon.state import State
from provisioner.drivers.local import running
from provisioner.errors import UserError

REPO = Path(__file__).resolve().parents[2]
JOB = "spotring-demo"


class RunProcess:
    """One ``provision run`` child on the local cloud (see the module docstring)."""

    def __init__(self, workdir: Path, *flags: str, config: Path | None = None,
                 log_name: str = "run.log", env: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.flags = list(flags)
        self.config = config
        self.log_path = self.workdir.parent / log_name
        self.env = env or {}
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "provisioner.cli", "run", "--workdir", str(self.workdir),
                "--no-dashboard", *self.flags]
        return argv + (["--config", str(self.config)] if self.config is not None else [])

    def start(self, log_name: str | None = None) -> "RunProcess":
        """Start (again: a restart on the same work directory, its output in ``log_name``)."""
        if log_name is not None:
            self.log_path = self.workdir.parent / log_name
        self.workdir.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        out.close()
        return self

    def __enter__(self) -> "RunProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the process ---------------------------------------------------------------------------
    def poll(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def exited(self) -> str | None:
        """The log when the daemon exited (an ``abort`` for :func:`tests.fakes.wait.wait_for`)."""
        return self.log() if self.proc is not None and self.proc.poll() is not None else None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.kill_workers()

    # -- the work directory ------------------------------------------------------------------------
    def _read(self, fn: Any, default: Any) -> Any:
        """``fn(state)`` on the state read-only; ``default`` while the daemon is creating it."""
        path = self.workdir / "state.sqlite"
        try:
            st = State.read_only(path)
        except UserError:  # not there yet, or its tables not written yet
            return default
        try:
            return fn(st)
        except sqlite3.Error:
            return default
        finally:
            st.close()

    def meta(self, key: str) -> Any:
        return self._read(lambda st: st.get_meta(key), None)

    def events(self, kind: str) -> list:
        return self._read(lambda st: st.events(kinds=[kind]), [])

    def ring(self) -> dict[str, Any]:
        """The ring's stats as the daemon last recorded them."""
        return self.meta("ring") or {}

    def training(self, world: int, step: int) -> bool:
        r = self.ring()
        return int(r.get("world") or 0) >= world and int(r.get("step") or 0) >= step

    def report(self) -> dict[str, Any]:
        return json.loads((self.workdir / "report" / "report.json").read_text())

    def workers(self) -> list[dict[str, Any]]:
        """The live workers' records (id, pid, ...)."""
        return running(self.workdir / "cloud", JOB)

    def kill_workers(self, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every live worker of the job (its process group); returns their pids."""
        pids = [r["pid"] for r in self.workers()]
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def _step_lines(self) -> Iterator[dict[str, Any]]:
        """Every member's step lines (the members' own logs: readable while the daemon is
        down)."""
        for f in (self.workdir / "workers").glob("*.jsonl"):
            for line in f.read_text().splitlines():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line of a killed worker, or one being written

    def step_times(self) -> dict[int, float]:
        """Committed step -> the earliest wall time a member logged it."""
        out: dict[int, float] = {}
        for rec in self._step_lines():
            s, t = int(rec["step"]), float(rec["t"])
            out[s] = min(out.get(s, t), t)
        return out

    def last_step(self, world: int = 1) -> int:
        """The newest step any member logged in a ring of at least ``world`` members."""
        return max((int(rec["step"]) for rec in self._step_lines()
                    if int(rec.get("world", 0)) >= world), default=0)


# -- a local run in this process ------------------------------------------------------------
# The run session itself (tests/provisioner/daemon), with the ring's fake (the job's end is
# what a test sets) and the stand-in worker of tests/fakes/local_worker.py as the instances:
# the lifecycle, the state, the local driver and its processes are the real ones.

STAND_IN = REPO / "tests" / "fakes" / "local_worker.py"


def local_options(wd: Path, until: int | None = None, **kw: Any) -> Any:
    """The options of a quick local run in ``wd``: two instances, no outages, 600x;
    ``until``: its --until-steps."""
    from provisioner.config import parse_settings
    from provisioner.daemon.run.options import RunOptions

    settings = parse_settings({"fleet": {"max_size": 2, "markets": ["spot"]}})
    return RunOptions(settings=settings, workdir=wd, outages_per_hour=0.0, speed=600.0,
                      until_steps=until, **kw)


def fake_ring_environment(options: Any, ring: Any, out: Path,
                          wrap: Any = lambda driver: driver) -> Any:
    """A :class:`provisioner.daemon.run.local.LocalEnvironment` whose coordinator is
    ``ring`` (its ``started`` set when the run starts it) and whose instances run the
    stand-in worker (files in ``out``); ``wrap`` wraps the driver the daemon gets."""
    from provisioner.daemon.run.local import LocalEnvironment
    from provisioner.daemon.run.session import Parts

    class Env(LocalEnvironment):
        def build_job(self) -> list[str]:
            return []  # the stand-in worker trains no job

        def coordinator(self, start: Any, found: Any, run_id: str, created: Any) -> Any:
            self.ring_files(start, run_id, created)
            ring.start()
            ring.started = True
            return ring

        def worker_command(self, coordinator: Any) -> Any:
            return lambda spec: [sys.executable, str(STAND_IN), str(out), spec.instance_id]

        def parts(self, state: Any, coordinator: Any, now: Any) -> Any:
            p = super().parts(state, coordinator, now)
            p.driver._terminate_grace_s = 0.5  # the stand-in exits on SIGTERM at once
            return Parts(wrap(p.driver), p.source, p.launch_env)

    out.mkdir(parents=True, exist_ok=True)
    return Env(options)


def run_until(session: Any, wd: Path, ring: Any, stats: dict[str, Any], workers: int = 2,
              timeout_s: float = 120.0) -> dict[str, Any]:
    """Run ``session`` in a thread until ``workers`` instances are up and in ``ring``, then
    give the ring ``stats`` (the run's end) and wait for the session; returns ``{"result":
    ...}`` or ``{"error": exception}``. A session that died leaves no scheduler running."""
    import threading

    from tests.fakes.wait import wait_for

    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["result"] = session.run()
        except BaseException as exc:  # noqa: BLE001 - what ended the session, for the test
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: len(running(wd / "cloud", JOB)) >= workers or "error" in box,
                        timeout_s)
        assert "error" not in box, box.get("error")
        ring.speeds = {r["id"]: 100.0 for r in running(wd / "cloud", JOB)}
        ring.progress = {**ring.progress, **stats, "step": 40, "samples_done": 2560}
        t.join(timeout_s)
        assert not t.is_alive(), "the run did not end"
    finally:
        d = session.daemon
        if d is not None and d.scheduler is not None:  # a killed daemon has no threads left
            d.stopping.set()
            d.scheduler.shutdown(wait=True)
    return box
