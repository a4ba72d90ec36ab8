"""Benchmark: crash safety and notice reaction of the daemon on the AWS driver (moto server).

Design: the same outline as every benchmark here (small defaults, one JSON line on stdout,
logs on stderr, a baseline measured in the same run). Two measures, both against a moto
server reached over HTTP (``tests/fakes/aws_world.py``):

1. ``--trials`` SIGKILL trials (default 100, as issue 6 asks): a forked daemon is killed
   before or after its k-th launch or terminate call, or after a random delay; a new daemon
   recovers on the same state file. Counted: ``orphans`` (alive in EC2, not held by the
   state; goal 0) and ``duplicates`` (instances beyond an intent's count or the fleet size;
   goal 0). Baseline: ``baseline_orphans_without_recovery``, the instances a daemon that did
   not run recovery (no write-ahead intents, no tag listing) would have lost track of.
2. ``--notices`` interruption warnings put through EventBridge -> SQS to a running daemon
   (scheduler on, ``notice_poll_s`` default 2 s as in provisioner/timing.py); measured from
   ``put_events`` to the replacement's launch call: ``notice_to_launch_p95_s`` (goal <= 5).
   Baseline: the describe-instances fallback alone would notice after up to
   ``DESCRIBE_FALLBACK_S`` (reported, not waited for).

Run: ``.venv/bin/python benchmarks/daemon_crash.py [--trials 100] [--notices 10] [--seed 1]``.
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


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(0.95 * len(ordered) + 0.5)) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="SIGKILL trials")
    parser.add_argument("--notices", type=int, default=10, help="interruption warnings timed")
    parser.add_argument("--notice-poll-s", type=float, default=None,
                        help="the daemon's notice period (default: provisioner.timing's)")
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
    figures.update({
        "notices": len(lat),
        "notice_to_launch_p95_s": round(p95(lat), 3) if lat else None,
        "notice_to_launch_p50_s": round(statistics.median(lat), 3) if lat else None,
        "notice_poll_s": poll,
        "baseline_describe_fallback_s": DESCRIBE_FALLBACK_S,
        "seconds": round(time.monotonic() - t0, 1),
    })
    print(json.dumps(figures))
    return 0 if figures["orphans"] == 0 and figures["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
