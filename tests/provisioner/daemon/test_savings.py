"""The savings and the ETA: pure arithmetic, written out by hand."""

import pytest

from provisioner.daemon.view.savings import (Life, Revocation, Savings, boot_seconds,
                                        checkpoint_restart, eta_s, on_demand,
                                        samples_per_epoch, saved, spared_seconds)


def test_checkpoint_restart_charges_idle_survivors_and_half_an_interval_after_a_kill():
    # fleet of 3 at $1/h each; a notice: the two survivors idle 600 s through the boot
    notice = Revocation(t=100.0, notice=True, fleet_per_hour=3.0, revoked_per_hour=1.0)
    usd, lost = checkpoint_restart(10.0, [notice], boot_s=600.0, every_s=300.0)
    assert usd == pytest.approx(10.0 + 600 * 2.0 / 3600)
    assert lost == 600.0
    # a kill also redoes half the checkpoint interval on the whole fleet
    kill = Revocation(t=200.0, notice=False, fleet_per_hour=3.0, revoked_per_hour=1.0)
    usd, lost = checkpoint_restart(10.0, [kill], boot_s=600.0, every_s=300.0)
    assert usd == pytest.approx(10.0 + (600 * 2.0 + 150 * 3.0) / 3600)
    assert lost == 750.0


def test_a_booting_instance_revoked_costs_checkpoint_restart_nothing():
    booting = Revocation(t=1.0, notice=False, fleet_per_hour=3.0, revoked_per_hour=1.0,
                         member=False)
    assert checkpoint_restart(5.0, [booting], 600.0, 300.0) == (5.0, 0.0)


def test_saved_is_one_minus_the_ratio():
    assert saved(1.0, 4.0) == 0.75
    assert saved(2.0, 2.0) == 0.0
    assert saved(3.0, 2.0) == pytest.approx(-0.5)  # dearer than the baseline: said so
    assert saved(1.0, 0.0) is None
    s = Savings(1.0, 4.0, 2.0, 0.0, 0.0, 0)
    assert (s.vs_on_demand, s.vs_checkpoint_restart) == (0.75, 0.5)
    assert s.as_figures()["saved_vs_on_demand"] == 0.75


def test_on_demand_spares_the_replacements_boot_and_a_booting_victims_life():
    lives = [Life("a", 0.0, 1000.0, joined=100.0),     # member, revoked at 500
             Life("b", 0.0, 50.0, joined=None),        # revoked at 50 while booting
             Life("c", 60.0, 2000.0, joined=160.0),    # b's replacement (its boot: not spared)
             Life("r", 500.0, 2000.0, joined=700.0)]   # a's replacement: boot 200 s spared
    spared = spared_seconds(lives, [(500.0, "a"), (50.0, "b")])
    assert spared == {"b": 50.0, "r": 200.0}
    assert on_demand(10.0, 0.5) == 9.5
    assert on_demand(0.1, 0.5) == 0.0


def test_a_replacement_is_counted_once():
    lives = [Life("a", 0.0, 500.0, 10.0), Life("b", 0.0, 500.0, 10.0),
             Life("r", 500.0, 900.0, None)]
    # two members revoked at once; only one instance came after: one boot (its whole life)
    assert spared_seconds(lives, [(500.0, "a"), (500.0, "b")]) == {"r": 400.0}


def test_boot_is_the_median_launch_to_join():
    assert boot_seconds({"a": 0.0, "b": 10.0, "c": 20.0}, {"a": 100.0, "b": 30.0}) == 60.0
    assert boot_seconds({"a": 0.0}, {}) == 0.0


def test_samples_per_epoch_from_where_the_epoch_moved():
    pts = [(0, 0, 0), (10, 0, 500), (20, 1, 1100), (30, 1, 1600), (40, 2, 2050)]
    assert samples_per_epoch(pts) == 1025.0
    assert samples_per_epoch(pts[:2]) is None


def test_eta_is_remaining_samples_over_the_recent_rate():
    # 1000 samples per epoch, 10 samples per (simulated) second, 3 epochs in all
    pts = [(t, t // 100, t * 10) for t in range(0, 201, 10)]
    assert eta_s(pts, 3) == pytest.approx((3000 - 2000) / 10)
    assert eta_s(pts, None) is None
    assert eta_s(pts[:5], 3) is None  # no epoch done yet: no length per epoch
    assert eta_s([(0, 1, 1000), (10, 1, 1000)], 3) is None  # no progress: no ETA
    assert eta_s(pts, 2) == 0.0  # past the end
