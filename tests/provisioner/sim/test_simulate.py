"""The simulator on tiny traces whose outcome is worked out by hand, per policy."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from pricing.model import Availability, Offering, PriceQuote, Snapshot
from provisioner.errors import UserError
from provisioner.sim.policies import Params
from provisioner.sim.engine import simulate_policy
from provisioner.sim.hindsight import hindsight
from provisioner.sim.world import build_world
from provisioner.plan.throughput import ThroughputModel

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
A = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
B = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "spot")
SPEED = ThroughputModel(priors={"p3.2xlarge": 100.0})  # 100 samples/s per instance


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


#: Where each knob of the simulated job lives in the daemon's settings (the simulator reads
#: them there, whole); the others are the baselines' own (Params fields).
SETTING = {"boot_s": ("fleet", "boot_s"), "reform_s": ("fleet", "reform_s"),
           "step_s": ("fleet", "step_s"), "max_size": ("fleet", "max_size"),
           "max_zone_share": ("fleet", "max_zone_share"),
           "churn_horizon_hours": ("fleet", "churn_horizon_hours"),
           "model_mb": ("job", "model_mb"), "global_batch": ("job", "global_batch"),
           "avoid_s": ("daemon", "zone_avoid_ttl_s"), "plan_s": ("daemon", "plan_s"),
           "bank_hours": ("pacing", "bank_hours"),
           "catch_up_tolerance": ("pacing", "catch_up_tolerance"),
           "spot_share": ("pacing", "spot_share"),
           "ahead_tolerance": ("pacing", "ahead_tolerance"),
           "default_hazard": ("optimizer", "default_spot_hazard_per_hour"),
           "safety_hours": ("objective", "safety_hours"),
           "budget_usd": ("job", "budget_usd"), "max_spot_price": ("job", "max_spot_price"),
           "max_hourly_cost": ("job", "max_hourly_cost")}


def params(**kw) -> Params:
    """A simulated job: settings validated as a config file's (``parse_settings``), the
    tests' small figures (no boot, no re-form, no ring cost, 4 instances at most)."""
    from provisioner.config import parse_settings

    base = dict(itype="p3.2xlarge", size=1, boot_s=0, restart_s=0, checkpoint_s=1800,
                step_s=1, reform_s=0, model_mb=0, max_size=4, max_zone_share=1.0,
                backoff_s=60, avoid_s=600, global_batch=256)
    base.update(kw)
    data: dict = {}
    for k in [k for k in base if k in SETTING]:
        section, name = SETTING[k]
        data.setdefault(section, {})[name] = base.pop(k)
    return Params(parse_settings(data), **base)


def spotring(p: Params, v) -> "Spotring":
    """The spotring policy of the job a view shows (its work and deadline)."""
    from provisioner.sim.policies import Spotring
    return Spotring.for_job(p, work=v.work, deadline_h=None if v.deadline_s is None
                            else v.deadline_s / 3600, speed=v.speed)


def two_zone_world(a_gone: tuple[float, float] | None, end_h: float = 10.0):
    """Zone a at $1/h, zone b at $1.5/h, on-demand $4/h; a unavailable during a_gone."""
    quotes = (PriceQuote(A, at(0), 1.0, 4.0), PriceQuote(B, at(0), 1.5, 4.0))
    av = [Availability(A, at(0), 100), Availability(B, at(0), 100), Availability(B, at(end_h), 100)]
    if a_gone:
        av += [Availability(A, at(a_gone[0]), 0), Availability(A, at(a_gone[1]), 100)]
    av.append(Availability(A, at(end_h), 100))
    return build_world(Snapshot(quotes=quotes, availability=tuple(sorted(av, key=lambda a: a.time))),
                       SPEED, max_size=4)


def test_cost_is_instance_seconds_times_the_price_at_that_time():
    # Spot $1/h for the first hour, $2/h after; 2 instances x 100/s; work 1.08M samples = 1.5 h.
    # static-spot: 2 x (1 h x $1 + 0.5 h x $2) = $4.00. on-demand: 2 x 1.5 h x $4 = $12.00.
    quotes = (PriceQuote(A, at(0), 1.0, 4.0), PriceQuote(A, at(1), 2.0, 4.0))
    av = (Availability(A, at(0), 100), Availability(A, at(10), 100))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    p = params(size=2)
    spot = simulate_policy(world, "static-spot", p, work=1.08e6)
    assert spot.completion_h == pytest.approx(1.5)
    assert spot.cost == pytest.approx(4.0, abs=1e-9)
    od = simulate_policy(world, "on-demand", p, work=1.08e6)
    assert od.cost == pytest.approx(12.0, abs=1e-9) and od.revocations == 0
    assert od.cost_per_m == pytest.approx(12.0 / 1.08)


def test_cheapest_first_restarts_from_checkpoint_in_the_next_zone_after_backoff():
    # a ($1) runs 0..0.75 h and is revoked; last checkpoint at 0.5 h -> 180,000 kept, 90,000
    # lost. Back-off 60 s, relaunch in b ($1.5) at 2,760 s; 540,000 left at 100/s = 5,400 s
    # -> done at 8,160 s = 2.2667 h. Cost: 0.75 h x $1 + 1.5 h x $1.5 = $3.00.
    world = two_zone_world((0.75, 9.0))
    r = simulate_policy(world, "cheapest-first", params(), work=720_000)
    assert r.revocations == 1 and r.work_lost == pytest.approx(90_000)
    assert r.completion_h == pytest.approx(8160 / 3600)
    assert r.cost == pytest.approx(3.0, abs=1e-9)


def test_spotring_loses_at_most_one_step_on_a_revocation():
    # Same trace: spotring paces the work to finish by its own deadline, work / the nominal
    # 100/s = 7,200 s. It holds 2 in a from the start (one instance's hazard-discounted rate
    # is a hair below the pace; launched within the churn horizon, both are kept), so
    # 540,000 are done when both are revoked at 0.75 h; it loses one 1-s step of the 200/s
    # ring, nothing else. Ahead of its line (270,000) it waits for a (b costs 1.5x per
    # sample) until the line catches up (539,800 at 5,398 s, the 5,400 s tick), then runs 2
    # in b: 180,200 at 200/s = 901 s, done at 6,301 s. (No banking ahead of the line,
    # bank_hours 0: that is tested on its own below.)
    world = two_zone_world((0.75, 9.0))
    r = simulate_policy(world, "spotring", params(bank_hours=0.0), work=720_000)
    assert r.revocations == 2 and r.work_lost == pytest.approx(200)
    assert r.completion_h == pytest.approx(6301 / 3600)
    assert r.cost == pytest.approx(2 * 0.75 * 1.0 + 2 * 901 / 3600 * 1.5, rel=1e-9)


