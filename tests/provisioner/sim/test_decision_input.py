"""One decision input: the daemon, `provision plan` and the simulator's spotring build the
planner's input with the same function, from the same settings, whole."""

from __future__ import annotations

import dataclasses
import sys

from pricing.sources import synthetic
from pricing.sources.trace import TraceSource
from provisioner.config import parse_settings
from provisioner.daemon.state import State
from provisioner.daemon.wiring import build_daemon
from provisioner.drivers.local import LocalDriver
from provisioner.plan.objective import Goal, planner_input
from provisioner.sim.policies import Params, Spotring

#: A config whose every planner-facing figure differs from the default (the simulator used
#: to rebuild the planner's settings and drop budget, quotas, markets, links, ...).
CONFIG = {
    "job": {"model_mb": 80.0, "activation_mb": 2.5, "global_batch": 2048,
            "max_hourly_cost": 40.0, "max_spot_price": 2.5, "budget_usd": 500.0},
    "objective": {"kind": "deadline", "work_samples": 3e8, "deadline_hours": 30.0,
                  "safety_hours": 3.0, "budget_per_hour": 60.0},
    "fleet": {"min_size": 1, "max_size": 12, "markets": ["spot"], "max_zone_share": 0.6,
              "zone_allowance": 2, "region_quota_gpus": {"us-east-1": 10},
              "family_quota_gpus": {"p3": 8}, "max_regions": 2, "boot_s": 240.0,
              "reform_s": 7.0, "step_s": 2.0, "churn_horizon_hours": 2.0,
              "intra_zone_gbps": 25.0, "inter_zone_gbps": 12.0, "inter_region_gbps": 3.0,
              "max_half_ring_loss": 0.1, "spread_cost_tolerance": 1.2},
    "source": {"regions": ["us-east-1", "us-west-2"], "gpus": ["V100"]},
    "pacing": {"ahead_tolerance": 1.2, "catch_up_tolerance": 1.1, "bank_hours": 3.0,
               "spot_share": 0.6, "share_prior_hours": 12.0,
               "work_per_dollar_steps": [3.0]},
    "optimizer": {"time_limit_s": 2.0, "default_spot_hazard_per_hour": 0.2},
    "daemon": {"plan_s": 20.0, "max_launches_per_round": 3, "max_removals_per_round": 1},
}


def _daemon(tmp_path, settings):
    drv = LocalDriver(tmp_path / "cloud", lambda s: [sys.executable, "-c", "pass"],
                      clock=lambda: synthetic.DEFAULT_START)
    snap = synthetic.generate(synthetic.GeneratorParams(outages_per_hour=0.0))
    return build_daemon(settings, drv, TraceSource([], snapshot=snap),
                        State(tmp_path / "state.sqlite"), now=lambda: synthetic.DEFAULT_START)


def test_the_daemon_and_the_simulator_build_equal_planner_inputs_from_one_config(tmp_path):
    settings = parse_settings(CONFIG)
    daemon = _daemon(tmp_path, settings)
    p = Params(settings, itype="p3.2xlarge", size=4)
    speed = {"p3.2xlarge": 400.0}
    # `provision simulate --config c.toml --work 3e8` (the config's deadline) and with the
    # same --deadline given: the daemon's own input, equal as frozen data
    for deadline_h in (None, 30.0):
        sim = Spotring.for_job(p, work=3e8, deadline_h=deadline_h, speed=speed)
        assert sim.planner.input == daemon.planner.input == planner_input(settings)
    assert daemon.planner.goal == Goal(3e8, 30 * 3600.0, True, 500.0)


def test_the_planner_input_carries_every_setting_whole():
    # every planner setting of CONFIG reaches the input (none falls back to its default),
    # and the simulator's execution model reads the same figures
    mine = planner_input(parse_settings(CONFIG)).settings
    default = planner_input(parse_settings({})).settings
    same = [f.name for f in dataclasses.fields(mine)
            if f.name != "bounds" and getattr(mine, f.name) == getattr(default, f.name)]
    assert same == []
    b, d = mine.bounds, default.bounds
    same_bounds = [f.name for f in dataclasses.fields(b) if f.name not in (
        "candidates", "objective", "target_samples_per_s", "ondemand_floor_samples_per_s",
        "notes") and getattr(b, f.name) == getattr(d, f.name)]
    assert same_bounds == []
    assert b.budget_per_hour == 40.0  # the smaller of the two hourly caps
    p = Params(parse_settings(CONFIG), itype="p3.2xlarge", size=4)
    assert (p.boot_s, p.reform_s, p.step_s, p.model_mb, p.global_batch, p.links) == (
        240.0, 7.0, 2.0, 80.0, 2048, (25.0, 12.0, 3.0))
    assert (p.max_launches, p.max_removals, p.plan_s) == (3, 1, 20.0)


def test_without_a_deadline_the_simulator_paces_to_the_baselines_ring_softly():
    # no deadline anywhere: min-cost at the nominal ring's rate with the work: a soft pace
    p = Params(parse_settings({}), itype="p3.2xlarge", size=4)
    sim = Spotring.for_job(p, work=1.2e8, deadline_h=None, speed={"p3.2xlarge": 400.0})
    nominal = p.nominal_rate({"p3.2xlarge": 400.0})
    assert sim.planner.goal == Goal(1.2e8, 1.2e8 / nominal, False, None)
    # the same objective in a config file gives the daemon the same goal
    cfg = parse_settings({"objective": {"kind": "min-cost", "target_samples_per_s": nominal,
                                        "work_samples": 1.2e8}})
    assert planner_input(cfg).goal == sim.planner.goal
