"""build_problem: settings, quotes and risks into a Problem; the deadline floor by hand."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pricing.model import Offering, PriceQuote, RiskEstimate
from provisioner.config import parse_settings
from provisioner.errors import InfeasibleError
from provisioner.plan.build import build_problem
from provisioner.plan.pacing import deadline_floor
from provisioner.plan.solve import solve

NOW = datetime(2024, 1, 1, 12, tzinfo=timezone.utc)
A = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
B = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "spot")


def settings(**objective):
    return parse_settings({"job": {"throughput_priors": {"p3.2xlarge": 400.0}, "model_mb": 0.001},
                           "objective": objective or {"kind": "max-throughput"},
                           "fleet": {"max_size": 4, "max_zone_share": 1.0}})


def test_quotes_become_spot_and_on_demand_candidates_with_hazards():
    quotes = [PriceQuote(A, NOW - timedelta(hours=1), 1.0, 3.06),
              PriceQuote(A, NOW - timedelta(days=30), 0.5, 3.06),  # older: superseded
              PriceQuote(B, NOW - timedelta(days=30), 0.2, 3.06),  # stale (> 14 days): ignored
              PriceQuote(Offering("aws", "us-east-1", "us-east-1a", "zz9.huge"), NOW, 0.1, 1.0)]
    risks = {A: RiskEstimate(A, 0.5, "mle")}
    p = build_problem(settings(), quotes, risks, now=NOW)
    by = {c.offering: c for c in p.candidates}
    assert set(by) == {A, A.with_market("on-demand")}
    assert by[A].price_per_hour == 1.0 and by[A].hazard_per_hour == 0.5
    assert by[A.with_market("on-demand")].price_per_hour == 3.06
    assert by[A.with_market("on-demand")].hazard_per_hour == 0.0
    assert any("zz9.huge" in n for n in p.notes)


def test_avoided_zone_may_keep_but_not_grow_unless_every_zone_is_avoided():
    quotes = [PriceQuote(A, NOW, 1.0), PriceQuote(B, NOW, 1.2)]
    p = build_problem(settings(), quotes, {}, now=NOW, current={A: 1}, avoid=["us-east-1a"])
    plan = solve(p)
    assert plan.counts[A] == 1 and plan.counts[B] == 3  # max-throughput fills 4, A cannot grow
    every = build_problem(settings(), quotes, {}, now=NOW, avoid=["us-east-1a", "us-east-1b"])
    assert any("avoiding none" in n for n in every.notes)
    assert all(c.max_count is None for c in every.candidates)


def test_deadline_sets_the_rate_and_a_passed_deadline_is_infeasible():
    s = settings(kind="deadline", work_samples=400 * 3600 * 10.0, deadline_hours=20.0)
    p = build_problem(s, [PriceQuote(A, NOW, 1.0, 3.06)], {}, now=NOW, work_done=400 * 3600 * 5.0,
                      elapsed_hours=10.0)
    # 5 instance-hours of work left in 10 h, paced to the deadline less its 2 h safety
    # margin (the planner's pace): 8 h -> 250 samples/s
    assert p.target_samples_per_s == pytest.approx(250.0)
    with pytest.raises(InfeasibleError, match="deadline has passed"):
        build_problem(s, [PriceQuote(A, NOW, 1.0)], {}, now=NOW, elapsed_hours=21.0)


def test_deadline_floor_phases_on_demand_in_as_the_slack_shrinks():
    # 10 h left, work needs 4 h on the largest on-demand fleet: slack 6 h.
    rate, work, od = 100.0, 4 * 3600 * 1000.0, 1000.0
    assert deadline_floor(rate, work, 10.0, od, safety_hours=2.0) == 0.0      # slack 6 > 2
    assert deadline_floor(rate, work, 5.0, od, safety_hours=2.0) == pytest.approx(50.0)  # slack 1
    assert deadline_floor(rate, work, 4.0, od, safety_hours=2.0) == pytest.approx(100.0)  # none


def test_a_candidate_capped_at_what_it_holds_may_keep_but_not_grow():
    from provisioner.plan.model import Candidate
    c = Candidate(A, 1.0, 100.0, current=3)
    assert c.room and c.capped_at_held().max_count == 3 and not c.capped_at_held().room
    # a known cap below what it holds stays; one above it comes down to it
    assert Candidate(A, 1.0, 100.0, max_count=2, current=3).capped_at_held().max_count == 2
    assert Candidate(A, 1.0, 100.0, max_count=5, current=3).capped_at_held().max_count == 3
