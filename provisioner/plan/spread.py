"""Correlated revocations: how likely a fleet loses half its ring at once, and spreading it.

Design: pure helpers of :mod:`provisioner.plan.pipeline`. Interruptions of one instance type
in one zone (a pool) come together (Spot-and-Scoot: over 92% within 3 minutes of each
other; in the shared traces one event takes 54% of an AWS pool and 17% of a GCP one:
:func:`pricing.risk.co_fractions`), so a ring in one pool can lose half of itself in one
window even at a modest hazard. :func:`half_loss` prices a plan's chance of that in one
3-minute window (:func:`pricing.risk.half_ring_loss` over its pools, each with its hazard
and share); :func:`spread_problem` is the same problem with every zone held below half the
fleet. The planner takes the spread fleet when the plan's chance is above
``fleet.max_half_ring_loss`` and the spread one is below it at no more than
``fleet.spread_cost_tolerance`` times the cost per useful sample; else it keeps the plan
and says what the risk is.

Rule: callers pass the market view the plan was made from (its hazards and shares).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from pricing.model import Offering
from pricing.risk import DEFAULT_CO_FRACTION, half_ring_loss
from provisioner.plan.model import Plan, Problem


def half_loss(plan: Plan, co_fraction: Mapping[Offering, float]) -> float:
    """The chance one 3-minute window revokes at least half of ``plan``'s instances (its
    pools: (region, zone, instance type) of spot offerings; on-demand never goes)."""
    pools: dict[tuple, tuple[int, float, float]] = {}
    for c in plan.chosen:
        o = c.offering
        n = plan.counts.get(o, 0)
        if n <= 0:
            continue
        if o.market != "spot":
            pools[("on-demand", o)] = (n, 0.0, 0.0)
            continue
        q = co_fraction.get(o, DEFAULT_CO_FRACTION.get(o.cloud, 1.0))
        key = (o.region, o.zone, o.instance_type)
        held, h, _ = pools.get(key, (0, 0.0, q))
        pools[key] = (held + n, max(h, c.hazard_per_hour), q)
    return half_ring_loss(pools)


def spread_problem(prob: Problem) -> Problem:
    """``prob`` with every zone's spot instances below half the fleet (no allowance)."""
    return replace(prob, max_zone_share=min(prob.max_zone_share, 0.4999), zone_allowance=0)


def per_sample(plan: Plan) -> float:
    """USD per useful sample of a plan (inf when it delivers none)."""
    return plan.cost_per_hour / plan.throughput if plan.throughput > 0 else float("inf")