def test_static_spot_waits_in_its_zone():
    # static-spot stays in a: revoked at 0.75 h (checkpoint 0.5 h: 180,000 kept), a is back at
    # 1.5 h; 540,000 left -> done at 1.5 h + 5,400 s = 3.0 h; it pays only while it holds.
    world = two_zone_world((0.75, 1.5))
    r = simulate_policy(world, "static-spot", params(), work=720_000)
    assert r.completion_h == pytest.approx(3.0)
    assert r.cost == pytest.approx(0.75 * 1.0 + 1.5 * 1.0, abs=1e-9)


def test_uniform_progress_uses_on_demand_when_behind_and_meets_the_deadline():
    # Only zone a's spot, unavailable 1 h..3 h; deadline 3 h; work 2 instance-hours.
    # At 1 h: 360,000 done (checkpoint at 1 h), ahead of the line (240,000): wait. At the
    # 5,400 s tick it is exactly on the line: it tries spot, which fails; 60 s later it is
    # behind (line 364,000) -> on-demand ($4/h) from 5,460 s for 3,600 s: done at 9,060 s.
    # Cost 1 h x $1 + 1 h x $4 = $5.
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 100), Availability(A, at(1), 0), Availability(A, at(3), 100),
          Availability(A, at(10), 100))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    r = simulate_policy(world, "uniform-progress", params(), work=720_000, deadline_h=3.0)
    assert r.deadline_met and r.completion_h == pytest.approx(9060 / 3600)
    assert r.cost == pytest.approx(5.0, abs=1e-9)
    ours = simulate_policy(world, "spotring", params(), work=720_000, deadline_h=3.0)
    assert ours.deadline_met


def assert_bounds_every_policy(world, p, work: float) -> None:
    """Every online policy costs at least the bound for the work it did over the time it
    took (the bound is a lower bound on any schedule of that work in that time; a run that
    did not finish is held to the work it did by the end of the trace): checked for each
    policy, never skipped."""
    trace_h = (world.end - world.start) / 3600
    for name in ("spotring", "cheapest-first", "static-spot", "on-demand"):
        r = simulate_policy(world, name, p, work=work)
        assert r.done > 0, name
        horizon = r.completion_h if r.completion_h is not None else trace_h
        bound = hindsight(world, p, work=r.done, horizon_h=horizon)
        assert bound.status == "optimal", (name, bound.status)
        assert r.cost >= bound.cost - 1e-9, (name, r.cost, bound.cost)


def test_hindsight_is_a_lower_bound_worked_out_by_hand():
    # max_size 1: a at $1 is available 0..1 h, b at $1.5 always: the cheapest 2 instance-hours
    # within 3 h are 1 h of a and 1 h of b: $2.50; no online policy can pay less.
    world = two_zone_world((1.0, 9.0))
    p = params(max_size=1)
    bound = hindsight(world, p, work=720_000, horizon_h=3.0)
    assert bound.cost == pytest.approx(2.5, abs=1e-6) and bound.status == "optimal"
    assert_bounds_every_policy(world, p, 720_000)


def test_implausible_prices_are_dropped_and_reported_with_their_source():
    quotes = (PriceQuote(A, at(0), 1.0, 4.0, source="t.csv:2"),
              PriceQuote(A, at(1), -3.0, 4.0, source="t.csv:3"),
              PriceQuote(A, at(2), 9.0, 4.0, source="t.csv:4"),
              PriceQuote(A, at(3), math.nan, 4.0, source="t.csv:5"))
    av = (Availability(A, at(0), 100), Availability(A, at(10), 100))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    text = "\n".join(world.notes)
    assert "t.csv:3" in text and "t.csv:4: spot 9.0000 above on-demand" in text and "t.csv:5" in text
    assert world.price[A].at(ts := at(5).timestamp()) == 1.0 and ts


def test_availability_without_any_price_is_refused_with_the_fix():
    from pricing.model import Span
    av = (Availability(A, at(0), 1), Availability(A, at(5), 1))
    snap = Snapshot(availability=av, spans=(Span(A, at(0), at(5), "probe.csv"),))
    with pytest.raises(UserError, match=r"^probe.csv: the availability of p3.2xlarge \(aws\) "
                       r"has no spot price in any price trace: pass a price trace"):
        build_world(snap, SPEED, max_size=4)


def test_availability_is_combined_with_a_price_series_of_the_same_type_and_says_so():
    other = Offering("aws", "us-east-1", "use1-az2", "p3.2xlarge", "spot")
    quotes = (PriceQuote(other, at(-100), 0.9, None, source="events.csv:2"),)
    av = (Availability(A, at(0), 1, capacity=1), Availability(A, at(5), 0, capacity=1))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    assert world.price[A].at(at(1).timestamp()) == 0.9
    assert world.available(A, at(1).timestamp()) == 4  # a 1-node trace's 1 = capacity up to max
    assert any("combined with the spot prices of aws/us-east-1/use1-az2" in n for n in world.notes)


def test_hindsight_charges_the_ring_of_the_fleet_it_runs():
    # One zone at $1/h, 100 samples/s per instance; a 12.5 MB gradient on 10 Gb/s and a
    # global batch of 20 make a ring of 2 deliver 200 / 1.1 = 181.8/s (t_comm = 0.01 s). 360,000
    # samples within 0.6 h: one instance all the time (216,000) and a second for the rest at
    # its marginal 81.8/s: 144,000 / (81.8 x 3,600) = 0.4889 h. Cost 0.6 + 0.4889 = $1.0889.
    world = two_zone_world(None)
    p = params(model_mb=12.5, global_batch=20, max_size=2, size=2)
    bound = hindsight(world, p, work=360_000, horizon_h=0.6)
    second = 144_000 / (3600 * (200 / 1.1 - 100))
    assert bound.status == "optimal"
    assert bound.cost == pytest.approx(0.6 + second, rel=1e-6)
    # a real ring of 2 pays for both instances all the way: $1.10 for 0.55 h
    r = simulate_policy(world, "static-spot", p, work=360_000)
    assert r.completion_h == pytest.approx(0.55) and r.cost == pytest.approx(1.1)
    assert r.cost >= bound.cost


def test_hindsight_uses_capacity_present_for_part_of_a_decision_period():
    # a ($1) is there for the first 15 minutes only, b costs $1.5; one instance at a time.
    # Half an instance-hour of work: 0.25 h of a + 0.25 h of b = $0.625, which an online
    # schedule reaches (a, then b), so the bound must use a for 900 s, not round it away
    # with 600 s slots (which gave $0.667, above what a real schedule pays).
    world = two_zone_world((0.25, 9.0))
    p = params(max_size=1)
    bound = hindsight(world, p, work=180_000, horizon_h=1.0)
    assert bound.cost == pytest.approx(0.625, rel=1e-6)
    assert_bounds_every_policy(world, p, 180_000)


