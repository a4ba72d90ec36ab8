"""plan.pacing: the outage log that sets how far ahead to bank, by hand."""

from __future__ import annotations

import pytest

from provisioner.plan.pacing import HeldRate, OutageLog


def test_outage_log_measures_outages_from_failure_to_holding_again():
    log = OutageLog()
    log.observe(0.0, held=True, last_failure=None)
    assert log.bank_s(0.0) == 0.0 and not log.seen()  # nothing seen: no bank
    log.observe(50.0, held=False, last_failure=None)  # none held, none failed: no outage
    assert not log.seen()
    log.observe(100.0, held=False, last_failure=90.0)  # revoked at 90 s: out since then
    assert log.seen()
    log.observe(200.0, held=False, last_failure=150.0)  # a failed relaunch: the same outage
    assert log.bank_s(1890.0) == pytest.approx(1800.0)  # the running one counts so far
    log.observe(3690.0, held=True, last_failure=150.0)  # back: 3,600 s
    log.observe(4000.0, held=False, last_failure=150.0)  # not held, but no new failure
    assert log.lengths == [3600.0] and log.since is None and log.seen()  # ended, seen
    log.observe(5000.0, held=False, last_failure=4800.0)
    log.observe(6000.0, held=True, last_failure=4800.0)
    # length-biased mean: (3,600^2 + 1,200^2) / (3,600 + 1,200) = 3,000 s
    assert log.lengths == [3600.0, 1200.0]
    assert log.bank_s(6000.0) == pytest.approx(3000.0)


def test_held_rate_is_the_time_weighted_mean_over_the_horizon():
    h = HeldRate()
    assert h.mean(0.0, 3600.0) == 0.0  # nothing seen
    h.observe(0.0, 500.0, 3600.0)
    assert h.mean(0.0, 3600.0) == 500.0  # no time passed: the rate held
    h.observe(1800.0, 400.0, 3600.0)
    assert h.mean(3600.0, 3600.0) == pytest.approx(450.0)  # half an hour of each
    h.observe(3600.0, 0.0, 3600.0)
    h.observe(3600.0, 100.0, 3600.0)  # a second decision at the same moment replaces it
    assert h.mean(5400.0, 3600.0) == pytest.approx(250.0)  # 400 then 100, half each
    h.observe(9000.0, 100.0, 3600.0)
    assert h.mean(9000.0, 3600.0) == pytest.approx(100.0)
    assert h.steps == [(3600.0, 100.0), (9000.0, 100.0)]  # older steps forgotten


def test_outage_log_tells_a_running_outage_from_the_typical_one():
    log = OutageLog()
    log.observe(0.0, held=False, last_failure=0.0)  # spot never came: one outage running
    assert log.typical_s() == 0.0 and log.running_s(7_200.0) == 7_200.0
    log.observe(7_200.0, held=True, last_failure=0.0)
    assert log.running_s(7_300.0) == 0.0 and log.typical_s() == pytest.approx(7_200.0)


def test_on_demand_capacity_is_the_real_ring_of_max_size():
    # 16 x 400/s with a 50 MB gradient and a batch of 1,024 on 10 Gb/s: t_comm = 0.075 s,
    # efficiency 1 / (1 + 6,400 x 0.075 / 1,024) = 0.681, not 16 x 400 = 6,400/s.
    from pricing.model import Offering
    from provisioner.plan.model import Candidate
    from provisioner.plan.pacing import od_capacity
    od = Offering("aws", "us-east-1", "*", "p3.2xlarge", "on-demand")
    spot = od.with_market("spot")
    cands = [Candidate(od, 3.06, 400.0), Candidate(spot, 0.9, 400.0)]
    assert od_capacity(cands, 16, 50.0, 1024, 10.0) == pytest.approx(6400 / (1 + 6400 * 0.075 / 1024))


