"""Benchmark: every worker SIGKILLed at once while the main job trains (issue 15): the ring
resumes from the newest snapshot, losing at most one interval, and the snapshots cost the
ring at most 1% of its throughput.

Design: the same outline as every benchmark here (small defaults, one JSON line on stdout,
logs on stderr, a baseline measured in the same run). Two ``provision run`` (the local main
job: the real daemon, coordinator and ring, run by ``tests/fakes/local_run.py``), alike but
for the snapshots, train SIDE BY SIDE, so that both share the machine's load alike (two
runs one after the other on a shared machine differ by more than the 1% measured):

- **baseline**: snapshots off (``[snapshot] every_s = 0``);
- **snapshots** every ``--every-s`` simulated seconds (``every_s / --speed`` real seconds,
  as ``provision run`` passes it).

Once both rings of ``--workers`` train steadily, their rates (committed steps per real
second, from the workers' per-step metrics) are taken over the same ``--repeats`` windows of
``--window-s``: ``snapshot_throughput_ratio`` is the median of the per-window ratios (goal
>= 0.99). Then every worker of each ring is SIGKILLed at once:

- the baseline, with nothing to resume from, is lost: ``baseline_exit_code`` (3) and
  ``baseline_steps_lost``, every step it had trained (the figure issue 15 started from);
- the snapshot ring resumes from the newest complete snapshot: ``resumed_from``,
  ``steps_lost`` (the last step committed before the kill minus ``resumed_from``),
  ``interval_steps`` (the steps one interval holds at the measured rate),
  ``lost_over_interval`` (goal <= 1) and ``recover_s`` (the kill to the first step the
  resumed ring committed).

Run: ``.venv/bin/python benchmarks/ring_loss.py [--every-s 300] [--speed 60] [--window-s 10]
[--repeats 3]``.
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


def _records(workdir: Path) -> list[tuple[int, float]]:
    """(step, wall time) of every step record of every worker (steps redone after a resume
    included: :meth:`RunProcess.step_times` keeps only a step's first time)."""
    out = []
    for f in (workdir / "workers").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
                out.append((int(rec["step"]), float(rec["t"])))
            except (ValueError, KeyError):
                continue
    return out


def config(path: Path, workers: int, every_s: float, job: str | None) -> Path:
    path.write_text(f'[fleet]\nmarkets = ["spot"]\nmax_size = {workers}\n'
                    f"[snapshot]\nevery_s = {every_s}\nevery_steps = 0\n"
                    + (f"[job]\njob_file = {json.dumps(job)}\n" if job else ""))
    return path


def rates(runs: list, window_s: float) -> list[float]:
    """Each run's committed steps per real second over the same next ``window_s`` seconds."""
    t0 = time.time()
    time.sleep(window_s)
    t1 = time.time()
    out = []
    for run in runs:
        times = sorted(t for t in run.step_times().values() if t0 <= t <= t1)
        out.append((len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0)
    return out


def start(workdir: Path, *, workers: int, every_s: float, speed: float, job: str | None):
    from tests.fakes.local_run import RunProcess

    workdir.parent.mkdir(parents=True, exist_ok=True)
    return RunProcess(workdir, "--speed", str(speed), "--until-epochs", "100000",
                      "--outages-per-hour", "0", "--max-size", str(workers),
                      config=config(workdir.parent / "run.toml", workers, every_s, job)).start()


def kill_lost(run) -> dict:
    """Kill every worker of the baseline ring: with no snapshot the job is lost."""
    at_kill = max(run.step_times())
    run.kill_workers()
    log.info("baseline: killed every worker at step %d", at_kill)
    code = run.wait(120)
    return {"at_kill": at_kill, "exit_code": code, "report": run.report()}


def kill_resumed(run) -> dict:
    """Kill every worker of the snapshot ring once a snapshot is complete; time the resume."""
    _wait(lambda: run.ring().get("snapshot"), 60, run)
    at_kill = max(run.step_times())
    t_kill = time.time()
    run.kill_workers()
    log.info("snapshots: killed every worker at step %d", at_kill)
    ok = _wait(lambda: run.ring().get("resumed_from") is not None
               and int(run.ring().get("step") or 0) > int(run.ring()["resumed_from"]), 180, run)
    resumed = run.ring().get("resumed_from") if ok else None
    out: dict = {"at_kill": at_kill, "resumed_from": resumed, "recover_s": None}
    if resumed is not None:  # the first step the resumed ring committed (a redone number)
        redone = [t for s, t in _records(run.workdir) if t > t_kill and s <= int(resumed) + 1]
        out["recover_s"] = round(min(redone) - t_kill, 3) if redone else None
    if run.poll() is None:
        run.send(signal.SIGINT)
    out["exit_code"] = run.wait(120)
    out["report"] = run.report()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--every-s", type=float, default=300.0,
                        help="snapshot interval, simulated seconds (default [snapshot] every_s)")
    parser.add_argument("--speed", type=float, default=60.0)
    parser.add_argument("--window-s", type=float, default=10.0,
                        help="real seconds of each throughput window")
    parser.add_argument("--repeats", type=int, default=3,
                        help="throughput windows (both rings measured in each)")
    parser.add_argument("--job", default=None,
                        help="job file (default job.job_file, examples/digits.py)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t0 = time.monotonic()
    kw = dict(workers=args.workers, speed=args.speed, job=args.job)
    with tempfile.TemporaryDirectory() as tmp:
        base_run = start(Path(tmp) / "baseline" / "w", every_s=0.0, **kw)
        snap_run = start(Path(tmp) / "snapshots" / "w", every_s=args.every_s, **kw)
        try:
            for run in (base_run, snap_run):
                if not _wait(lambda: run.training(args.workers, 20), 300, run):
                    raise RuntimeError(f"no steady ring: {run.log()[-2000:]}")
            windows = [rates([base_run, snap_run], args.window_s) for _ in range(args.repeats)]
            base = kill_lost(base_run)
            snap = kill_resumed(snap_run)
        finally:
            base_run.close()
            snap_run.close()
    base_rate = statistics.median(w[0] for w in windows)
    snap_rate = statistics.median(w[1] for w in windows)
    ratio = statistics.median(w[1] / w[0] for w in windows if w[0] > 0) if any(
        w[0] > 0 for w in windows) else None
    real_interval = max(1.0, args.every_s / args.speed)  # as provision run passes it
    interval_steps = snap_rate * real_interval
    resumed = snap.get("resumed_from")
    lost = snap["at_kill"] - int(resumed) if resumed is not None else None
    figures = {
        "workers": args.workers, "every_s": args.every_s, "speed": args.speed,
        "real_interval_s": real_interval,
        "baseline_steps_per_s": round(base_rate, 3),
        "snapshot_steps_per_s": round(snap_rate, 3),
        "snapshot_throughput_ratio": round(ratio, 4) if ratio else None,
        "window_ratios": [round(w[1] / w[0], 4) if w[0] else None for w in windows],
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
