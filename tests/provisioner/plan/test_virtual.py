"""Virtual workers in the plan: a model too big for one GPU is bought as whole virtual
workers of cheaper GPUs, priced as such, and turned back into instances."""

from __future__ import annotations

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