BIG = Offering("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "spot")


def _small_and_big_world(big_price: float, big_count: int, big_speed: float):
    """p3.2xlarge spot in A ($1/h, 100/s, 100 available) beside p3.8xlarge spot in BIG
    (``big_price`` $/h, ``big_speed`` samples/s, ``big_count`` available), 10 h, max 16."""
    quotes = (PriceQuote(A, at(0), 1.0, 4.0), PriceQuote(BIG, at(0), big_price, 20.0))
    av = (Availability(A, at(0), 100), Availability(BIG, at(0), big_count),
          Availability(A, at(10), 100), Availability(BIG, at(10), big_count))
    speed = ThroughputModel(priors={"p3.2xlarge": 100.0, "p3.8xlarge": big_speed})
    return build_world(Snapshot(quotes=quotes, availability=av), speed, max_size=16)


def test_spotring_takes_the_fleet_cheapest_per_sample_not_per_hour():
    # p3.2xlarge spot $1/h at 100/s ($2.78 per 1M), p3.8xlarge spot $12/h at 3,000/s ($1.11 per
    # 1M). The job's pace (1 x 100/s) is kept most cheaply per hour by one small instance,
    # and 2x or 4x the pace by 2 or 4 of them; per sample the big one is 2.5x cheaper.
    # Without a deadline spotring runs the big one: 1.08e6 samples in 360 s for $1.20.
    world = _small_and_big_world(big_price=12.0, big_count=100, big_speed=3000.0)
    r = simulate_policy(world, "spotring", params(max_size=16), work=1.08e6)
    assert r.completion_h == pytest.approx(360 / 3600)
    assert r.cost == pytest.approx(1.2, rel=1e-6)


def test_spotring_without_a_deadline_waits_for_spot_instead_of_buying_a_safety_margin():
    # One zone at $1/h (on-demand $4/h), gone from 0.25 h to 1.5 h; 720,000 samples at the
    # job's pace of 100/s set its own deadline, 2 h. Two spot instances run to 0.25 h
    # (179,800 done: one 200/s step lost). The slack (time left less what the fastest
    # on-demand ring, 4 x 100/s, needs) never runs out before spot is back at 1.5 h (0.125 h
    # left), so it waits. At 1.5 h, 540,200 left in 0.5 h: 4 spot instances, kept (launched
    # within the churn horizon) to the end: done at 5,400 + 1,350.5 s. Every sample paid at
    # spot's $1 per 360,000 (the lost step too). With the same 2 h as the user's (hard)
    # deadline, the safety margin (a quarter of it, 0.5 h) buys on-demand during the outage.
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 100), Availability(A, at(0.25), 0), Availability(A, at(1.5), 100),
          Availability(A, at(10), 100))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    soft = simulate_policy(world, "spotring", params(), work=720_000)
    assert soft.completion_h == pytest.approx((5400 + 1350.5) / 3600)
    assert soft.cost == pytest.approx(720_200 / 360_000, rel=1e-9)
    hard = simulate_policy(world, "spotring", params(), work=720_000, deadline_h=2.0)
    assert hard.deadline_met and hard.cost > soft.cost + 0.5


def test_spotring_when_spot_never_comes_waits_its_slack_then_runs_on_demand_no_dearer():
    # No spot capacity at all (zone a at 0 throughout); 4 instances of 100/s on a ring (12.5
    # MB gradient, batch 256), max_size 8, boot 180 s. Plain on-demand runs 4 from the
    # start. spotring waits while its slack lasts (counted against the 8-instance ring, its
    # boot and its launch rounds), then, its own pace soft, runs the on-demand ring that keeps
    # the pace, no dearer per sample than on-demand alone (it had caught up on 5, then 8:
    # 1.05x on-demand alone per sample); it finishes later instead.
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 0), Availability(A, at(20), 0))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=8)
    p = params(size=4, max_size=8, boot_s=180, model_mb=12.5, global_batch=256)
    od = simulate_policy(world, "on-demand", p, work=3.6e6)
    ours = simulate_policy(world, "spotring", p, work=3.6e6)
    assert ours.completion_h is not None and ours.cost_per_m <= od.cost_per_m * (1 + 1e-9)
    fleet = [n for x, n in zip(ours.series[0], ours.series[1]) if n]
    assert max(fleet) == 4  # the ring that keeps the pace, not a dearer catch-up ring
    assert all(x > 0.5 for x, n in zip(ours.series[0], ours.series[1]) if n)  # it waited


def test_spotring_on_pace_for_a_hard_deadline_buys_no_on_demand():
    # Spot $1/h always there, on-demand $4/h; 720,000 samples at 100/s per instance with a
    # 2 h deadline: the safety margin (a quarter of it, 0.5 h) is kept as time, so the pace
    # aims at 1.5 h and a run on that pace never falls inside the margin: every sample on
    # spot, $1 per 360,000 = $2.00. (Pacing to 2 h itself put the last ~40 minutes inside
    # the margin: on-demand bought with nothing late.)
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 100), Availability(A, at(10), 100))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    r = simulate_policy(world, "spotring", params(), work=720_000, deadline_h=2.0)
    assert r.deadline_met and r.completion_h <= 1.5 + 1e-9
    assert r.cost == pytest.approx(2.0, rel=1e-9)


def _late_view(failed: dict) -> "View":
    # 360,000 samples at the job's pace of 100/s set its own deadline at 1 h; at 0.9 h
    # nothing is done: 360,000 left in 0.1 h. Even 4 on-demand instances (400/s) need 0.25 h,
    # so the job's own deadline is lost whatever is bought.
    from provisioner.sim.policies import View
    od = A.with_market("on-demand")
    return View(t=3240.0, start=0.0, work=360_000, done=0.0, deadline_s=None,
                prices={A: 1.0, od: 4.0}, held={}, failed=failed,
                speed={"p3.2xlarge": 100.0}, running=False)


def test_spotring_past_its_own_deadline_runs_spot_at_full_size_not_on_demand():
    # Spot zone A has not failed lately: spot runs the same instances as fast for a quarter
    # of the price, so the fastest fleet, 4 spot in A (max_size), not on-demand. (It bought
    # 3 on-demand: the all-or-nothing soft floor at slack 0, at a quarter of a target that
    # no fleet reaches.)
    v = _late_view({})
    d = spotring(params(), v).decide(v)
    assert dict(d.target) == {A: 4}


def test_spotring_past_its_own_deadline_covers_a_spot_gap_with_on_demand():
    # Same, but A failed a launch 240 s ago (within avoid_s, 600 s): spot cannot be had now,
    # so on-demand covers the gap, the fastest fleet: 4 on-demand.
    v = _late_view({A: 3000.0})
    d = spotring(params(), v).decide(v)
    assert dict(d.target) == {A.with_market("on-demand"): 4}


