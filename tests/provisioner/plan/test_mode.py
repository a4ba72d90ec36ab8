"""The training mode a planned fleet runs: the ring in one zone, hybrid across zones or
when speeds differ widely (provisioner/plan/mode.py)."""

from __future__ import annotations

from pricing.model import Offering
from provisioner.plan.mode import training_mode
from provisioner.plan.model import Candidate, Plan
from provisioner.plan.virtual import VirtualWorkers


def O(zone: str, itype: str = "p3.2xlarge", region: str = "us-east-1") -> Offering:
    return Offering("aws", region, zone, itype, "spot")


def plan_of(*held: tuple[Candidate, int]) -> Plan:
    return Plan(counts={c.offering: n for c, n in held if n}, cost_per_hour=1.0,
                throughput=1.0, hazard_per_hour=0.0, binding=(), status="optimal",
                chosen=tuple(c for c, _ in held))


def test_one_zone_of_like_instances_runs_the_ring():
    a = Candidate(O("us-east-1a"), 1.0, 100)
    b = Candidate(O("us-east-1a", "g5.xlarge"), 1.0, 50)  # 2x: within the spread
    choice = training_mode(plan_of((a, 3), (b, 2)))
    assert choice.mode == "ring" and choice.groups == {}


def test_a_fleet_across_zones_runs_hybrid_a_group_per_zone():
    a, b = Candidate(O("us-east-1a"), 1.0, 100), Candidate(O("us-east-1b"), 1.0, 100)
    choice = training_mode(plan_of((a, 2), (b, 2)))
    assert choice.mode == "hybrid" and "2 zones" in choice.reason
    assert choice.groups == {a.offering.key: "us-east-1/us-east-1a",
                             b.offering.key: "us-east-1/us-east-1b"}


def test_speeds_that_differ_widely_in_one_zone_run_hybrid_a_group_per_type():
    fast = Candidate(O("us-east-1a"), 3.0, 300)
    slow = Candidate(O("us-east-1a", "g4dn.xlarge"), 1.0, 100)  # 3x slower
    choice = training_mode(plan_of((fast, 2), (slow, 2)))
    assert choice.mode == "hybrid" and "3.0x" in choice.reason
    assert set(choice.groups.values()) == {"us-east-1/us-east-1a/p3.2xlarge",
                                           "us-east-1/us-east-1a/g4dn.xlarge"}


def test_one_instance_or_offerings_not_bought_run_the_ring():
    a, b = Candidate(O("us-east-1a"), 1.0, 100), Candidate(O("us-east-1b"), 1.0, 10)
    assert training_mode(plan_of((a, 1))).mode == "ring"
    assert training_mode(plan_of((a, 3), (b, 0))).mode == "ring"  # b chosen, none held


def test_virtual_workers_run_the_pipeline_mode_whatever_the_zones():
    vw = VirtualWorkers(O("us-east-1a", "g4dn.xlarge"), 2.0, 100, stages=2, instances=2)
    b = Candidate(O("us-east-1b"), 1.0, 100)
    choice = training_mode(plan_of((vw, 2), (b, 1)))
    assert choice.mode == "pipeline" and "2 stages" in choice.reason


def test_a_run_fixes_one_mode_the_config_the_local_cloud_or_the_first_plan():
    import pytest

    from provisioner.plan.mode import run_mode

    a, b = Candidate(O("us-east-1a"), 1.0, 100), Candidate(O("us-east-1b"), 1.0, 100)
    spread = plan_of((a, 2), (b, 2))
    assert run_mode("auto", "aws", spread).mode == "hybrid"
    assert run_mode("auto", "local", spread).mode == "ring"  # emulated zones: one host
    named = run_mode("hybrid", "local", spread)
    assert named.mode == "hybrid" and named.groups == training_mode(spread).groups
    assert run_mode("ring", "aws", spread) == run_mode("ring", "aws", spread)
    assert run_mode("ring", "aws", spread).mode == "ring"
    assert run_mode("auto", "gcp", None).mode == "ring"  # no plan: the ring
    with pytest.raises(ValueError, match="job.mode"):
        run_mode("fast", "aws", spread)