def test_catch_up_is_limited_to_rings_near_the_cost_per_sample_of_the_pace():
    # 400/s instances, 50 MB gradient, batch 1,024, 10 Gb/s: ring efficiency 0.914 at 4,
    # 0.889 at 5, 0.865 at 6, 0.842 at 7 (t_comm = 2 (n-1)/n x 0.04 s). A pace of 1,455/s
    # takes 4 instances (1,463/s); within 1.05x of their cost per sample a ring may have
    # 0.914 / 1.05 = 0.870 efficiency: 5 instances (1,778/s), not 6; within 1.10x: 7.
    from pricing.model import Offering
    from provisioner.plan.model import Candidate, ring_efficiency
    from provisioner.plan.pacing import catch_up_rate
    spot = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
    cands = [Candidate(spot, 0.9, 400.0, max_count=0)]  # out of capacity: a price level

    def ring(n: int) -> float:
        return n * 400.0 * ring_efficiency(n, n * 400.0, 50.0, 1024, 10.0)

    assert catch_up_rate(cands, 1455.0, 1.05, 16, 50.0, 1024, 10.0) == pytest.approx(ring(5))
    assert catch_up_rate(cands, 1455.0, 1.10, 16, 50.0, 1024, 10.0) == pytest.approx(ring(7))
    assert catch_up_rate(cands, 1455.0, 100.0, 16, 50.0, 1024, 10.0) == pytest.approx(ring(16))
    assert catch_up_rate(cands, 1e9, 1.05, 16, 50.0, 1024, 10.0) is None  # no ring keeps it


def test_outage_time_counts_the_ended_outages_and_the_running_one():
    log = OutageLog()
    log.observe(0.0, held=False, last_failure=0.0)
    log.observe(3_600.0, held=True, last_failure=0.0)  # out for an hour
    assert log.out_s(5_000.0) == pytest.approx(3_600.0)
    log.observe(6_000.0, held=False, last_failure=5_400.0)  # out again since 5,400 s
    assert log.out_s(7_200.0) == pytest.approx(3_600.0 + 1_800.0)


@pytest.mark.parametrize("left, line_left_s, out_s, elapsed_s, rate", [
    (3.6e6, 10_000.0, 0.0, 5_000.0, 360.0),  # spot there all the time: the line's rate
    (3.6e6, 10_000.0, 2_500.0, 5_000.0, 720.0),  # out half the time: twice it on spot
    (3.6e6, 10_000.0, 1_000.0, 4_000.0, 480.0),  # out a quarter: 4/3 of it
    (0.0, 10_000.0, 1_000.0, 4_000.0, 0.0),  # nothing left
    (3.6e6, 0.0, 1_000.0, 4_000.0, 0.0),  # no time left: the floor's, not this
    (3.6e6, 10_000.0, 4_000.0, 4_000.0, 0.0),  # never there: no rate (the floor's case)
])
def test_spot_time_rate_spreads_the_work_over_the_time_spot_is_there(
        left, line_left_s, out_s, elapsed_s, rate):
    from provisioner.plan.pacing import spot_share, spot_time_rate
    share = spot_share(out_s, elapsed_s)
    assert spot_time_rate(left, line_left_s, share) == pytest.approx(rate)


def test_spot_share_is_the_time_there_clipped():
    from provisioner.plan.pacing import spot_share
    assert spot_share(0.0, 0.0) == 1.0  # no time yet: nothing says it was ever out
    assert spot_share(900.0, 3_600.0) == pytest.approx(0.75)
    assert spot_share(5_000.0, 3_600.0) == 0.0  # (more out than elapsed: clipped)


