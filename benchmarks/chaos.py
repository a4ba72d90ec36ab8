"""Benchmark: chaos through a whole run (issue 30, item 10). The daemon and every worker
SIGKILLed at random moments on the local cloud, ``--kills`` times (100 by default; fewer for
a CI-size run), until the job ends; then the same job once more without any fault, the
baseline of the same run.

Design: the same outline as every benchmark here (small defaults, one JSON line on stdout,
logs on stderr, the baseline measured in the same run). The runs are the real command line
(``provision run`` through :class:`tests.fakes.local_run.RunProcess`: the real daemon, the
real coordinator and ring, the local driver's worker processes). A kill picks its victim at
random among the daemon and the live workers, after a random pause (``--max-gap-s``) once the
ring has trained at least one more step; a killed daemon is started again on the same work
directory after ``--down-s`` (it adopts the ring); a killed worker is replaced by the daemon.
Figures (goal in brackets):

* ``duplicates``: the most live worker processes of the job seen at once beyond
  ``--max-size`` [0];
* ``orphans``: worker processes of the job alive once the run ended [0];
* ``threads_per_worker_first`` / ``_last`` / ``threads_growth_max``: the thread count of each
  worker once settled (``SETTLE_S`` after it was first seen as a member: it has logged a
  committed step) and when last seen, and the most any one grew through the generations it
  lived [flat];
* ``runs_lost``: the run ended ``lost`` [0]; ``runs_trained_twice``: the ring trained from
  step 1 again after it had passed a snapshot, or a start after the end trained again [0];
* ``steps_redone_per_kill``: steps committed more than once (the ledger's ``steps_lost``)
  per kill [<= one snapshot interval, ``snapshot_interval_steps``: the steps the ring
  commits in one interval]; ``steps_redone_logged`` / ``_per_kill_logged``: the same counted
  from the members' own step lines (:func:`redone_logged`), a check on the ledger;
* ``spend_ratio``: the chaos run's spend over the baseline's [<= 1.10].

Run: ``.venv/bin/python benchmarks/chaos.py [--kills 100] [--epochs 40] [--seed 1]``
(``--kills 5 --epochs 8`` is a CI-size run of a few minutes).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

log = logging.getLogger("chaos")

SNAPSHOT_EVERY_S = 60  # simulated seconds (1 real second at --speed 60)
SPEED = 60  # the runs' --speed
SETTLE_S = 5.0  # a worker's threads are counted from this long after its first step


def _wait(predicate: Any, timeout_s: float, step_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return False


def _threads(pid: int) -> int | None:
    """The thread count of ``pid`` (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _flags(args: argparse.Namespace) -> list[str]:
    return ["--outages-per-hour", "0", "--max-size", str(args.max_size), "--speed", str(SPEED),
            "--until-epochs", str(args.epochs), "--seed", str(args.seed)]


def _config(root: Path) -> Path:
    cfg = root / "chaos.toml"
    cfg.write_text(f'[fleet]\nmarkets = ["spot"]\nmax_size = 3\n[snapshot]\n'
                   f"every_s = {SNAPSHOT_EVERY_S}\n")
    return cfg


class Watch:
    """Samples the live workers: how many at once, and each one's threads."""

    def __init__(self, run: Any, max_size: int) -> None:
        self.run, self.max_size = run, max_size
        self.duplicates = 0
        self.member_since: dict[int, float] = {}  # pid -> when first seen as a member
        self.first: dict[int, int] = {}  # pid -> threads once it settled (trained a while)
        self.last: dict[int, int] = {}

    def _member(self, rec: dict[str, Any]) -> bool:
        """Has the worker committed a step (its step log is not empty)? Before that it is
        booting (importing, profiling, waiting to join) with fewer threads than a member
        has, and counting from there read as growth (a loaded machine boots for minutes)."""
        log = self.run.workdir / "workers" / f"{rec.get('id')}.jsonl"
        try:
            return log.stat().st_size > 0
        except OSError:
            return False

    def sample(self) -> list[dict[str, Any]]:
        live = self.run.workers()
        self.duplicates = max(self.duplicates, len(live) - self.max_size)
        now = time.monotonic()
        for r in live:
            pid = int(r["pid"])
            if not self._member(r):  # still booting: it has not trained a step
                continue
            since = self.member_since.setdefault(pid, now)
            n = _threads(pid)
            if n is not None and now - since >= SETTLE_S:  # its group and loaders started
                self.first.setdefault(pid, n)
                self.last[pid] = n
        return live


def chaos_run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The run with ``args.kills`` SIGKILLs (see the module docstring)."""
    from tests.fakes.local_run import RunProcess

    rng = random.Random(args.seed)
    run = RunProcess(root / "w", *_flags(args), config=_config(root))
    watch = Watch(run, args.max_size)
    kills = {"daemon": 0, "worker": 0}
    starts = 1
    try:
        run.start()
        if not _wait(lambda: run.training(1, 1), args.timeout_s):
            raise RuntimeError(f"no ring formed: {run.log()[-2000:]}")
        while sum(kills.values()) < args.kills and run.poll() is None:
            step = int(run.ring().get("step") or 0)
            _wait(lambda: int(run.ring().get("step") or 0) > step or run.poll() is not None,
                  args.timeout_s)
            pause = rng.uniform(0.0, args.max_gap_s)
            end = time.monotonic() + pause
            while time.monotonic() < end and run.poll() is None:
                watch.sample()
                time.sleep(0.2)
            if run.poll() is not None:
                break
            live = watch.sample()
            victims = ["daemon"] + [int(r["pid"]) for r in live]
            victim = rng.choice(victims)
            if victim == "daemon":
                run.send(signal.SIGKILL)
                run.wait(30)
                kills["daemon"] += 1
                time.sleep(args.down_s)
                starts += 1
                run.start(f"run{starts}.log")
            else:
                try:
                    os.killpg(int(victim), signal.SIGKILL)
                    kills["worker"] += 1
                except ProcessLookupError:
                    pass
            log.info("kill %d: %s", sum(kills.values()), victim)
        while run.poll() is None:  # to the end of the run, no more faults
            watch.sample()
            if not _wait(lambda: run.poll() is not None, 2.0):
                continue
        code = run.wait(30)
        time.sleep(1.0)
        orphans = len(run.workers())
        fig = run.report()
        trained_twice = _trained_twice(run)
        logged, interval_steps = redone_logged(_records(run))
    finally:
        run.close()
    growth = [watch.last[p] - watch.first[p] for p in watch.first]
    n = sum(kills.values())
    return {"kills": n, "kills_daemon": kills["daemon"], "kills_worker": kills["worker"],
            "exit_code": code, "outcome": fig.get("outcome"),
            "duplicates": max(0, watch.duplicates), "orphans": orphans,
            "threads_per_worker_first": sorted(watch.first.values()),
            "threads_per_worker_last": sorted(watch.last.values()),
            "threads_growth_max": max(growth, default=0),
            "runs_lost": int(fig.get("outcome") == "lost"),
            "runs_trained_twice": trained_twice,
            "steps_lost": fig.get("steps_lost"), "resumed_from": fig.get("resumed_from"),
            "steps_redone_per_kill": round(float(fig.get("steps_lost") or 0) / max(1, n), 3),
            "steps_redone_logged": logged,  # the members' step lines (not the ledger)
            "steps_redone_per_kill_logged": round(logged / max(1, n), 3),
            "snapshot_interval_steps": interval_steps,
            "spend_usd": fig.get("spend_usd"), "daemon_restarts": fig.get("daemon_restarts")}


def _records(run: Any) -> list[dict[str, Any]]:
    out = []
    for f in (run.workdir / "workers").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
                out.append({"t": float(rec["t"]), "step": int(rec["step"]),
                            "generation": int(rec.get("generation", 0))})
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return out


def redone_logged(records: list[dict[str, Any]], gap_s: float = 5.0) -> tuple[int, float]:
    """From the members' own step lines, independently of the daemon's ledger: the steps
    committed more than once (a step's lines come from one commit when they share its
    generation and lie within ``gap_s`` of each other; any other commit of it is a redo),
    and the steps per snapshot interval (steps a real second x the interval's real
    seconds, ``SNAPSHOT_EVERY_S`` / ``SPEED``, at least 1 s as the local run makes it)."""
    by_step: dict[int, list[tuple[float, int]]] = {}
    for r in records:
        by_step.setdefault(r["step"], []).append((r["t"], r["generation"]))
    redone = 0
    for lines in by_step.values():
        commits: list[tuple[float, int]] = []  # (last time, generation) of each commit
        for t, g in sorted(lines):
            for i, (last, cg) in enumerate(commits):
                if cg == g and t - last <= gap_s:
                    commits[i] = (t, g)
                    break
            else:
                commits.append((t, g))
        redone += len(commits) - 1
    if not records:
        return 0, 0.0
    span = max(r["t"] for r in records) - min(r["t"] for r in records)
    rate = len(by_step) / span if span > 0 else 0.0
    return redone, round(rate * max(1.0, SNAPSHOT_EVERY_S / SPEED), 1)


def _trained_twice(run: Any) -> int:
    """1 when the ring committed step 1 again after it had passed a snapshot interval: it
    started over instead of resuming (the member logs: one line per committed step)."""
    firsts: list[float] = []
    passed = 0
    for f in (run.workdir / "workers").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if int(rec.get("step", 0)) == 1:
                firsts.append(float(rec["t"]))
            passed = max(passed, int(rec.get("step", 0)))
    firsts.sort()
    # members of one generation log step 1 within a second of each other
    restarts = [t for a, t in zip(firsts, firsts[1:]) if t - a > 5.0]
    return int(bool(restarts) and passed > 0)


def baseline_run(root: Path, args: argparse.Namespace, timeout_s: float) -> dict[str, Any]:
    """The same job with no fault: its spend and steps (given up as timed out after
    ``timeout_s``)."""
    from tests.fakes.local_run import RunProcess

    run = RunProcess(root / "b", *_flags(args), config=_config(root), log_name="baseline.log")
    try:
        run.start()
        try:
            code = run.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return {"baseline_exit_code": None, "baseline_outcome": "timed out",
                    "baseline_spend_usd": None, "baseline_steps_lost": None}
        fig = run.report()
    finally:
        run.close()
    return {"baseline_exit_code": code, "baseline_outcome": fig.get("outcome"),
            "baseline_spend_usd": fig.get("spend_usd"),
            "baseline_steps_lost": fig.get("steps_lost")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs through the run")
    parser.add_argument("--epochs", type=int, default=40, help="the run's --until-epochs")
    parser.add_argument("--max-size", type=int, default=3, help="the fleet's size")
    parser.add_argument("--max-gap-s", type=float, default=3.0,
                        help="the longest pause before a kill (real seconds)")
    parser.add_argument("--down-s", type=float, default=1.0,
                        help="seconds a killed daemon stays down")
    parser.add_argument("--timeout-s", type=float, default=240.0,
                        help="how long the ring may take to move on after a kill")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the runs' work directories under this folder")
    parser.add_argument("--baseline-beside", action="store_true",
                        help="run the baseline at the same time as the chaos run, so both "
                             "see the same load (on a shared machine the load can change "
                             "between one run and the next)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    for name, v in (("--kills", args.kills), ("--epochs", args.epochs),
                    ("--max-size", args.max_size)):
        if v < 1:
            parser.error(f"{name} {v}: must be at least 1")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        stream=sys.stderr)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="spotring-chaos-") as tmp:
        root = Path(tmp) if args.keep is None else args.keep
        root.mkdir(parents=True, exist_ok=True)
        if args.baseline_beside:  # the no-fault job beside the chaos run, at the same load
            with ThreadPoolExecutor(1) as pool:
                beside = pool.submit(baseline_run, root, args,
                                     args.timeout_s * (4 + args.kills))
                figures = chaos_run(root, args)
                figures.update(beside.result())
        else:  # after it: as long as the chaos run took, and more
            figures = chaos_run(root, args)
            figures.update(baseline_run(root, args, max(args.timeout_s * 4,
                                                        3.0 * (time.monotonic() - t0))))
        figures["baseline"] = "beside" if args.baseline_beside else "after"
    base = figures.get("baseline_spend_usd") or 0.0
    figures["spend_ratio"] = round(figures["spend_usd"] / base, 3) if base else None
    figures["snapshot_interval_s"] = SNAPSHOT_EVERY_S
    figures["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(figures, sort_keys=True), flush=True)
    bad = figures["duplicates"] + figures["orphans"] + figures["runs_lost"] \
        + figures["runs_trained_twice"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
