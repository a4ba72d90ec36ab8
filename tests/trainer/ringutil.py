"""Test harness for real multi-process rings: an in-process coordinator and worker processes.

Workers are real, separate processes on localhost (gloo on CPU) running the worker CLI's own
entry point (``trainer.__main__.main``). They are forked from a multiprocessing forkserver
that imported torch, sklearn and the trainer once, because on the shared 2-core machine a
fresh ``python -m trainer`` spends most of its start importing (test_cli.py runs the real
command line). ``env={"SPOTRING_TEST_NCCL_DOUBLE": "1"}`` runs the workers with the NCCL
double (``tests/fakes/nccl.py``): every generation is then an NCCL one. The coordinator runs
in the test process so the test reads its events and stats directly.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trainer.control.coordinator import Coordinator

REPO = Path(__file__).resolve().parents[2]
TOKEN = b"test-token-0123456789"
# torch._dynamo: the first optimizer a job builds imports it (torch/_compile.py), 1.2-2 CPU-s
# in every forked worker otherwise; importing it starts no thread, so forking after it is safe
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "trainer.worker.loop",
           "trainer.__main__", "sklearn.datasets", "sklearn.model_selection"]
_CTX: Any = None


def _context() -> Any:
    """The forkserver context (started once per test session, single-threaded BLAS)."""
    global _CTX
    if _CTX is None:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(PRELOAD)
    return _CTX


def _child(argv: list[str], log: str, env: dict[str, str], netns: str | None = None) -> None:
    if netns is not None:  # another host for real (tests/fakes/netns.py), before any socket
        from tests.fakes.netns import enter

        enter(netns)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    os.chdir(REPO)
    if os.environ.get("SPOTRING_TEST_NCCL_DOUBLE") == "1":  # NCCL's semantics on CPU
        from tests.fakes.nccl import install

        install()
    from trainer.__main__ import main

    sys.exit(main(argv))


class _Proc:
    """A forked worker with the Popen verbs the tests use (pid, poll, wait, kill)."""

    def __init__(self, p: Any) -> None:
        self._p = p
        self.pid = p.pid

    def poll(self) -> int | None:
        return self._p.exitcode

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired("worker", timeout or 0)
        return self._p.exitcode

    def kill(self) -> None:
        self._p.kill()


class Ring:
    """A coordinator plus the worker processes a test starts; cleans up after itself."""

    def __init__(self, tmp: Path, *, job: str, env: dict[str, str] | None = None,
                 **coord_kw: Any) -> None:
        self.tmp = tmp
        self.job = job
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                    **(env or {})}
        self.token_file = tmp / "token"
        self.token_file.write_bytes(TOKEN + b"\n")
        self.token_file.chmod(0o600)
        self.coord = Coordinator("127.0.0.1", 0, TOKEN, **coord_kw)  # tests may replace it
        self.coord.start()
        self.procs: dict[str, Any] = {}

    def worker(self, name: str, *extra: str, token_file: Path | None = None,
               job: str | None = None, netns: str | None = None) -> _Proc:
        """Start worker ``name`` (inside network namespace ``netns``, when given)."""
        host, port = self.coord.address
        argv = ["worker", "--coordinator", f"{host}:{port}",
               "--token-file", str(token_file or self.token_file), "--job", job or self.job,
               "--name", name, "--seed", "0",
               "--metrics-file", str(self.tmp / f"{name}.metrics.jsonl"),
               "--record-samples", str(self.tmp / f"{name}.samples.jsonl"),
               "--collective-timeout", "5", "--connect-timeout", "20", *extra]
        ctx = _context()
        extra_env = {k: v for k, v in self.env.items() if os.environ.get(k) != v}
        p = ctx.Process(target=_child,
                        args=(argv, str(self.tmp / f"{name}.log"), extra_env, netns),
                        name=f"worker-{name}", daemon=False)
        p.start()
        proc = _Proc(p)
        self.procs[name] = proc
        return proc

    def wait_for(self, what: str, pred: Callable[[], bool], timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; stats={self.coord.stats()} "
                             f"events={self.coord.events()[-8:]}\n{self.logs()}")

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.coord.events() if kind is None or e["kind"] == kind]

    def formed(self) -> list[dict[str, Any]]:
        """Data of every 'formed' event (checksums, identical, steps_lost, step) with its
        generation."""
        return [{**e["data"], "generation": e["generation"]} for e in self.events("formed")]

    def active(self, name: str) -> bool:
        return any(m.name == name and m.state == "active" for m in self.coord.members())

    def logs(self) -> str:
        parts = []
        for f in sorted(self.tmp.glob("*.log")):
            lines = [ln for ln in f.read_text(errors="replace").splitlines()
                     if not ln.startswith(("frame #", "Exception raised"))]
            parts.append(f"--- {f.name}\n" + "\n".join(lines[-15:]))
        return "\n".join(parts)

    def story(self) -> str:
        """What a timing assertion needs when it fails: the coordinator's generations (why
        each was published) and losses, and every member's lines about faults, broken
        generations, formings and timeouts, in time order."""
        marks = ("fault injector", "broken", "formed generation", "form g", "not completed",
                 "watchdog", "monitor", "dropped", "Timed out", "timed out")
        dated = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")

        def stamp(t: float) -> str:  # as the workers' logging writes it, so the lines sort
            return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]

        def member(name: str, ln: str) -> str:  # a line the double writes has no date
            return (f"{ln[:23]} {name}| {ln[24:300]}" if dated.match(ln)
                    else f"{'?':23} {name}| {ln[:300]}")

        lines = [f"{stamp(e['time'])} coordinator| {e['kind']} g{e.get('generation')} "
                 f"{e.get('name', '')}: {e.get('detail', '')}"
                 for e in self.events() if e["kind"] in ("generation", "lost", "leave")]
        for f in sorted(self.tmp.glob("*.log")):
            lines += [member(f.stem, ln) for ln in f.read_text(errors="replace").splitlines()
                      if any(k in ln for k in marks)]
        return "\n".join(sorted(lines))

    def samples(self) -> list[dict[str, Any]]:
        recs = []
        for f in self.tmp.glob("*.samples.jsonl"):
            recs += [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]
        return recs

    def metrics(self) -> list[dict[str, Any]]:
        recs = []
        for f in self.tmp.glob("*.metrics.jsonl"):
            recs += [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]
        return recs

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.kill()
                p.wait(5)
        self.coord.stop()


def per_epoch_counts(records: Iterable[dict[str, Any]]) -> dict[int, Counter[int]]:
    """epoch -> Counter of sample ids consumed in committed steps."""
    out: dict[int, Counter[int]] = {}
    for r in records:
        out.setdefault(int(r["epoch"]), Counter()).update(int(i) for i in r["ids"])
    return out


def published(events: Iterable[dict[str, Any]]) -> dict[int, str]:
    """generation -> why the coordinator published it (``membership change``, ``collective
    failed``, ``heartbeat stopped``, ...), from its ``generation`` events."""
    return {e["generation"]: e["detail"].removeprefix("published: ") for e in events
            if e["kind"] == "generation" and e["detail"].startswith("published")}


def failure_generations(events: Iterable[dict[str, Any]]) -> list[int]:
    """The generations published because a member failed (a collective failed, a heartbeat
    stopped): each may lose one step (one wave) at most."""
    return [g for g, why in published(events).items() if "failed" in why or "heartbeat" in why]


def finish_checksums(events: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(member name, parameter checksum) of every member that left the ring finished."""
    return [(e["name"], e["data"]["checksum"]) for e in events
            if e["kind"] == "leave" and e["data"].get("finished")]


def exported(tmp: Path) -> list[tuple[str, int]]:
    """(worker, step) of every model a worker in ``tmp`` wrote to ``--output`` because the
    coordinator asked for it (``Coordinator.request_export``), from the workers' logs."""
    out = []
    for f in sorted(tmp.glob("*.log")):
        for m in re.finditer(r"trained model written to .* \(on request, step (\d+)\)",
                             f.read_text(errors="replace")):
            out.append((f.name.removesuffix(".log"), int(m.group(1))))
    return out