def test_a_baseline_type_without_an_on_demand_price_is_refused_up_front_with_the_fix():
    # Spot prices only (no on-demand in the quotes, no --on-demand): the on-demand baseline
    # cannot run; say so before any policy runs, naming the flag and the type.
    from provisioner.sim.report import run_all
    quotes = (PriceQuote(A, at(0), 1.0),)
    av = (Availability(A, at(0), 100), Availability(A, at(10), 100))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)
    with pytest.raises(UserError, match=r"--on-demand p3\.2xlarge=USD_PER_HOUR") as e:
        run_all(world, ["spotring", "on-demand", "hindsight"], params(), work=1000,
                deadline_h=None)
    assert str(e.value).startswith("--policy on-demand needs an on-demand price")
    assert "--type" not in str(e.value)  # no type has one: none to offer
    with pytest.raises(UserError, match=r"^--policy on-demand and uniform-progress need an"):
        run_all(world, ["on-demand", "uniform-progress"], params(), work=1000, deadline_h=5.0)
    r = run_all(world, ["spotring", "hindsight"], params(), work=360_000, deadline_h=None)
    assert r["spotring"].cost == pytest.approx(1.0, rel=1e-3)  # 1 h of spot A at $1/h


SMALL_B = Offering("aws", "us-east-1", "us-east-1a", "p2.xlarge", "spot")


def _ahead_view(done: float, held: dict, t: float = 1800.0) -> "View":
    # 360,000 samples at the job's pace (1 x 100/s) set its own deadline at 1 h; at 0.5 h the
    # progress line is at 180,000. p3.2xlarge in A ($1/h, 100/s) failed a launch 100 s ago
    # (so none can be had); p2.xlarge in the same zone does the same 100/s for $1.5/h: 1.5x
    # the cost per sample (same hazard, same loss), beyond the 1.10 tolerance.
    from provisioner.sim.policies import View
    return View(t=t, start=0.0, work=360_000, done=done, deadline_s=None,
                prices={A: 1.0, SMALL_B: 1.5}, held=held, failed={A: t - 100.0},
                speed={"p3.2xlarge": 100.0, "p2.xlarge": 100.0}, running=True)


def test_spotring_ahead_of_its_line_waits_for_the_cheapest_per_sample_instead_of_buying_dearer():
    # 200,000 done at 0.5 h: ahead of the line (180,000), so the work due is done and waiting
    # for A is free: nothing bought (p2.xlarge would cost 1.5x per sample). 150,000 done:
    # behind; 210,000 left in 1,800 s needs 116.7/s: 2 p2.xlarge.
    v = _ahead_view(200_000, {})
    assert dict(spotring(params(), v).decide(v).target) == {}
    v = _ahead_view(150_000, {})
    assert dict(spotring(params(), v).decide(v).target) == {SMALL_B: 2}


def test_spotring_keeps_dearer_instances_until_a_churn_horizon_ahead_of_its_line():
    # Holding 1 p2.xlarge bought while behind: it goes only once the work is churn_horizon
    # (0.1 h = 360 s) ahead of the line, 360,000 x 2,160 / 3,600 = 216,000 at 0.5 h, else it
    # would be dropped at the line and booted again at the next tick. 200,000 done: kept
    # (160,000 left in 1,800 s: 88.9/s, one); 220,000 done: dropped.
    p = params(churn_horizon_hours=0.1)
    v = _ahead_view(200_000, {SMALL_B: 1})
    assert dict(spotring(p, v).decide(v).target) == {SMALL_B: 1}
    v = _ahead_view(220_000, {SMALL_B: 1})
    assert dict(spotring(p, v).decide(v).target) == {}


class _Swap:
    """Holds 4 small instances, then asks every time for one big one (out of capacity)."""

    name, mode = "swap", "hot"

    def __init__(self, p) -> None:
        pass

    def decide(self, v):
        from provisioner.sim.policies import Decision
        return Decision({A: 4} if not v.held else {BIG: 1})


def test_a_replacement_launch_without_capacity_keeps_every_instance_it_was_to_replace(monkeypatch):
    # 4 x p3.2xlarge in A ($1/h, 100/s each) are held; from the first tick (600 s) the policy
    # wants 1 p3.8xlarge (400/s) instead, in a zone with no capacity. Make before break: the
    # missing launch was worth 400/s, so all 4 (400/s) stay: 1.44e6 samples at 400/s = 1 h,
    # $4.00, 4 launches. (Keeping one per missing launch tore 3 down at every try.)
    from provisioner.sim.policies import POLICIES
    monkeypatch.setitem(POLICIES, "swap", _Swap)
    world = _small_and_big_world(big_price=2.0, big_count=0, big_speed=400.0)
    r = simulate_policy(world, "swap", params(max_size=16), work=1.44e6)
    assert r.completion_h == pytest.approx(1.0)
    assert r.cost == pytest.approx(4.0, rel=1e-9) and r.launches == 4


def test_spotring_banks_progress_with_the_cheapest_hardware_when_dearer_is_the_fallback():
    # Same job, A free now (no failure), 200,000 done at 0.5 h: the pace needs 160,000 in
    # 1,800 s = 88.9/s, one A. With p2.xlarge (1.5x per sample) what an outage of A would
    # leave, spotring banks bank_hours (0.5 h) of its pace with A: due 360,000 x min(1,
    # (1,800 + 1,800) / 3,600) = 360,000, 160,000 short, within the churn horizon (0.25 h =
    # 900 s): 177.8/s, two A. With A the only hardware there is nothing to bank against: one.
    from dataclasses import replace as dc_replace
    p = params(bank_hours=0.5, churn_horizon_hours=0.25)
    v = dc_replace(_ahead_view(200_000, {}), failed={})
    assert dict(spotring(p, v).decide(v).target) == {A: 2}
    only_a = dc_replace(v, prices={A: 1.0})
    assert dict(spotring(p, v).decide(only_a).target) == {A: 1}


def test_spotring_learns_the_bank_from_the_outages_it_saw():
    # bank_hours None (the default): the bank is learned. Before any outage of A is seen
    # there is nothing to bank for: one A keeps the pace. After a 0.5 h outage the learned
    # bank is 0.5 h (1,800^2 / 1,800 s) and the decision is the fixed 0.5 h one above: two A.
    from dataclasses import replace as dc_replace
    p = params(churn_horizon_hours=0.25)
    assert p.plan.bank_hours is None
    v = dc_replace(_ahead_view(200_000, {}), failed={})
    assert dict(spotring(p, v).decide(v).target) == {A: 1}
    seen = spotring(p, v)
    seen.planner.outages.lengths.append(1800.0)
    assert dict(seen.decide(v).target) == {A: 2}


class _Ten:
    """Wants 10 instances of A at once."""

    name, mode = "ten", "hot"

    def __init__(self, p) -> None:
        pass

    def decide(self, v):
        from provisioner.sim.policies import Decision
        return Decision({A: 10})


