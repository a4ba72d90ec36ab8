"""Budgets in the planner: an hourly cap, a spot price cap, a total that stops the job
before it is spent, and a warning before it starts when it cannot finish the work."""

from __future__ import annotations

import pytest

from pricing.model import Offering
from provisioner.config import parse_settings
from provisioner.plan import budget
from provisioner.plan.objective import planner_input
from provisioner.plan.pipeline import FleetView, MarketView, Planner

SPOT = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
SPOT_B = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "spot")
OD = Offering("aws", "us-east-1", "*", "p3.2xlarge", "on-demand")
MARKET = MarketView(prices={SPOT: 1.0, SPOT_B: 1.5, OD: 3.0}, speeds={"p3.2xlarge": 100.0},
                    hazards={SPOT: 0.0, SPOT_B: 0.0})


def planner(**sections) -> Planner:
    base = {"job": {"model_mb": 0.0}, "fleet": {"boot_s": 0.0, "reform_s": 0.0}}
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return Planner.of(planner_input(parse_settings(base)))


def test_max_hourly_cost_caps_every_fleet_and_the_smaller_cap_holds():
    pl = planner(job={"max_hourly_cost": 2.5})  # max-throughput: as many as the cap allows
    d = pl.decide(MARKET, FleetView(), pl.goal.progress(0.0), 0.0)
    assert d.plan is not None and d.plan.cost_per_hour <= 2.5 and d.plan.size == 2
    both = planner(job={"max_hourly_cost": 5.0}, objective={"budget_per_hour": 1.2})
    d = both.decide(MARKET, FleetView(), both.goal.progress(0.0), 0.0)
    assert d.target == {SPOT: 1}


def test_a_spot_offering_above_max_spot_price_is_not_held():
    # zone b's $1.5 is above the cap: only a's instance... and one held in b is given up
    pl = planner(job={"max_spot_price": 1.2, "max_hourly_cost": 4.0},
                 fleet={"max_size": 4, "markets": ["spot"]})
    d = pl.decide(MARKET, FleetView(held={SPOT_B: 2}), pl.goal.progress(0.0), 0.0)
    assert SPOT_B not in d.target and d.target == {SPOT: 4}
    assert any("max_spot_price" in n for n in d.plan.notes)


def test_the_budget_stops_the_job_while_the_fleet_can_still_be_paid_down():
    # 4 held at $1/h; the daemon plans every 30 s and removes 2 a round: 1 + 2 rounds of
    # 30 s at $4/h = $0.10 is kept to take them down. $0.11 left: go on, and decide again
    # when $0.10 is left (9 s later); $0.10 left: stop.
    pl = planner(job={"budget_usd": 10.0, "max_hourly_cost": 4.0})
    held = FleetView(held={SPOT: 4})
    d = pl.decide(MARKET, held, pl.goal.progress(0.0, spent=9.89), 100.0)
    assert d.stop is None and d.wake_at == pytest.approx(100.0 + 0.01 / 4.0 * 3600)
    d = pl.decide(MARKET, held, pl.goal.progress(0.0, spent=9.90), 100.0)
    assert d.stop is not None and d.target == {} and "budget spent" in d.explain()
    assert budget.reserve_usd(4.0, 4, 30.0, 2) == pytest.approx(0.1)


def test_the_plan_says_before_it_starts_when_the_budget_cannot_finish_the_work():
    # 3.6e6 samples at the cheapest $1/h per 100/s cost $10 at least: a $5 budget cannot
    # finish them; a $20 one can (no warning)
    obj = {"kind": "deadline", "work_samples": 3.6e6, "deadline_hours": 20.0}
    short = planner(job={"budget_usd": 5.0}, objective=obj)
    d = short.decide(MARKET, FleetView(), short.goal.progress(0.0), 0.0)
    warning = [n for n in d.plan.notes if n.startswith("budget:")]
    assert len(warning) == 1 and "$10.00" in warning[0] and "50%" in warning[0]
    assert "budget:" in d.explain()
    assert d.budget_warning == warning[0]  # the field the simulator reads
    enough = planner(job={"budget_usd": 20.0}, objective=obj)
    d = enough.decide(MARKET, FleetView(), enough.goal.progress(0.0), 0.0)
    assert not any(n.startswith("budget:") for n in d.plan.notes)
    assert d.budget_warning is None
