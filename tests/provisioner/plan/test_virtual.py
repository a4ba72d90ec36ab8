"""Virtual workers in the plan: a model too big for one GPU is bought as whole virtual
workers of cheaper GPUs, priced as such, and turned back into instances."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pricing.model import Offering
from provisioner.plan import virtual
from provisioner.plan.model import Candidate, Problem
from provisioner.plan.pipeline import (FleetView, MarketView, Planner, PlanSettings, Progress,
                                        keep)

T4 = Offering("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "spot")  # 1 x T4, 16 GiB
T4X4 = Offering("aws", "us-east-1", "us-east-1a", "g4dn.12xlarge", "spot")  # 4 x T4
A100 = Offering("aws", "us-east-1", "us-east-1b", "a2-ultragpu-1g", "spot")  # 1 x A100 80 GiB


def test_the_memory_need_and_the_smallest_virtual_worker_that_holds_it() -> None:
    assert virtual.need_gib(1024) == pytest.approx(5.0)  # 1 GiB of gradients: 5 GiB
    assert virtual.shape(16, 1, 29.0) == (2, 2)  # two single-GPU instances
    assert virtual.shape(16, 1, 33.0) == (3, 3)
    assert virtual.shape(16, 4, 29.0) == (4, 1)  # one instance of 4 GPUs: 4 stages
    assert virtual.shape(16, 1, 16.0 * 17) is None  # more than MAX_STAGES
    assert virtual.efficiency(1) == 1.0
    assert virtual.efficiency(4) == pytest.approx(16 / 19)


def test_offerings_too_small_become_virtual_worker_candidates_priced_whole() -> None:
    model_mb = 6000.0  # ~29 GiB to train
    cands = [Candidate(T4, 0.2, 100.0, 0.1, 0.05, 1, 7, 3),
             Candidate(T4X4, 1.0, 380.0, 0.1, 0.05, 4, None, 0),
             Candidate(A100, 1.5, 600.0, 0.2, 0.05, 1, None, 0)]
    out, notes = virtual.expand(cands, model_mb)
    t4, t4x4, a100 = out
    assert a100 == cands[2]  # it fits: the ring's candidate, untouched
    assert isinstance(t4, virtual.VirtualWorkers) and (t4.stages, t4.instances) == (2, 2)
    assert t4.price_per_hour == pytest.approx(0.4)
    assert t4.samples_per_s == pytest.approx(200.0 * 8 / 9)  # the bubble of 2 stages
    assert t4.hazard_per_hour == pytest.approx(0.2)  # either member's revocation
    assert (t4.gpus, t4.max_count, t4.current) == (2, 3, 1)  # in whole VWs
    assert isinstance(t4x4, virtual.VirtualWorkers) and (t4x4.stages, t4x4.instances) == (4, 1)
    assert notes and "virtual workers" in notes[0] and "g4dn.xlarge x2 (2 stages)" in notes[0]


def test_a_model_that_fits_leaves_the_candidates_alone() -> None:
    cands = [Candidate(T4, 0.2, 100.0, 0.1, 0.05, 1)]
    assert virtual.expand(cands, 500.0) == (cands, [])


def test_the_planner_buys_cheap_gpus_as_whole_virtual_workers_and_counts_instances() -> None:
    # 29 GiB to train: a T4 (16 GiB) cannot hold it alone. A100s hold it but cost more per
    # sample than pairs of T4s do: the planner buys pairs, priced whole, and the target
    # fleet has an even number of T4 instances.
    settings = PlanSettings(bounds=Problem((), model_mb=6000.0, budget_per_hour=2.0,
                                           max_size=20), markets=("spot",))
    market = MarketView(prices={T4: 0.20, A100: 1.50},
                        speeds={"g4dn.xlarge": 100.0, "a2-ultragpu-1g": 400.0},
                        gpus={"g4dn.xlarge": 1, "a2-ultragpu-1g": 1})
    got = Planner(settings).decide(market, FleetView(), Progress(), now=0.0)
    assert got.plan is not None
    assert got.target.get(T4, 0) >= 2 and got.target[T4] % 2 == 0, got.explain()
    assert got.target.get(T4, 0) == 2 * got.plan.counts[T4]
    assert any("virtual workers" in n for n in got.plan.notes)
    assert got.plan.cost_per_hour <= 2.0 + 1e-9


def test_kept_instances_pin_the_whole_virtual_workers_they_make() -> None:
    vw, = virtual.expand([Candidate(T4, 0.2, 100.0, 0.1, 0.05, 1)], 6000.0)[0]
    ring = Candidate(A100, 1.5, 600.0, 0.2, 0.05, 1)
    assert virtual.units(vw, 5) == 2 and virtual.units(ring, 5) == 5
    prob = keep(Problem((vw, ring), model_mb=6000.0, budget_per_hour=10.0, max_size=20),
                {T4: 5, A100: 1}, max_regions=2)
    assert [c.min_count for c in prob.candidates] == [2, 1]  # 5 T4s: two pairs kept


# -- activations between stages, and a VW counted as its instances (issue 19, item 4) -------

T4B = Offering("aws", "us-east-1", "us-east-1b", "g4dn.xlarge", "spot")


def test_activations_slow_a_virtual_worker_only_beyond_what_its_compute_hides() -> None:
    full = 2 * 100.0 * virtual.efficiency(2)  # two instances of 100 samples/s, 2 stages
    assert virtual.vw_speed(100.0, 2, 2) == pytest.approx(full)
    # 1 MB/sample both ways over 10 Gb/s: 1.6 ms/sample on the link, 5 ms of compute: hidden
    assert virtual.vw_speed(100.0, 2, 2, 1.0, 10.0) == pytest.approx(full)
    # 10 MB/sample: 16 ms on the link, 11 ms beyond the 5 ms of compute per sample
    t = 1 / full + (0.016 - 0.005)
    assert virtual.vw_speed(100.0, 2, 2, 10.0, 10.0) == pytest.approx(1 / t)
    # a slower link only slows it more; stages inside one instance cross no network
    assert virtual.vw_speed(100.0, 2, 2, 10.0, 1.0) < virtual.vw_speed(100.0, 2, 2, 10.0, 10.0)
    assert virtual.vw_speed(380.0, 1, 4, 10.0, 1.0) == pytest.approx(
        380.0 * virtual.efficiency(4))


def test_expand_prices_the_activations_and_says_so() -> None:
    c = Candidate(T4, 0.2, 100.0, 0.1, 0.05, 1)
    (fast,), _ = virtual.expand([c], 6000.0, activation_mb=1.0, gbps=10.0)
    (slow,), notes = virtual.expand([c], 6000.0, activation_mb=10.0, gbps=1.0)
    assert fast.samples_per_s == pytest.approx(200.0 * 8 / 9)
    assert slow.samples_per_s == pytest.approx(virtual.vw_speed(100.0, 2, 2, 10.0, 1.0))
    assert slow.samples_per_s < fast.samples_per_s / 5
    assert any("activations of 10 MB/sample over 1 Gb/s" in n for n in notes), notes
    assert virtual.per_unit(slow) == 2 and virtual.per_unit(c) == 1


def test_the_fleet_size_cap_and_zone_shares_count_a_virtual_worker_as_its_instances() -> None:
    from provisioner.plan.solve import solve

    # a VW (2 instances, zone a) far faster than the single instances of zone b
    vw, = virtual.expand([Candidate(T4, 0.2, 1000.0, 0.0, 0.0, 1)], 6000.0)[0]
    one = Candidate(T4B, 0.2, 50.0, 0.0, 0.0, 1)
    plan = solve(Problem((vw,), model_mb=6000.0, max_size=5))
    assert plan.counts[T4] == 2  # 2 VWs = 4 instances; a third would be 6 > 5
    plan = solve(Problem((vw, one), model_mb=6000.0, max_size=4, max_zone_share=0.5,
                         zone_allowance=0))
    held = virtual.instances(plan)
    assert sum(held.values()) <= 4, plan.explain()
    assert held.get(T4, 0) <= 0.5 * sum(held.values()), plan.explain()
    assert held.get(T4, 0) == 2 and held.get(T4B, 0) == 2, plan.explain()


@pytest.mark.parametrize("activation_mb, gbps, want", [
    (1.0, 10.0, "vw"),  # small activations, fast link: pairs of T4s, as without them
    (50.0, 1.0, "ring"),  # 50 MB a sample each way over 1 Gb/s: the A100 ring
])
def test_the_planner_weighs_the_activations_between_stages(activation_mb: float, gbps: float,
                                                            want: str) -> None:
    # $1.60/h buys one A100 (400 samples/s) or four pairs of T4s (4 x 178 without the
    # activations' cost, 4 x 1.2 with 50 MB/sample over 1 Gb/s)
    settings = PlanSettings(bounds=Problem((), model_mb=6000.0, budget_per_hour=1.6,
                                           max_size=20, activation_mb=activation_mb,
                                           intra_zone_gbps=gbps), markets=("spot",))
    market = MarketView(prices={T4: 0.20, A100: 1.50},
                        speeds={"g4dn.xlarge": 100.0, "a2-ultragpu-1g": 400.0},
                        gpus={"g4dn.xlarge": 1, "a2-ultragpu-1g": 1})
    got = Planner(settings).decide(market, FleetView(), Progress(), now=0.0)
    assert got.plan is not None
    if want == "vw":
        assert got.target.get(T4, 0) >= 2 and not got.target.get(A100), got.explain()
    else:
        assert got.target.get(A100, 0) >= 1 and not got.target.get(T4), got.explain()


def test_a_bad_activation_size_is_refused_naming_the_field() -> None:
    from provisioner.config import parse_settings
    from provisioner.errors import ConfigError

    with pytest.raises(ConfigError, match="activation_mb"):
        parse_settings({"job": {"activation_mb": -1}})


def test_the_pacing_estimates_count_a_virtual_worker_as_its_instances() -> None:
    from provisioner.plan import pacing

    vw, = virtual.expand([Candidate(T4, 0.2, 100.0, 0.0, 0.0, 1)], 6000.0)[0]
    od = replace(vw, offering=replace(T4, market="on-demand"))
    one = vw.samples_per_s
    # max_size 5 instances: two VWs of two, never five VWs
    assert pacing.od_capacity([od], 5, 0.0, 256, 10.0) == pytest.approx(2 * one)
    assert pacing.per_sample_fleet([vw], 2.5 * one, 5, 0.0, 256, 10.0) is None
    assert pacing.catch_up_rate([vw], one, 10.0, 5, 0.0, 256, 10.0) == pytest.approx(2 * one)
