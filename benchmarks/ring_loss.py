"""Benchmark: every worker SIGKILLed at once while the main job trains (issue 15): the ring
resumes from the newest snapshot, losing at most one interval, and the snapshots cost the
ring at most 1% of its throughput.

Design: the same outline as every benchmark here (small defaults, one JSON line on stdout,
logs on stderr, a baseline measured in the same run). ``provision run`` (the local main job:
the real daemon, coordinator and ring, run by ``tests/fakes/local_run.py``) is started twice,
alike but for the snapshots:

1. **baseline**, snapshots off (``[snapshot] every_s = 0``): once the ring of ``--workers``
   trains steadily, its rate (committed steps per real second over ``--window-s``, from the
   workers' per-step metrics) is measured, then every worker is SIGKILLed at once. With
   nothing to resume from the job is lost: ``baseline_exit_code`` (3), and
   ``baseline_steps_lost``, every step it had trained (the figure issue 15 started from);
2. **snapshots** every ``--every-s`` simulated seconds (``every_s / --speed`` real seconds,
   as ``provision run`` passes it): the same window, then the same kill. The replacements
   resume from the newest complete snapshot: ``resumed_from``, ``steps_lost`` (the last
   step committed before the kill minus ``resumed_from``), ``interval_steps`` (the steps one
   snapshot interval holds at the measured rate) and ``lost_over_interval`` (goal <= 1),
   ``recover_s`` (the kill to the first step committed after the resumption).

``snapshot_throughput_ratio`` is the snapshots' rate over the baseline's (goal >= 0.99);
``--repeats`` alternates more baseline/snapshot windows, for a noisy machine (the figure is
the ratio of the medians). Run: ``.venv/bin/python benchmarks/ring_loss.py [--every-s 300]
[--speed 60] [--window-s 20] [--repeats 1]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

log = logging.getLogger("ring_loss")


def _wait(predicate, timeout_s: float, run=None) -> bool:
    """Poll ``predicate``; False at the timeout or as soon as ``run``'s daemon exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if run is not None and run.poll() is not None:
            break
        time.sleep(0.1)
    return bool(predicate())


def _record_times(workdir: Path) -> list[float]:
    """The wall time of every step record of every worker (steps redone after a resume
    included: :meth:`RunProcess.step_times` keeps only a step's first time)."""
    out = []
    for f in (workdir / "workers").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                out.append(float(json.loads(line)["t"]))
            except (ValueError, KeyError):
                continue
    return out


def config(path: Path, workers: int, every_s: float, job: str | None) -> Path:
    path.write_text(f'[fleet]\nmarkets = ["spot"]\nmax_size = {workers}\n'
                    f"[snapshot]\nevery_s = {every_s}\nevery_steps = 0\n"
                    + (f"[job]\njob_file = {json.dumps(job)}\n" if job else ""))
    return path


def rate(run, window_s: float) -> float:
    """Committed steps per real second over the next ``window_s`` seconds."""
    t0 = time.time()
    time.sleep(window_s)
    t1 = time.time()
    times = sorted(t for t in run.step_times().values() if t0 <= t <= t1)
    if len(times) < 2:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


def phase(workdir: Path, *, workers: int, every_s: float, speed: float, window_s: float,
          repeats: int, kill: bool, job: str | None) -> dict:
    """One ``provision run``: steady rates over ``repeats`` windows, then (``kill``) every
    worker SIGKILLed at once and what followed."""
    from tests.fakes.local_run import RunProcess

    workdir.parent.mkdir(parents=True, exist_ok=True)
    run = RunProcess(workdir, "--speed", str(speed), "--until-epochs", "100000",
                     "--outages-per-hour", "0", "--max-size", str(workers),
                     config=config(workdir.parent / f"{workdir.name}.toml", workers, every_s, job))
    out: dict = {}
    try:
        run.start()
        if not _wait(lambda: run.training(workers, 20), 240, run):
            raise RuntimeError(f"no steady ring: {run.log()[-2000:]}")
        out["rates"] = [rate(run, window_s) for _ in range(repeats)]
        if not kill:
            return out
        if every_s > 0:  # let a snapshot complete after the window (the kill is at a random
            _wait(lambda: run.ring().get("snapshot"), 60, run)  # point of an interval after it)
        times = run.step_times()
        at_kill = max(times)
        t_kill = time.time()
        run.kill_workers()
        log.info("killed every worker at step %d", at_kill)
        out["at_kill"] = at_kill
        if every_s <= 0:
            out["exit_code"] = run.wait(120)
            out["report"] = run.report()
            return out
        ok = _wait(lambda: run.ring().get("resumed_from") is not None
                   and int(run.ring().get("step") or 0) > int(run.ring()["resumed_from"]), 180,
                   run)
        out["resumed_from"] = run.ring().get("resumed_from") if ok else None
        after = [t for t in _record_times(run.workdir) if t > t_kill]
        out["recover_s"] = round(min(after) - t_kill, 3) if ok and after else None
        if run.poll() is None:
            run.send(signal.SIGINT)
        out["exit_code"] = run.wait(120)
        out["report"] = run.report()
        return out
    finally:
        run.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--every-s", type=float, default=300.0,
                        help="snapshot interval, simulated seconds (default [snapshot] every_s)")
    parser.add_argument("--speed", type=float, default=60.0)
    parser.add_argument("--window-s", type=float, default=15.0,
                        help="real seconds of each throughput window")
    parser.add_argument("--repeats", type=int, default=1,
                        help="throughput windows per run")
    parser.add_argument("--job", default=None,
                        help="job file (default job.job_file, examples/digits.py)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t0 = time.monotonic()
    kw = dict(workers=args.workers, speed=args.speed, window_s=args.window_s,
              repeats=args.repeats, kill=True, job=args.job)
    with tempfile.TemporaryDirectory() as tmp:
        base = phase(Path(tmp) / "baseline" / "w", every_s=0.0, **kw)
        snap = phase(Path(tmp) / "snapshots" / "w", every_s=args.every_s, **kw)
    base_rate = statistics.median(base["rates"])
    snap_rate = statistics.median(snap["rates"])
    real_interval = max(1.0, args.every_s / args.speed)  # as provision run passes it
    interval_steps = snap_rate * real_interval
    resumed = snap.get("resumed_from")
    lost = snap["at_kill"] - int(resumed) if resumed is not None else None
    figures = {
        "workers": args.workers, "every_s": args.every_s, "speed": args.speed,
        "real_interval_s": real_interval,
        "baseline_steps_per_s": round(base_rate, 3),
        "snapshot_steps_per_s": round(snap_rate, 3),
        "snapshot_throughput_ratio": round(snap_rate / base_rate, 4) if base_rate else None,
        "baseline_exit_code": base.get("exit_code"),
        "baseline_steps_lost": base.get("report", {}).get("steps_lost"),
        "baseline_outcome": base.get("report", {}).get("outcome"),
        "at_kill": snap["at_kill"], "resumed_from": resumed, "steps_lost": lost,
        "reported_steps_lost": snap.get("report", {}).get("steps_lost"),
        "interval_steps": round(interval_steps, 1),
        "lost_over_interval": round(lost / interval_steps, 3) if lost is not None and
        interval_steps else None,
        "recover_s": snap.get("recover_s"), "exit_code": snap.get("exit_code"),
        "seconds": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(figures))
    return 0 if lost is not None and lost <= interval_steps + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