def _spot_time(share, log, now=36_000.0, left=3.6e6, line_left_s=20_000.0):
    """spot_time_target for one $0.918/h 400/s spot offering beside on-demand at $3.06/h
    (2 h safety margin, 1 h churn horizon, 16 instances at most)."""
    from pricing.model import Offering
    from provisioner.plan.model import Candidate
    from provisioner.plan.pacing import spot_time_target
    spot = Candidate(Offering("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "spot"),
                     0.918, 400.0)
    od = Candidate(Offering("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "on-demand"),
                   3.06, 400.0)
    return spot_time_target([spot], [spot, od], log, now, left=left,
                            line_left_s=line_left_s, elapsed_s=now, prior_s=3_600.0,
                            max_size=16, model_mb=50.0, global_batch=1024,
                            gbps=10.0, share=share)


def test_spot_time_target_takes_the_users_share_from_the_start():
    # nothing seen yet (no outage at all): the learned rule does not apply, the user's
    # share does, from the first decision: the line's 180/s over half the time, 360/s
    quiet = OutageLog()
    quiet.observe(0.0, held=True, last_failure=None)
    assert _spot_time(None, quiet) == 0.0
    assert _spot_time(1.0, quiet) == 0.0  # spot there all the time: the wall-time pace
    assert _spot_time(0.5, quiet) == pytest.approx(3.6e6 / (20_000.0 * 0.5))


def test_spot_time_target_keeps_the_lower_of_the_users_share_and_the_one_seen():
    # one 3 h outage (longer than the 2 h margin) in 10 h: share seen 1 - 3 / (10 + 1 h)
    log = OutageLog()
    log.observe(0.0, held=True, last_failure=None)
    log.observe(3_600.0, held=False, last_failure=3_600.0)
    log.observe(14_400.0, held=True, last_failure=3_600.0)
    seen = 1.0 - 10_800.0 / (36_000.0 + 3_600.0)
    line = 3.6e6 / 20_000.0
    assert _spot_time(None, log) == pytest.approx(line / seen)
    assert _spot_time(0.9, log) == pytest.approx(line / seen)  # the data says less: it wins
    assert _spot_time(0.5, log) == pytest.approx(line / 0.5)  # the user's is lower: it wins


def test_rate_within_stops_at_the_ring_whose_samples_cost_the_limit():
    # 400/s instances at $0.918/h, 50 MB gradient, batch 1,024, 10 Gb/s: a ring's cost per
    # useful sample rises with its size (efficiency 0.941 at 3, 0.681 at 16)
    from pricing.model import Offering
    from provisioner.plan.model import Candidate, ring_rate
    from provisioner.plan.pacing import rate_within
    spot = Offering("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "spot")
    cands = [Candidate(spot, 0.918, 400.0)]
    per = lambda n: n * 0.918 / ring_rate(n, 400.0, 50.0, 1024, 10.0)  # noqa: E731
    # the limit at the 8-ring's cost per sample: the 8-ring is the fastest within it
    assert rate_within(cands, per(8) * (1 + 1e-9), 16, 50.0, 1024, 10.0) == pytest.approx(
        ring_rate(8, 400.0, 50.0, 1024, 10.0))
    # on-demand's cost per sample ($3.06/h for 400/s) is above every spot ring: max_size
    assert rate_within(cands, 3.06 / 400.0, 16, 50.0, 1024, 10.0) == pytest.approx(
        ring_rate(16, 400.0, 50.0, 1024, 10.0))
    assert rate_within(cands, per(1) * 0.99, 16, 50.0, 1024, 10.0) == 0.0  # none within


def test_bank_rate_stops_where_the_rings_extra_samples_cost_more_than_the_nets():
    # V100 at $0.918/h, 400/s, 50 MB gradient, batch 1,024, 10 Gb/s; the pace 1,100/s takes 3
    # (1,129/s). Against K80 at $0.27/h for 80/s ($0.94 per 1M samples) the bank may grow
    # the ring while each instance it adds adds samples at no more than that: a ring's
    # efficiency falls with its size, so each adds fewer than the one before.
    from pricing.model import Offering
    from provisioner.plan.model import Candidate, ring_rate
    from provisioner.plan.pacing import bank_rate
    v100 = [Candidate(Offering("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "spot"),
                      0.918, 400.0)]
    r = [ring_rate(n, 400.0, 50.0, 1024, 10.0) for n in range(17)]
    net = 0.27 / 3600 / 80.0
    worth = [n for n in range(4, 17) if 0.918 / 3600 / (r[n] - r[n - 1]) <= net]
    assert worth == list(range(4, max(worth) + 1)) and max(worth) < 16
    assert bank_rate(v100, 1100.0, net, 16, 50.0, 1024, 10.0) == pytest.approx(r[max(worth)])
    # (all the instances beyond the 3 together add samples for less than K80's up to a
    # larger ring, the first version's rule: its last instances cost more than K80's)
    together = [n for n in range(4, 17) if (n - 3) * 0.918 / 3600 / (r[n] - r[3]) <= net]
    assert max(together) > max(worth)
    # against on-demand's $3.06/h for 400/s every ring is worth it; against nothing, none
    # beyond the ring that keeps the pace; no ring keeps 10,000/s: no cap to give
    assert bank_rate(v100, 1100.0, 3.06 / 3600 / 400.0, 16, 50.0, 1024, 10.0) == pytest.approx(r[16])
    assert bank_rate(v100, 1100.0, 0.0, 16, 50.0, 1024, 10.0) == pytest.approx(r[3])
    assert bank_rate(v100, 10_000.0, net, 16, 50.0, 1024, 10.0) is None


def test_a_known_capacity_of_the_cheapest_is_there_and_none_is_out():
    # The daemon knows some availability (MarketView.caps, from its sources). V100 in zone a
    # ($1/h, 100/s) with 8 known to be there is there: a user's deadline (10 h, 3.6e6
    # samples) at 0.5 h keeps its wall-time pace on it, 3.6e6 / 27,000 s = 133/s, two; it
    # does not wait on the dearer K80 ($1.5/h, 100/s) as if the V100 were out. Known to be
    # 0, it is out: nothing is bought while four K80 could still finish 5 h before the line.
    from pricing.model import Offering
    from provisioner.plan.model import Problem
    from provisioner.plan.pipeline import FleetView, MarketView, Planner, PlanSettings, Progress
    v100 = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
    k80 = Offering("aws", "us-east-1", "us-east-1a", "p2.xlarge", "spot")
    s = PlanSettings(bounds=Problem((), max_size=4, max_zone_share=1.0, max_regions=1,
                                    boot_s=0.0, reform_s=0.0, model_mb=0.0), bank_hours=0.0)
    pr = Progress(start=0.0, work=3.6e6, done=0.0, deadline_s=36_000.0, hard=True)

    def decide(cap: int) -> dict:
        market = MarketView(prices={v100: 1.0, k80: 1.5},
                            speeds={"p3.2xlarge": 100.0, "p2.xlarge": 100.0},
                            hazards={v100: 0.0, k80: 0.0}, caps={v100: cap})
        return dict(Planner(s).decide(market, FleetView(held={}), pr, 1_800.0).target)

    assert decide(8) == {v100: 2}
    assert decide(0) == {}


def _bank_beside_a_young_k80(v100_cap: int) -> tuple[dict, object, object]:
    # V100 ($0.918/h, 400/s) with ``v100_cap`` known to be there, beside K80 ($0.27/h,
    # 80/s: 1.47x the V100's cost per sample), 50 MB gradient. A user's deadline (10 h) for
    # 4e7 samples, on its line at 1 h, banks 5 h of its pace; one K80 was launched at 0.5 h
    # (beside a V100 ring whose launch then failed). The decision at 1 h: (target, V100, K80).
    from pricing.model import Offering
    from provisioner.plan.model import Problem
    from provisioner.plan.pipeline import FleetView, MarketView, Planner, PlanSettings, Progress
    v100 = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
    k80 = Offering("aws", "us-east-1", "us-east-1a", "p2.xlarge", "spot")
    s = PlanSettings(bounds=Problem((), max_size=16, max_zone_share=1.0, max_regions=1,
                                    boot_s=0.0, reform_s=0.0, model_mb=50.0,
                                    global_batch=1024), bank_hours=5.0)
    market = MarketView(prices={v100: 0.918, k80: 0.27},
                        speeds={"p3.2xlarge": 400.0, "p2.xlarge": 80.0},
                        hazards={v100: 0.0, k80: 0.0}, caps={v100: v100_cap})
    planner = Planner(s)
    planner.decide(market, FleetView(held={}),
                   Progress(start=0.0, work=4e7, done=2.5e6, deadline_s=36_000.0, hard=True),
                   1_800.0)
    d = planner.decide(market, FleetView(held={k80: 1}),
                       Progress(start=0.0, work=4e7, done=5e6, deadline_s=36_000.0, hard=True),
                       3_600.0)
    return dict(d.target), v100, k80


def test_a_bank_grows_only_the_cheapest_not_the_dearer_spot_it_holds():
    # 3 V100 there: the bank asks for more than they give. The K80 held stays (the solver
    # keeps it toward the target) but is not grown: the bank buys only the cheapest. On the
    # four types of aws-10-26-2022 a kept K80 grew to 9 at the V100's retries, and the net
    # was waited on beside them.
    target, v100, k80 = _bank_beside_a_young_k80(3)
    assert target == {v100: 3, k80: 1}


def test_a_bank_with_room_lets_the_dearer_spot_launched_lately_go():
    # 8 V100 there: the ring the bank is worth (each V100 added adds samples for less than
    # the K80's) has room, and the K80 launched at 0.5 h is no longer kept for being young:
    # ahead or banking, only the good hardware is pinned; the rest is the solver's to keep
    # or drop at its price. On the four types of aws-10-26-2022 pinned K80 ran beside the
    # V100's bank whenever the V100 came back ($20.6 of K80 from +24 h, $9.5 now).
    from provisioner.plan.model import Candidate, ring_rate
    from provisioner.plan.pacing import bank_rate
    target, v100, k80 = _bank_beside_a_young_k80(8)
    most = bank_rate([Candidate(v100, 0.918, 400.0)], 4e7 / 28_800, 0.27 / 3600 / 80.0, 16,
                     50.0, 1024, 10.0)
    n = next(n for n in range(1, 17) if ring_rate(n, 400.0, 50.0, 1024, 10.0) >= most - 1e-6)
    assert n < 8 and target == {v100: n}


def test_the_on_demand_ring_counted_on_keeps_the_cost_per_sample_of_on_demand_alone():
    # on-demand at $3.06/h for 400/s, 50 MB, batch 1,024, 10 Gb/s. 1.44e8 samples in 40 h
    # take a 3-ring (1,129/s; 2 would do 783/s): on-demand alone's cost per sample is the
    # 3-ring's. With nothing spent yet the rest may cost no more: the 3-ring is counted on.
    # Spot that did half the work for $20 leaves (3-ring's cost - $20) for the other half:
    # a bigger ring within it. Spent past on-demand alone's whole cost: no ring keeps it,
    # the fastest (the deadline first).
    from pricing.model import Offering
    from provisioner.plan.model import Candidate, ring_rate
    from provisioner.plan.pacing import od_alone_per_sample, od_rate_kept
    od = Offering("aws", "us-west-2", "*", "p3.2xlarge", "on-demand")
    spot = Offering("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "spot")
    cands = [Candidate(od, 3.06, 400.0), Candidate(spot, 0.918, 400.0)]
    rate = lambda n: ring_rate(n, 400.0, 50.0, 1024, 10.0)  # noqa: E731
    work, secs = 1.44e8, 40 * 3600.0
    assert rate(2) * secs < work <= rate(3) * secs
    ref = od_alone_per_sample(cands, work, secs, 16, 50.0, 1024, 10.0)
    assert ref == pytest.approx(3 * 3.06 / 3600 / rate(3))
    assert od_alone_per_sample(cands, work, 60.0, 16, 50.0, 1024, 10.0) is None  # none can
    kw = dict(work=work, seconds=secs, max_size=16, model_mb=50.0, global_batch=1024, gbps=10.0)
    fastest = rate(16)
    assert od_rate_kept(cands, fastest, left=work, spent=0.0, **kw) == pytest.approx(rate(3))
    half = od_rate_kept(cands, fastest, left=work / 2, spent=20.0, **kw)
    allowed = (ref * work - 20.0) / (work / 2)
    n = max(k for k in range(1, 17) if k * 3.06 / 3600 / rate(k) <= allowed)
    assert n > 3 and half == pytest.approx(rate(n))
    assert od_rate_kept(cands, fastest, left=work / 2, spent=1e4, **kw) == fastest
    assert od_rate_kept(cands, fastest, left=0.0, spent=0.0, **kw) == fastest