def test_the_simulator_keeps_the_daemons_churn_limits(monkeypatch):
    # The daemon launches at most max_launches (4) a round and plans again a plan period
    # (30 s) later; the simulator carries decisions out through the same reconciler: 4 at
    # 0 s, 8 at 30 s, 10 at 60 s (not 10 at once).
    from provisioner.sim.policies import POLICIES
    monkeypatch.setitem(POLICIES, "ten", _Ten)
    world = two_zone_world(None)
    r = simulate_policy(world, "ten", params(max_size=16), work=3.6e6)
    sizes = {round(x * 3600): n for x, n in zip(r.series[0], r.series[1])}
    assert sizes[0] == 4 and sizes[30] == 8 and sizes[60] == 10
    assert r.launches == 10


def _behind_view(deadline_s: float | None) -> "View":
    # 3.6e6 samples; the job's own pace (1 x 100/s, the baselines' size) sets its deadline at
    # 10 h; at 5 h only a quarter is done: 2.7e6 left in 5 h, 150/s. Ring efficiency with
    # 100 MB, batch 256, 10 Gb/s: 0.941 at 2, 0.889 at 3, 0.842 at 4, 0.800 at 5.
    from provisioner.sim.policies import View
    return View(t=5 * 3600.0, start=0.0, work=3.6e6, done=0.9e6, deadline_s=deadline_s,
                prices={A: 1.0}, held={}, failed={}, speed={"p3.2xlarge": 100.0},
                running=False)


def test_spotring_behind_its_own_pace_catches_up_only_on_rings_near_its_cost_per_sample():
    # The own pace is soft: behind it, only rings within 1.05x of the cost per sample of
    # the 1-instance ring that keeps the pace: 1 instance (2 are 1.0625x), late rather than
    # dear; within 1.2x (up to 4), the 2 that keep 150/s. A user's deadline at the same point
    # is hard: 250/s (its 2 h safety margin kept), 3 instances, whatever their cost per sample.
    kw = dict(model_mb=100.0, global_batch=256, size=1, default_hazard=0.0)
    v = _behind_view(None)
    assert dict(spotring(params(**kw), v).decide(v).target) == {A: 1}
    tolerant = params(**kw, catch_up_tolerance=1.2)
    assert dict(spotring(tolerant, v).decide(v).target) == {A: 2}
    v = _behind_view(10 * 3600.0)
    assert dict(spotring(params(**kw), v).decide(v).target) == {A: 3}


def test_hindsight_pays_the_relaunches_of_the_instances_removals_revoke():
    # A group of 16 loses half of its instances at 1 h and 2 h (16 -> 8, back to 16 just
    # after): as a cap it never binds the 1 instance the bound holds all along (the work
    # takes the whole 3 h), but each removal
    # revokes it with probability 8/16, and holding it on costs a relaunch and its boot
    # (0.1 h at $1/h): 2 x 0.5 x $0.10 over the bound without removals.
    from tests.provisioner.sim.test_revocations import group_trace
    counts = [16, 16, 8, 16, 8, 16, 16, 16]  # every 0.5 h: falls at 1.0 h and 2.0 h
    world = build_world(group_trace(A, counts, 0.5), SPEED, max_size=1)
    assert [world.reclaims[A].at(t) for t in world.reclaims[A].times] == [(8, 16), (8, 16)]
    p = params(max_size=1, boot_s=360)
    with_removals = hindsight(world, p, work=100 * 3600 * 3.0, horizon_h=3.0)
    without = hindsight(world, p, work=100 * 3600 * 3.0, horizon_h=3.0, removals=False)
    assert with_removals.status == without.status == "optimal"
    assert with_removals.cost - without.cost == pytest.approx(2 * 0.5 * 0.1, abs=1e-6)


def test_hindsight_starts_the_fleet_held_already_without_its_boots():
    # a at $1/h for the first hour, b at $1.5/h always; one instance; 2 instance-hours of
    # work in 2 h: 1 h of a and 1 h of b ($2.50), and each start pays its boot (0.1 h at the
    # offering's price): a at 0 h ($0.10) and b at 1 h ($0.15). A fleet held already at the
    # start (the rest of a run from an hour on) boots a for free, never the later b.
    world = two_zone_world((1.0, 9.0))
    p = params(max_size=1, boot_s=360)
    work = 720_000
    paid = hindsight(world, p, work=work, horizon_h=2.0)
    held = hindsight(world, p, work=work, horizon_h=2.0, free_boots=1)
    assert paid.status == held.status == "optimal"
    assert paid.cost == pytest.approx(2.75, abs=1e-6)
    assert held.cost == pytest.approx(2.65, abs=1e-6)
    assert hindsight(world, p, work=work, horizon_h=2.0, free_boots=5).cost == (
        pytest.approx(2.65, abs=1e-6))  # one instance at most is held: one boot is free


def test_hindsight_pays_the_relaunches_of_drawn_lifetimes():
    # No availability series: lifetimes drawn at 0.5/h. 3 instance-hours expect 1.5
    # revocations; every instance revoked was launched, so the bound pays at least 1.5
    # boots (0.1 h at $1/h each) beside the 3 instance-hours, where it paid for the launches
    # its mean count needs (0.3 of one: 3 h spread over the 10 h) without them.
    from pricing.model import Lifetime
    lts = (Lifetime(A, at(-10), 3600.0, True), Lifetime(A, at(-10), 7200.0, True),
           Lifetime(A, at(-10), 3600.0, False))
    snap = Snapshot(quotes=(PriceQuote(A, at(0), 1.0, 4.0),), lifetimes=lts)
    world = build_world(snap, SPEED, max_size=1, hours=10)
    p = params(max_size=1, boot_s=360)
    work = 100 * 3600 * 3.0
    with_drawn = hindsight(world, p, work=work, horizon_h=10.0)
    without = hindsight(world, p, work=work, horizon_h=10.0, removals=False)
    assert with_drawn.cost == pytest.approx(3.0 + 1.5 * 0.1, rel=1e-6)
    assert without.cost == pytest.approx(3.0 + 0.3 * 0.1, rel=1e-6)


def test_spotring_stops_within_its_budget_and_the_report_says_what_is_left():
    # Spot a at $1/h, 100/s per instance; 1e7 samples cost ~$28 at the cheapest, and the
    # budget is $2: spotring stops buying while the fleet can still be paid down (overshoot
    # at most 1%), and says how far it got; the money line states spent, saved, left.
    from provisioner.sim.report import money, money_line, run_all
    world = two_zone_world(None)
    p = params(size=2, budget_usd=2.0)
    r = run_all(world, ["spotring", "on-demand"], p, work=1e7, deadline_h=None)
    ours = r["spotring"]
    assert ours.cost <= 2.0 * 1.01 and ours.cost > 1.9
    assert ours.status.startswith("stopped: budget spent") and not ours.finished
    m = money(r, world, p)
    assert m["budget_left_usd"] >= -0.02 and m["on_demand_usd"] == pytest.approx(
        4.0 / 100 / 3600 * ours.done, abs=1e-4)  # $4/h per 100/s: on-demand alone
    assert "budget $2.00" in money_line(m) and "saved" in money_line(m)


