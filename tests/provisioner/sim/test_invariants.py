"""The issue-28 invariants as the benchmarks measure them, on small worlds worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from pricing.model import Availability, Offering, PriceQuote, Snapshot
from provisioner.sim.engine import simulate_policy
from provisioner.sim.invariants import check, empty_late_hours, unpaid_swaps
from provisioner.sim.result import Life, Result
from provisioner.sim.world import build_world
from tests.provisioner.sim.test_simulate import A, SPEED, at, params

B = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "spot")


def test_spot_that_never_comes_leaves_no_empty_fleet_while_late_and_costs_on_demand_at_most():
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 0), Availability(A, at(20), 0))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=8)
    p = params(size=4, max_size=8, boot_s=180, model_mb=12.5, global_batch=256)
    runs = {n: simulate_policy(world, n, p, work=3.6e6) for n in ("spotring", "on-demand")}
    inv = check(runs, world, p, deadline_h=None)
    assert inv["empty_late_h"] == 0.0 and inv["finished"]
    assert inv["cost_vs_on_demand"] <= 1.0 + 1e-9


def test_an_empty_fleet_counts_only_while_the_floor_is_positive():
    # 360,000 samples, the job's own pace 100/s (1 h); nothing held the whole first hour:
    # the slack against 4 on-demand (the fastest ring, 400/s; no boot, no launch rounds)
    # runs out at 0.75 h: the last quarter hour is "empty while behind"; with a hard 10 h
    # deadline and its 2 h safety margin the first hour is not behind
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 4), Availability(A, at(5), 4))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    p = params(size=1, max_size=4, boot_s=0)
    run = Result("spotring", 0.0, 0.0, 360_000, None, None,
                 series=([0.0, 1.0], [0, 0], [0.0, 0.0], [0.0, 0.0]))
    late = empty_late_hours(run, world, p, deadline_h=1.0, hard=False)
    assert late == pytest.approx(0.25)  # from 0.75 h: 360,000 at 400/s take the 0.25 h left
    assert empty_late_hours(run, world, p, deadline_h=10.0, hard=True) == 0.0


def test_a_swap_for_a_cheaper_instance_revoked_before_it_paid_back_is_counted():
    # an on-demand instance ($4/h) dropped at 1 h for a spot one ($1/h) revoked 0.05 h later:
    # a 180 s boot pays back in 180 x 1 / 3 = 60 s of saving: 0.05 h < 0.05 + 0.0167 h: unpaid
    od = A.with_market("on-demand")
    lives = [Life(od, 0.0, 0.05, 1.0, False, 4.0), Life(A, 1.0, 1.05, 1.05, True, 0.05)]
    run = Result("spotring", 4.05, 1.0, 1.0, 1.05, None, lives=lives)
    assert unpaid_swaps(run, boot_s=180.0) == (1, pytest.approx(0.05))
    kept = [Life(od, 0.0, 0.05, 1.0, False, 4.0), Life(A, 1.0, 1.05, 3.0, True, 2.0)]
    assert unpaid_swaps(Result("spotring", 6.0, 1.0, 1.0, 3.0, None, lives=kept), 180.0)[0] == 0


def test_a_move_at_the_same_price_is_no_swap_for_a_cheaper_one():
    # two zones at $0.918/h: the hourly prices rebuilt from cost / hours differ in the 15th
    # digit (the p-4node window at +264 h counted such ring moves with a payback of 2e14 h)
    other = dataclasses.replace(A, zone=A.zone + "x")
    lives = [Life(A, 0.0, 0.05, 1.0833333333333333, False, 0.918 * 1.0833333333333333 + 1e-14),
             Life(other, 1.0833333333333333, 1.13, 1.5, True, 0.918 * (1.5 - 1.0833333333333333))]
    run = Result("spotring", 1.4, 1.0, 1.0, 1.5, None, lives=lives)
    old_p = lives[0].cost / lives[0].ended_h
    new_p = lives[1].cost / (lives[1].ended_h - lives[1].launched_h)
    assert new_p < old_p  # what the check used to read as a saving
    assert unpaid_swaps(run, boot_s=180.0) == (0, 0.0)


def test_the_engine_measures_time_empty_while_the_planner_says_it_is_behind():
    # spot never comes: spotring waits while its slack lasts (not behind), then is behind and
    # holds on-demand: never empty while behind (the launch itself counts as held)
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 0), Availability(A, at(20), 0))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=8)
    p = params(size=4, max_size=8, boot_s=180, model_mb=12.5, global_batch=256)
    ours = simulate_policy(world, "spotring", p, work=3.6e6)
    assert ours.empty_behind_h == 0.0 and ours.finished


class _BehindAndIdle:
    """Says it is behind and buys nothing (what the invariant forbids)."""

    name, mode = "idle", "hot"

    def __init__(self, p) -> None:
        pass

    def decide(self, v):
        from provisioner.sim.policies import Decision
        return Decision({}, behind=v.t - v.start >= 3600.0)


def test_empty_while_behind_is_measured(monkeypatch):
    from provisioner.sim.policies import POLICIES
    monkeypatch.setitem(POLICIES, "idle", _BehindAndIdle)
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 4), Availability(A, at(5), 4))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    r = simulate_policy(world, "idle", params(), work=1e6)
    assert r.empty_behind_h == pytest.approx(4.0)  # behind from 1 h to the trace's end
