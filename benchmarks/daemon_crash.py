"""Benchmark: crash safety of the daemon: SIGKILLed at any point, on the AWS driver (moto
server) and the local driver, and SIGKILLed while the ring trains (issues 6 and 15).

Design: the same outline as every benchmark here (small defaults, one JSON line on stdout,
logs on stderr, a baseline measured in the same run). Four measures:

1. ``--trials`` SIGKILL trials on the AWS driver (moto server over HTTP,
   ``tests/fakes/aws_world.py``): a forked daemon is killed before or after its k-th launch
   or terminate call, or after a random delay; a new daemon recovers on the same state file.
   Counted: ``orphans`` (alive in EC2, not held by the state; goal 0) and ``duplicates``
   (instances beyond an intent's count or the fleet size; goal 0). Baseline:
   ``baseline_orphans_without_recovery``, what a daemon without recovery would lose track of.
2. ``--notices`` interruption warnings through EventBridge -> SQS to a running daemon; from
   ``put_events`` to the replacement's launch call: ``notice_to_launch_p95_s`` (goal <= 5).
   Baseline: the describe-instances fallback's period ``DESCRIBE_FALLBACK_S``.
3. ``--local-trials`` the same SIGKILL trials on the local driver (worker processes of
   ``tests/fakes/local_worker.py`` in their own sessions): ``local_orphans``,
   ``local_duplicates`` (goal 0), ``local_killed_by_recovery`` (instances of the job a
   restart ended though no termination the daemon had decided named them; goal 0: it
   adopts); baseline ``local_baseline_orphans_without_recovery``.
4. ``--training-kills`` kills of ``provision run`` itself while the main job trains
   (``tests/fakes/local_run.py``: the real daemon, the real ring): each kill, the daemon is
   SIGKILLed, left down ``--down-s`` seconds, and started again on the same workdir.
   ``steps_lost_per_kill`` (what each restart cost the ring, from the run's ledger; goal 0),
   ``steps_trained_while_down`` (the ring trains on without the daemon), ``adopt_s`` (restart
   to the coordinator's ``adopted`` event; ``daemon_up_s`` of it is the new daemon's own
   start, imports included), against the baselines measured in the same run:
   ``cold_start_s`` (a fresh run to its first formed ring: ``adopt_to_cold_start`` is the
   ratio) and ``baseline_steps_lost_per_kill`` (the steps trained at each kill: what a daemon
   that wipes its workdir and trains from epoch 0, as before issue 15, lost).

Run: ``.venv/bin/python benchmarks/daemon_crash.py [--trials 100] [--notices 10]
[--local-trials 20] [--training-kills 2] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

log = logging.getLogger("daemon_crash")


class TimedDriver:
    """Records the wall time of every launch call of the wrapped driver."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.launch_times = inner, inner.name, []

    def launch(self, request):
        self.launch_times.append(time.monotonic())
        return self.inner.launch(request)

    def terminate(self, ids):
        return self.inner.terminate(ids)

    def list(self, job_id):
        return self.inner.list(job_id)

    def notices(self):
        return self.inner.notices()

    def can_place(self, offering):
        return self.inner.can_place(offering)


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def crash_trials(world, n: int, seed: int, workdir: Path) -> dict:
    from tests.fakes.aws_world import crash_trial

    rng = random.Random(seed)
    results = [crash_trial(world, workdir, i, rng) for i in range(n)]
    return {
        "trials": n,
        "orphans": sum(r.orphans for r in results),
        "duplicates": sum(r.duplicates for r in results),
        "baseline_orphans_without_recovery": sum(r.orphans_without_recovery for r in results),
        "kill_points": dict(Counter(r.point for r in results)),
    }


def notice_latency(world, n: int, notice_poll_s: float, workdir: Path) -> list[float]:
    """Seconds from put_events (interruption warning) to the replacement's launch call."""
    from provisioner.drivers.aws import AwsDriver
    from tests.fakes.aws_world import build_daemon

    settings = world.settings("bench-notice", notice_poll_s=notice_poll_s, plan_s=600.0,
                              zone_avoid_ttl_s=1.0)
    driver = TimedDriver(AwsDriver(settings.aws))
    d = build_daemon(settings, workdir / "notice.sqlite", driver)
    d.start()
    out = []
    try:
        for i in range(n):
            live = [r for r in d.state.live_instances() if r.draining_since is None]
            victim = live[i % len(live)].id
            calls = len(driver.launch_times)
            t0 = time.monotonic()
            world.interrupt(victim)
            if not _wait(lambda: len(driver.launch_times) > calls, 30):
                log.warning("notice %d: no replacement launch within 30 s", i)
                out.append(float("inf"))
                continue
            out.append(driver.launch_times[calls] - t0)
            # the window ends: EC2 takes it back and says so; the daemon closes the instance
            world.ec2.terminate_instances(InstanceIds=[victim])
            world.state_change(victim, "shutting-down")
            _wait(lambda: victim not in {r.id for r in d.state.live_instances()}, 30)
            time.sleep(1.0)  # past the zone-avoid TTL, so every round has the same choices
    finally:
        d.stop("terminate")
    return out