def test_the_simulator_says_before_the_start_that_the_budget_cannot_finish(tmp_path):
    # The same job: the planner's first decision says the $2 cannot pay for the work (at
    # least ~$27.8 at the cheapest, so about 7%); the terminal summary prints that and the
    # whole reason it stopped (the table cuts long ones at a word), and the report's
    # "did not finish" line gives the budget, not the end of the trace, as the reason.
    from provisioner.sim.report import figures, summary, write_report, run_all
    world = two_zone_world(None)
    p = params(size=2, budget_usd=2.0)
    r = run_all(world, ["spotring", "on-demand"], p, work=1e7, deadline_h=None)
    warning = r["spotring"].budget_warning
    assert warning is not None and warning.startswith("budget: job.budget_usd leaves $2.00")
    assert "7%" in warning
    figs = figures(r)
    assert figs["spotring"]["budget_warning"] == warning
    assert "budget_warning" not in figs["on-demand"]
    text = summary(figs, None)
    assert f"spotring's plan at the start said: {warning}" in text
    assert f"spotring: {r['spotring'].status}" in text  # whole, below the table
    row = next(line for line in text.splitlines() if line.startswith("spotring "))
    assert row.endswith(" ...") and len(row.split("  ")[-1]) <= 60
    md = write_report(tmp_path, world, r, params=p, work=1e7, deadline_h=None,
                      traces=["t"]).read_text()
    line = next(x for x in md.splitlines() if x.startswith("**spotring did not finish**"))
    assert line.startswith("**spotring did not finish**: stopped: budget spent")
    assert "by the end of the trace" not in line
    assert f"spotring's plan at the start said: {warning}." in md
    enough = run_all(world, ["spotring"], params(size=2, budget_usd=100.0), work=1e7,
                     deadline_h=None)["spotring"]
    assert enough.budget_warning is None and not enough.status.startswith("stopped")


def test_a_users_spot_share_spreads_a_deadline_over_the_spot_time_from_the_start():
    # A ($1/h, on-demand $4/h, 100/s) is there for 5 h, then out for 7 h; 2.3M samples by
    # 10 h (line at 8 h, the 2 h margin). Paced over wall time (the default: no outage seen,
    # so none assumed) one A runs 80/s-worth at 100/s until the outage, 1.8M by 5 h, and the
    # last 0.5M fall to the on-demand net (~$5.6). Told spot is there half the time
    # (pacing.spot_share 0.5), it runs the work left over half the time left from the first
    # decision: 2.3M / (8 h x 0.5) = 160/s, two A, then one once the rate that is left fits
    # it; done before the outage, no on-demand, a lower bill. A share of 1 is the default.
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 100), Availability(A, at(5), 0), Availability(A, at(12), 100))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)

    def run(**kw):
        r = simulate_policy(world, "spotring", params(**kw), work=2.3e6, deadline_h=10.0)
        od = sum(life.cost for life in r.lives if life.offering.market == "on-demand")
        return r, od

    wall, wall_od = run()
    told, told_od = run(spot_share=0.5)
    assert wall.deadline_met and told.deadline_met
    assert wall_od > 4.0 and told_od == 0.0
    assert told.completion_h < 5.0 and wall.completion_h > 5.0
    assert told.cost < wall.cost - 3.0
    assert max(sizes_of(told)) == 2  # two A at most: the rate, not the ring's cap
    same, same_od = run(spot_share=1.0)
    assert (same.cost, same.completion_h, same_od) == (wall.cost, wall.completion_h, wall_od)


def sizes_of(r) -> list[int]:
    """The instances held at each launch or end (the fleet's sizes over the run)."""
    return [n for _, ys in r.by_offering().values() for n in ys]


def _net_view(t_h: float, extra: Offering = SMALL_B, extra_speed: float = 100.0,
              extra_price: float = 1.5) -> "View":
    # A user's deadline of 10 h for 3.6e6 samples (the line at 8 h: 2 h margin); A
    # (p3.2xlarge, $1/h, 100/s) failed a launch 100 s ago, so none can be had; ``extra`` is
    # the dearer spot (p2.xlarge by default: the same 100/s for $1.5/h, 1.5x per sample).
    from provisioner.sim.policies import View
    t = t_h * 3600
    return View(t=t, start=0.0, work=3.6e6, done=0.0, deadline_s=36_000.0,
                prices={A: 1.0, extra: extra_price}, held={}, failed={A: t - 100.0},
                speed={"p3.2xlarge": 100.0, extra.instance_type: extra_speed}, running=True)


def test_a_deadline_waits_on_dearer_spot_while_its_fastest_ring_can_still_finish():
    # With A out, the dearer p2.xlarge is the net. Its fastest ring within catch_up_tolerance
    # of the pace ring's cost per sample (no ring cost here: 4 instances, 400/s) does the
    # 3.6e6 samples in 2.5 h. At 0.5 h the line is 7.5 h away: 5 h of slack, more than the
    # 2 h margin, so nothing is bought (paced over wall time: 3.6e6 / 27,000 s = 133/s, two
    # p2.xlarge, every sample of them one A might do later for two thirds of the price).
    p = params()
    v = _net_view(0.5)
    assert dict(spotring(p, v).decide(v).target) == {}
    # At 4.8 h, 0.7 h of slack is left: the net phases in, 400 x (1 - 0.7 / 2) = 260/s,
    # three (the wall-time pace would be 312.5/s, four).
    v = _net_view(4.8)
    assert dict(spotring(p, v).decide(v).target) == {SMALL_B: 3}
    # At 6 h the net cannot finish by the line any more (2.5 h of work, 2 h left): the
    # deadline takes all it can get.
    v = _net_view(6.0)
    assert dict(spotring(p, v).decide(v).target) == {SMALL_B: 4}


