"""Crash safety: the daemon (a forked process on the AWS driver, over HTTP to a moto server)
is SIGKILLed before and after launch and terminate calls, and at random times; a new daemon
on the same state file recovers. After each of the 20 seeded trials: no orphaned and no
duplicated instance in moto, and the fleet is back to its size."""

from __future__ import annotations

import random
import sys

import pytest

pytest.importorskip("moto.server")
if sys.platform == "win32":  # pragma: no cover
    pytest.skip("fork and SIGKILL", allow_module_level=True)

from tests.fakes.aws_world import KILL_POINTS, AwsWorld, crash_trial  # noqa: E402

pytestmark = pytest.mark.slow
TRIALS = 20


@pytest.fixture(scope="module")
def world():
    w = AwsWorld()
    yield w
    w.close()


def test_sigkill_during_launch_and_terminate_leaves_no_orphans_or_duplicates(world, tmp_path):
    rng = random.Random(20261121)
    # The post-recovery plan round (the fleet back to size, no duplicates) runs after kills
    # that can leave a launch half done; after terminate kills recovery alone is checked.
    results = [crash_trial(world, tmp_path, n, rng,
                           replan=not KILL_POINTS[n % len(KILL_POINTS)].startswith("terminate"))
               for n in range(TRIALS)]
    bad = [r for r in results if r.orphans or r.duplicates]
    assert not bad, f"orphans or duplicates after recovery: {bad}"
    assert {r.point for r in results} == set(KILL_POINTS)
    assert all(r.alive_after == 3 for r in results if not r.point.startswith("terminate"))
    # The kills did land inside the launch window: without recovery they leave orphans.
    assert sum(r.orphans_without_recovery for r in results if r.point == "launch:after") > 0
    assert all(world.instances(r.job) == [] for r in results)  # each trial cleaned up