def local_crash_trials(n: int, seed: int, workdir: Path) -> dict:
    """Measure 3: SIGKILL trials on the local driver (see the module docstring)."""
    rng = random.Random(seed)
    res = [_local_trial(workdir / f"t{i}", i, rng) for i in range(n)]
    return {"local_trials": n, "local_orphans": sum(r["orphans"] for r in res),
            "local_duplicates": sum(r["duplicates"] for r in res),
            "local_killed_by_recovery": sum(r["killed"] for r in res),
            "local_baseline_orphans_without_recovery": sum(r["baseline"] for r in res)}


def _local_parts(root: Path):
    from datetime import datetime, timezone

    from pricing.sources import synthetic
    from pricing.sources.trace import TraceSource
    from provisioner.config import parse_settings
    from provisioner.daemon.state import State
    from provisioner.daemon.wiring import build_daemon
    from provisioner.drivers.local import LocalDriver
    from tests.fakes.ring import FakeRing

    fake = REPO / "tests" / "fakes" / "local_worker.py"
    (root / "out").mkdir(parents=True, exist_ok=True)
    snap = synthetic.generate(synthetic.GeneratorParams(outages_per_hour=0.0))
    now = lambda: datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)  # noqa: E731
    settings = parse_settings({"fleet": {"max_size": 3, "markets": ["spot"],
                                         "max_zone_share": 0.5}})

    def make(driver_wrap=lambda d: d):
        drv = LocalDriver(root / "cloud", lambda s: [sys.executable, str(fake), str(root / "out"),
                                                     s.instance_id],
                          clock=now, terminate_grace_s=0.5)
        return build_daemon(settings, driver_wrap(drv), TraceSource([], snapshot=snap),
                            State(root / "state.sqlite"), now=now, coordinator=FakeRing())
    return make


def _local_child(root: Path, point: str, k: int, reached) -> None:
    import logging as _logging

    _logging.disable(_logging.CRITICAL)
    from tests.fakes.aws_world import PausingDriver

    make = _local_parts(root)
    d = make(lambda drv: drv if point == "random" else PausingDriver(drv, point, k, reached))
    if point == "random":
        reached.set()
    d.recover()
    d.poll_prices()
    d.plan_and_reconcile("start")
    d.stop("terminate")
    reached.set()
    while True:
        time.sleep(60)


def _local_trial(root: Path, n: int, rng: random.Random) -> dict:
    import multiprocessing

    from provisioner.daemon.state import State
    from provisioner.drivers.local import running
    from tests.fakes.aws_world import KILL_POINTS, kill_at_point

    point = KILL_POINTS[n % len(KILL_POINTS)]
    k = rng.choice((1, 2)) if point.startswith("launch") else 1
    root.mkdir(parents=True)
    kill_at_point(_local_child, (root, point, k), point, k, rng, 1.0,
                  multiprocessing.get_context("fork").Event())
    job = "spotring-demo"
    held = {r.id for r in State(root / "state.sqlite").live_instances()}
    before = {r["id"] for r in running(root / "cloud", job)}
    d = _local_parts(root)()
    d.recover()
    alive = {r["id"] for r in running(root / "cloud", job)}
    live = {r.id for r in d.state.live_instances()}
    asked = {i.token: i.count for i in d.state.intents() if i.kind == "launch"}
    per_token = Counter(r["token"] for r in _records(root / "cloud"))
    meant = {iid for i in d.state.intents() if i.kind == "terminate" for iid in i.instance_ids}
    out = {"orphans": len(alive - live), "baseline": len(before - held),
           "killed": len(before - alive - meant),  # ended though no termination named them
           "duplicates": sum(max(0, c - asked.get(t, 0)) for t, c in per_token.items())}
    d.stop("terminate")
    d.state.close()
    return out


def _records(cloud: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cloud / "instances").glob("*.json"))]