def test_a_deadline_does_not_wait_on_another_size_of_the_gpu_that_is_out():
    # The dearer spot is a p3.8xlarge (4 V100, 400/s for $6/h: 1.5x per sample): an outage of
    # p3.2xlarge takes its GPU's other sizes along, so it is no net to wait on; the job keeps
    # its wall-time pace on it, 133/s: one.
    big = Offering("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "spot")
    v = _net_view(0.5, extra=big, extra_speed=400.0, extra_price=6.0)
    assert dict(spotring(params(), v).decide(v).target) == {big: 1}


def _net_world(a_back_h: float | None):
    """A (p3.2xlarge, $1/h, 100/s) out from 0.5 h (back at ``a_back_h``, or never) beside
    p2.xlarge in zone b ($1.5/h, 100/s) all along; on-demand $4/h and $3/h; 12 h."""
    b = Offering("aws", "us-east-1", "us-east-1b", "p2.xlarge", "spot")
    quotes = (PriceQuote(A, at(0), 1.0, 4.0), PriceQuote(b, at(0), 1.5, 3.0))
    av = [Availability(A, at(0), 100), Availability(A, at(0.5), 0),
          Availability(b, at(0), 100), Availability(b, at(12), 100)]
    if a_back_h is not None:
        av.append(Availability(A, at(a_back_h), 100))
    av.append(Availability(A, at(12), 100 if a_back_h is not None else 0))
    speed = ThroughputModel(priors={"p3.2xlarge": 100.0, "p2.xlarge": 100.0})
    world = build_world(Snapshot(quotes=quotes, availability=tuple(sorted(
        av, key=lambda a: a.time))), speed, max_size=4)
    return world, b


def test_waiting_on_the_net_pays_when_the_cheap_spot_comes_back_and_costs_little_when_not():
    # 3.6e6 samples, deadline 10 h. Paced over wall time, the job would buy p2.xlarge from
    # 0.5 h at the line's rate; waiting on it, it buys nothing while 4 of them could still
    # finish by the line (8 h) with 2 h to spare.
    # A back at 3 h: the work is done on A ($1/h): 10 instance-hours, $10, plus what the
    # boots and the revocation at 0.5 h cost; no p2.xlarge bought at all.
    world, b = _net_world(a_back_h=3.0)
    r = simulate_policy(world, "spotring", params(), work=3.6e6, deadline_h=10.0)
    assert r.finished and r.completion_h <= 10.0
    assert sum(life.cost for life in r.lives if life.offering == b) == 0.0
    assert r.cost <= 10.0 * 1.02
    # A never back: the deadline is met on p2.xlarge, at most catch_up_tolerance dearer per
    # sample than its pace (here, with no ring cost, the same: 1.5x A's price).
    world, b = _net_world(a_back_h=None)
    r = simulate_policy(world, "spotring", params(), work=3.6e6, deadline_h=10.0)
    assert r.finished and r.completion_h <= 10.0
    on_b = [life for life in r.lives if life.offering == b]
    assert on_b and min(life.launched_h for life in on_b) > 3.0  # it waited, then ran
    assert r.cost <= 1.5 * 10.0 * 1.02


def test_a_bank_the_cheapest_cannot_reach_runs_the_most_of_it_not_nothing():
    # As above with a 0.9 h bank and a 0.02 h (72 s) churn horizon: 160,000 short of the line
    # 0.9 h ahead, in 72 s, asks for 2,222/s, more than four A (400/s) give even at a
    # quarter of it. The bank's target was then treated as an ahead target (a fraction of it
    # from the good offerings, else keep what is held): nothing held, nothing bought, while
    # A was there (on the four types of aws-10-26-2022, 17 h empty while behind once the
    # bank grew past the V100's reach). Now the most A gives: four.
    from dataclasses import replace as dc_replace
    p = params(bank_hours=0.9, churn_horizon_hours=0.02)
    v = dc_replace(_ahead_view(200_000, {}), failed={})
    assert dict(spotring(p, v).decide(v).target) == {A: 4}


def test_the_bank_grows_the_ring_only_while_its_extra_samples_cost_less_than_the_nets():
    # V100 (p3.2xlarge, $0.918/h, 400/s) beside K80 (p2.xlarge, $0.27/h, 80/s: $0.94 per 1M)
    # with a 50 MB gradient: a ring's efficiency falls with its size. A user's deadline of
    # 10 h (the line at 8 h) for 4e7 samples, on the line at 1 h; the pace takes 4 V100.
    # A 5 h bank within the 1 h churn horizon asks for 6,944/s, past 16 V100; the bank
    # stops at the ring whose last instance still adds samples for less than K80's.
    from provisioner.plan.model import ring_rate
    from provisioner.sim.policies import View
    k80 = Offering("aws", "us-east-1", "us-east-1a", "p2.xlarge", "spot")
    p = params(bank_hours=5.0, churn_horizon_hours=1.0, model_mb=50.0, global_batch=1024,
               max_size=16)
    v = View(t=3600.0, start=0.0, work=4e7, done=5e6, deadline_s=36_000.0,
             prices={A: 0.918, k80: 0.27}, held={}, failed={},
             speed={"p3.2xlarge": 400.0, "p2.xlarge": 80.0}, running=True)
    r = [ring_rate(n, 400.0, 50.0, 1024, 10.0) for n in range(17)]
    assert r[3] < 3.5e7 / (7 * 3600) <= r[4]
    worth = max(n for n in range(5, 17) if 0.918 / (r[n] - r[n - 1]) <= 0.27 / 80.0)
    assert worth < 16
    assert dict(spotring(p, v).decide(v).target) == {A: worth}
    # A p3.8xlarge (4 V100, 1,600/s for $4.2/h: dearer per sample than A, cheaper than K80)
    # is no net: an outage of the V100 takes it along. The bank is priced against K80 still.
    big = Offering("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "spot")
    v = View(t=3600.0, start=0.0, work=4e7, done=5e6, deadline_s=36_000.0,
             prices={A: 0.918, k80: 0.27, big: 4.2}, held={}, failed={},
             speed={"p3.2xlarge": 400.0, "p2.xlarge": 80.0, "p3.8xlarge": 1600.0},
             running=True)
    assert dict(spotring(p, v).decide(v).target) == {A: worth}


def test_ahead_of_the_line_but_behind_by_the_on_demand_slack_the_deadline_does_not_wait():
    # The last samples of a user's deadline (10 h, the line at 8 h; 3.6e6 samples, 10,000
    # left at 7.9 h: ahead of the line's 3,555,000) just after its A was revoked; boots of
    # 600 s. The slack to the deadline (2.1 h less the boot less 25 s on four on-demand) is
    # within the 2 h margin: behind. Being ahead of the line once let it wait for A, holding
    # nothing while behind (on a four-type window, 0.17 h for its last 6,424 samples); now it
    # runs them on the dearer spot that is there.
    from provisioner.sim.policies import View
    od = A.with_market("on-demand")
    v = View(t=7.9 * 3600, start=0.0, work=3.6e6, done=3.59e6, deadline_s=36_000.0,
             prices={A: 1.0, SMALL_B: 1.5, od: 4.0}, held={}, failed={A: 7.9 * 3600 - 100},
             speed={"p3.2xlarge": 100.0, "p2.xlarge": 100.0}, running=True)
    d = spotring(params(boot_s=600), v).decide(v)
    assert d.behind and dict(d.target) == {SMALL_B: 1}


def _group_world(gone_s: float | None, every_h: float = 1 / 3):
    # One spot pool A ($1/h, on-demand $4/h, 100/s), 12 h. Every 20 minutes from 1 h a
    # revocation: either the pool's group (20 instances, relaunched at once, as an
    # autoscaling group does) loses 10 of its 20, taking each of ours with odds 1/2 and
    # leaving capacity (gone_s None), or the whole pool is gone for gone_s.
    from pricing.model import Lifetime
    times = [1.0 + k * every_h for k in range(int(10 / every_h))]
    av = [Availability(A, at(0), 20), Availability(A, at(12), 20)]
    lts = []
    for h in times:
        if gone_s is None:
            lts += [Lifetime(A, at(0), h * 3600, True) for _ in range(10)]
        else:
            av += [Availability(A, at(h), 0), Availability(A, at(h + gone_s / 3600), 20)]
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    return build_world(Snapshot(quotes=quotes, availability=tuple(sorted(av, key=lambda a: a.time)),
                                lifetimes=tuple(lts)), SPEED, max_size=8)


def test_revocations_that_leave_the_pool_running_buy_little_on_demand():
    # 1e7 samples by 10 h on at most 4 instances (the line at 8 h: 3.5 instances' worth).
    # Half the ring revoked every 20 minutes, its zone then avoided for 10 minutes: the
    # job falls into its 2 h margin. The survivors show that the pool still has capacity;
    # while the job is ahead of Uniform Progress' line until the avoidance ends, the net
    # waits for the pool (it had bought on-demand for the minutes of each avoidance: $28.07
    # of on-demand). Where the pool is gone for 10 minutes each time, nothing shows that it
    # has capacity, and the net buys on-demand as before.
    def run(gone_s):
        r = simulate_policy(_group_world(gone_s), "spotring", params(boot_s=180),
                            work=1e7, deadline_h=10.0)
        od = sum(life.cost for life in r.lives if life.offering.market == "on-demand")
        return r, od

    group, group_od = run(None)
    gone, gone_od = run(600.0)
    assert group.deadline_met and gone.deadline_met
    assert group.revocations >= 30 and gone.revocations >= 30
    assert gone_od > 50.0 and group_od < 0.1 * gone_od


def _full_pool_world(cap: int, grown: int | None = None, at_h: float = 0.0):
    # One spot pool A ($1/h, on-demand $4/h, 100/s per instance) that never has more than
    # ``cap`` instances (``grown`` from ``at_h`` on) and revokes none, for 40 h.
    av = (Availability(A, at(0), cap), Availability(A, at(at_h), grown or cap),
          Availability(A, at(40), grown or cap))
    return build_world(Snapshot(quotes=(PriceQuote(A, at(0), 1.0, 4.0),), availability=av,
                                lifetimes=()), SPEED, max_size=8)


def test_a_pool_too_small_for_the_pace_is_kept_whole_and_never_swapped_for_on_demand():
    # 30 h to do 27 h of the work of 6 instances on a pool of 5, and of 8 on a pool of 6.
    # Each launch beyond the pool is refused and the job's pace is beyond what spot gives:
    # the pool's instances stay, and on-demand joins the ring as the deadline needs it,
    # beside them, never instead of them. (On the pool of 5 the replan after each partial
    # refusal ended the instances just launched: 32 launches. On the pool of 6, once
    # on-demand was held, a pace 1% above what 8 spot instances deliver was met by 7
    # on-demand and 1 spot: $774, $743 of it on-demand, where keeping the 6 costs $348.)
    for cap, n in ((5, 6), (6, 8)):
        r = simulate_policy(_full_pool_world(cap), "spotring", params(boot_s=180, max_size=8),
                            work=n * 100.0 * 3600 * 27, deadline_h=30.0)
        assert r.deadline_met
        spot = [life for life in r.lives if life.offering.market == "spot"]
        on_demand = [life for life in r.lives if life.offering.market == "on-demand"]
        assert not any(life.revoked for life in r.lives)
        # every spot instance runs from its launch to the last two hours of the job ...
        assert all(life.ended_h >= r.completion_h - 2.0 for life in spot), (cap, n)
        # ... and the pool's instances are launched once, at the start
        assert len(spot) == cap and all(life.launched_h < 0.1 for life in spot), (cap, n)
        assert sum(life.cost for life in on_demand) < 0.55 * r.cost


def test_beside_a_full_pool_that_grows_later_the_net_buys_only_its_floor():
    # 18 h to do 80 h of the work of one instance on a pool of 3 that grows to 8 at 10 h
    # (the bound: 3 until then, 8 after). The 3 fall behind the margin's pace within hours;
    # spot never lost at once, on-demand is bought only to Uniform Progress' floor, and the
    # pool's growth does the rest. (Buying the pace's whole gap on-demand from the start,
    # 4 of them for 10 h, cost $141.50 of which $81.13 on-demand.)
    r = simulate_policy(_full_pool_world(3, grown=8, at_h=10.0), "spotring",
                        params(boot_s=180, max_size=8), work=80 * 100.0 * 3600, deadline_h=18.0)
    assert r.deadline_met and r.revocations == 0
    on_demand = sum(life.cost for life in r.lives if life.offering.market == "on-demand")
    assert on_demand < 0.1 * r.cost
    assert max(life.ended_h for life in r.lives if life.offering.market == "spot") > 16.0


def test_spot_gone_for_good_leaves_the_rest_to_an_on_demand_ring_no_dearer_than_on_demand_alone():
    # A ($1/h, on-demand $4/h, 100/s) is there for the first hour, then gone for good; 3.6M
    # samples by 12 h (2 h margin), rings cost their all-reduce (100 MB, 256 a step: 2 A
    # 0.94 efficient, 3 A 0.88, 16 A 0.52). On-demand alone runs one for 10 h: $40.
    # Waiting for spot until only the fastest on-demand ring (16) could still finish left
    # the rest to 4-6 on-demand in the last 3 h: $40.61, 1.015x on-demand alone's cost per
    # sample (invariant 1). Once the outage outlasts the margin and every outage seen, the
    # slack counts on the fastest ring that keeps the invariant: on-demand from 6.9 h on
    # 3 at most, $37.60.
    quotes = (PriceQuote(A, at(0), 1.0, 4.0),)
    av = (Availability(A, at(0), 100), Availability(A, at(1), 0), Availability(A, at(14), 0))
    world = build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=16)
    kw = dict(max_size=16, model_mb=100, global_batch=256)
    r = simulate_policy(world, "spotring", params(**kw), work=3.6e6, deadline_h=12.0)
    od = simulate_policy(world, "on-demand", params(**kw), work=3.6e6, deadline_h=12.0)
    assert r.deadline_met and r.finished and od.finished
    assert r.cost_per_m <= od.cost_per_m * (1 + 1e-9)
    assert sum(life.cost for life in r.lives if life.offering.market == "spot") > 0.5
    assert max(sizes_of(r)) <= 3
