"""The bound of the policies that keep a deadline safe (``hindsight(fallback=...)``) and the
line ``provision simulate`` prints of it: what a deadline costs on a market at least."""

from __future__ import annotations

import math

import pytest

from pricing.model import Availability, PriceQuote, Snapshot
from provisioner.plan.model import ring_rate
from provisioner.plan.pacing import margin_hours
from provisioner.sim.hindsight import hindsight, od_ring_rate
from provisioner.sim.report import figures, run_all, summary
from provisioner.sim.world import build_world
from tests.provisioner.sim.test_simulate import A, SPEED, at, params

WORK = 3.0e6  # 1 spot instance (100 samples/s) does it in 8.33 h of a 10 h deadline


def one_spot_world(od: float | None = 4.0, end_h: float = 12.0):
    """One spot instance at most, $1/h, all along; on-demand $``od``/h (none: no price)."""
    quotes = (PriceQuote(A, at(0), 1.0, od),)
    av = (Availability(A, at(0), 1), Availability(A, at(end_h), 1))
    return build_world(Snapshot(quotes=quotes, availability=av), SPEED, max_size=4)


def test_the_fallback_rate_is_the_fastest_on_demand_ring_the_bound_credits():
    world = one_spot_world()
    assert od_ring_rate(world, params()) == pytest.approx(400.0)  # 4 x 100/s, no ring cost
    p = params(model_mb=100.0)
    assert od_ring_rate(world, p) == pytest.approx(
        ring_rate(4, 100.0, 100.0, p.global_batch, p.links[0]))
    assert od_ring_rate(one_spot_world(od=None), params()) == 0.0  # nothing to fall back on


def test_keeping_the_deadline_safe_costs_nothing_here_keeping_a_margin_costs_on_demand():
    # Spot alone finishes at 8.33 h, and the fastest on-demand ring (400/s) could do the
    # work left in time at every hour: safe at the bound's cost. Keeping 2 h of slack
    # against that ring means finishing by 8 h: 2.88e6 samples on spot by then, the other
    # 1.2e5 on on-demand (1/3 instance-hour at $4): $8 + $1.33 where the bound pays $8.33.
    world, p = one_spot_world(), params()
    bound = hindsight(world, p, work=WORK, horizon_h=10.0)
    safe = hindsight(world, p, work=WORK, horizon_h=10.0, fallback=(400.0, 0.0))
    kept = hindsight(world, p, work=WORK, horizon_h=10.0, fallback=(400.0, 2.0))
    assert bound.cost == pytest.approx(WORK / 360_000, rel=1e-6)
    assert safe.cost == pytest.approx(bound.cost, rel=1e-6)
    assert kept.cost == pytest.approx(8.0 + 4.0 / 3.0, rel=1e-4)
    assert kept.completion_h == pytest.approx(8.0, abs=0.11)
    od = [o for o in kept.fleet_by if o.market == "on-demand"]
    assert od and not [o for o in bound.fleet_by if o.market == "on-demand"]


def test_the_rows_hold_within_each_long_segment_of_the_trace():
    # The trace has no cut between 0 and its end: kept at the trace's cuts alone, the rows
    # would hold at the end only (the work spread over 10 h is 2.25e6 by 7.5 h, where 2 h of
    # slack needs 2.28e6). The margin's end is a cut of its own.
    import numpy as np

    world, p = one_spot_world(), params()
    kept = hindsight(world, p, work=WORK, horizon_h=10.0, fallback=(400.0, 2.0))
    xs, _, rates, _ = (np.asarray(v, dtype=float) for v in kept.series)
    done = np.concatenate([[0.0], np.cumsum(rates[:-1] * np.diff(xs) * 3600.0)])
    for h in (5.0, 6.0, 7.0, 7.5, 7.8, 8.0):
        need = WORK - 400.0 * 3600.0 * (10.0 - 2.0 - h)
        assert np.interp(h, xs, done) >= need - 1e-6 * WORK, h


def test_a_margin_no_fleet_keeps_is_infinite_and_says_why():
    world, p = one_spot_world(), params()
    work = 400.0 * 3600.0 * 8.5  # the fastest on-demand ring needs 8.5 h of the 10
    assert math.isfinite(hindsight(world, p, work=work, horizon_h=10.0,
                                   fallback=(400.0, 1.0)).cost)
    r = hindsight(world, p, work=work, horizon_h=10.0, fallback=(400.0, 2.0))
    assert r.cost == math.inf and "fallback" in r.status


def test_the_margin_is_the_planners_own():
    assert margin_hours(2.0, 34.4) == 2.0
    assert margin_hours(2.0, 4.0) == 1.0  # a short job keeps a quarter of its deadline


def test_simulate_prints_what_the_deadline_costs_at_least():
    world, p = one_spot_world(), params(safety_hours=2.0)
    r = run_all(world, ["spotring", "hindsight"], p, work=WORK, deadline_h=10.0, floors=True)
    f = figures(r)["hindsight"]
    assert f["deadline_safe_usd"] == pytest.approx(f["total_cost_usd"], rel=1e-4)
    assert f["margin_kept_usd"] == pytest.approx(8.0 + 4.0 / 3.0, rel=1e-3)
    assert f["margin_hours"] == 2.0
    text = summary(figures(r), None)
    assert "the deadline on this market, at least:" in text
    assert "(1.120x the bound) keeping 2 h of slack" in text
    # not asked for, without a deadline, or with no on-demand price: no such line
    for world, kw in ((one_spot_world(), dict(deadline_h=10.0)),
                      (one_spot_world(), dict(deadline_h=None, floors=True)),
                      (one_spot_world(od=None), dict(deadline_h=10.0, floors=True))):
        r = run_all(world, ["spotring", "hindsight"], p, work=WORK, **kw)
        assert "deadline_safe_usd" not in figures(r)["hindsight"]
        assert "at least:" not in summary(figures(r), None)


def test_a_floor_whose_solve_hit_its_time_limit_is_no_figure(monkeypatch):
    from provisioner.sim import report
    from provisioner.sim.result import Result

    def slow(world, params, *, work, horizon_h, fallback=None, **kw):
        if fallback is None:
            return hindsight(world, params, work=work, horizon_h=horizon_h, **kw)
        return Result("hindsight", math.inf, 0.0, work, None, None,
                      status=f"not solved (Time limit reached) within {horizon_h:.1f} h")

    monkeypatch.setattr(report, "hindsight", slow)
    world, p = one_spot_world(), params()
    assert report.deadline_floors(world, p, work=WORK, deadline_h=10.0) is None
    r = run_all(world, ["spotring", "hindsight"], p, work=WORK, deadline_h=10.0, floors=True)
    assert "deadline_safe_usd" not in figures(r)["hindsight"]