def training_kills(kills: int, down_s: float, workdir: Path, adopt_timeout_s: float) -> dict:
    """Measure 4: SIGKILL ``provision run`` while the main job trains (module docstring)."""
    import signal

    from tests.fakes.local_run import RunProcess

    run = RunProcess(workdir / "w", "--speed", "60", "--until-epochs", "1000",
                     "--outages-per-hour", "0", "--max-size", "3")
    lost, trained_down, adopt, up, at_kill = [], [], [], [], []
    try:
        t0 = time.monotonic()
        run.start()
        if not _wait(lambda: run.training(3, 1), 240):
            raise RuntimeError(f"no ring formed: {run.log()[-2000:]}")
        cold = time.monotonic() - t0
        for i in range(kills):
            target = int(run.ring().get("step") or 0) + 30
            if not _wait(lambda: run.training(3, target), 240):
                raise RuntimeError(f"kill {i}: the ring did not train: {run.log()[-2000:]}")
            before = dict(run.meta("ledger") or {})
            times = run.step_times()
            step_kill = max(times) if times else 0
            at_kill.append(step_kill)
            run.send(signal.SIGKILL)
            run.wait(10)
            t_kill = time.time()
            time.sleep(down_s)
            t_up = time.time()
            trained_down.append(sum(1 for s, t in run.step_times().items() if t_kill < t < t_up))
            t1 = time.monotonic()
            run.start(f"run{i + 2}.log")
            # this restart's own marks (the meta's last stats are the dead daemon's until the
            # new one writes): its "continued" event, then the coordinator's "adopted" event
            ok_up = _wait(lambda: len(run.events("continued")) > i, adopt_timeout_s)
            up.append(round(time.monotonic() - t1, 3) if ok_up else None)
            ok = _wait(lambda: len(run.events("ring-adopted")) > i, adopt_timeout_s)
            adopt.append(round(time.monotonic() - t1, 3) if ok else None)
            _wait(lambda: (run.meta("ledger") or {}).get("lives") == i + 2
                  and (run.meta("ledger") or {}).get("settled"), adopt_timeout_s)
            after = run.meta("ledger") or {}
            lost.append(int(after.get("restart_lost", 0)) - int(before.get("restart_lost", 0)))
        run.send(signal.SIGINT)
        run.wait(120)
    finally:
        run.close()
    done = [a for a in adopt if a is not None]
    return {"training_kills": kills, "steps_lost_per_kill": lost,
            "steps_trained_while_down": trained_down, "down_s": down_s,
            "adopt_s": adopt, "daemon_up_s": up, "cold_start_s": round(cold, 3),
            "adopt_to_cold_start": round(max(done) / cold, 3) if done else None,
            "baseline_steps_lost_per_kill": at_kill}


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(0.95 * len(ordered) + 0.5)) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="SIGKILL trials")
    parser.add_argument("--notices", type=int, default=10, help="interruption warnings timed")
    parser.add_argument("--notice-poll-s", type=float, default=None,
                        help="the daemon's notice period (default: provisioner.timing's)")
    parser.add_argument("--local-trials", type=int, default=20,
                        help="SIGKILL trials on the local driver (0: skip)")
    parser.add_argument("--training-kills", type=int, default=2,
                        help="kills of provision run while the main job trains (0: skip)")
    parser.add_argument("--down-s", type=float, default=2.0,
                        help="seconds the daemon stays down at each kill")
    parser.add_argument("--adopt-timeout-s", type=float, default=60.0,
                        help="how long a restart may take to adopt the ring")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    from provisioner.timing import DESCRIBE_FALLBACK_S
    from provisioner.timing import NOTICE_POLL_S
    from tests.fakes.aws_world import AwsWorld

    poll = args.notice_poll_s if args.notice_poll_s is not None else NOTICE_POLL_S
    t0 = time.monotonic()
    world = AwsWorld()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            figures = crash_trials(world, args.trials, args.seed, Path(tmp))
            lat = notice_latency(world, args.notices, poll, Path(tmp)) if args.notices else []
    finally:
        world.close()
    with tempfile.TemporaryDirectory() as tmp:
        if args.local_trials:
            figures.update(local_crash_trials(args.local_trials, args.seed, Path(tmp) / "l"))
        if args.training_kills:
            figures.update(training_kills(args.training_kills, args.down_s, Path(tmp) / "r",
                                          args.adopt_timeout_s))
    figures.update({
        "notices": len(lat),
        "notice_to_launch_p95_s": round(p95(lat), 3) if lat else None,
        "notice_to_launch_p50_s": round(statistics.median(lat), 3) if lat else None,
        "notice_poll_s": poll,
        "baseline_describe_fallback_s": DESCRIBE_FALLBACK_S,
        "seconds": round(time.monotonic() - t0, 1),
    })
    print(json.dumps(figures))
    bad = figures["orphans"] + figures["duplicates"] + figures.get("local_orphans", 0) \
        + figures.get("local_duplicates", 0) + figures.get("local_killed_by_recovery", 0)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
