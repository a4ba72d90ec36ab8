"""Risk: exponential MLE with censoring, checked by hand against the real lifetimes file."""

from __future__ import annotations

import csv
import gzip
import math
from datetime import datetime, timedelta, timezone

import pytest
from scipy.stats import chi2

from pricing.model import Availability, Lifetime, Offering
from pricing.risk import (DEFAULT_HAZARD_PER_HOUR, advisor_hazard, estimate, hazard_from_lifetimes,
                          observations_from_availability)
from pricing.sources.advisor import load_spot_advisor
from pricing.sources.trace import load_trace

UTC = timezone.utc
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def lt(off, hours, revoked):
    return Lifetime(off, T0, hours * 3600, revoked)


def test_mle_counts_censored_as_exposure_only():
    off = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
    h, n, d, low, high = hazard_from_lifetimes([lt(off, 2, True), lt(off, 3, True), lt(off, 5, False)])
    assert (n, d) == (3, 2)
    assert h == pytest.approx(2 / 10)
    assert low == pytest.approx(chi2.ppf(0.025, 4) / 20) and high == pytest.approx(chi2.ppf(0.975, 6) / 20)
    assert low < h < high
    with pytest.raises(ValueError, match="no exposure"):
        hazard_from_lifetimes([])


def test_real_lifetimes_match_hand_computation(shared_data):
    """Recompute from the raw csv rows with the csv module: events = lifetimes under the
    24 h preemptible cap; exposure = all lifetime hours."""
    path = shared_data / "preemption_lifetimes" / "gcp_preemptible_gpu_lifetimes_2019.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    snap = load_trace(path)
    for gpu in ("K80", "P100", "V100"):
        mine = [r for r in rows if r["gpu_type"] == gpu]
        events = sum(float(r["lifetime_hours"]) < 24.0 for r in mine)
        hours = sum(float(r["lifetime_hours"]) for r in mine)
        got = hazard_from_lifetimes(x for x in snap.lifetimes if x.offering.instance_type == f"n1+{gpu.lower()}")
        assert got[:3] == (pytest.approx(events / hours), len(mine), events)
    # per-zone MLE through estimate(): us-central1-c K80
    zone_rows = [r for r in rows if r["gpu_type"] == "K80" and r["zone"] == "us-central1-c"]
    ev = sum(float(r["lifetime_hours"]) < 24.0 for r in zone_rows)
    hrs = sum(float(r["lifetime_hours"]) for r in zone_rows)
    off = Offering("gcp", "us-central1", "us-central1-c", "n1+k80")
    est = estimate([off], snap.lifetimes)[off]
    assert est.basis == "mle" and est.events == ev and est.samples == len(zone_rows)
    assert est.hazard_per_hour == pytest.approx(ev / hrs)
    # the documented GCP default is the pooled MLE over the whole file
    all_ev = sum(float(r["lifetime_hours"]) < 24.0 for r in rows)
    all_h = sum(float(r["lifetime_hours"]) for r in rows)
    assert DEFAULT_HAZARD_PER_HOUR["gcp"] == pytest.approx(all_ev / all_h, abs=5e-5)


def test_aws_default_is_the_cant_be_late_preemption_mle(shared_data):
    root = shared_data / "spot_availability_traces" / "cant_be_late" / "preemption"
    snap = load_trace([root / "1-node", root / "4-node"])
    h, *_ = hazard_from_lifetimes(x for x in snap.lifetimes if x.offering.instance_type == "p3.2xlarge")
    assert DEFAULT_HAZARD_PER_HOUR["aws"] == pytest.approx(h, abs=5e-4)


def test_estimate_falls_back_in_order():
    a = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
    b = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge")       # pooled by type
    c = Offering("aws", "us-west-2", "us-west-2a", "p3.16xlarge")      # pooled by GPU (V100)
    d = Offering("aws", "us-east-1", "us-east-1a", "g5.xlarge")        # advisor
    e = Offering("aws", "eu-west-1", "eu-west-1a", "g6.xlarge")        # default
    f = Offering("gcp", "us-central1", "*", "n1+k80")                 # region-level: own zones
    od = a.with_market("on-demand")
    obs = [lt(a, 1, True), lt(a, 3, False), lt(Offering("gcp", "us-central1", "us-central1-c", "n1+k80"), 2, True)]
    out = estimate([a, b, c, d, e, f, od], obs, advisor={("us-east-1", "g5.xlarge"): advisor_hazard(2)})
    assert out[a].basis == "mle" and out[a].hazard_per_hour == pytest.approx(0.25)
    assert out[b].basis == "pooled" and out[b].hazard_per_hour == pytest.approx(0.25)
    assert out[c].basis == "pooled"
    assert out[d].basis == "spot-advisor" and out[d].hazard_per_hour == pytest.approx(-math.log(0.875) / 720)
    assert out[e].basis == "default" and out[e].hazard_per_hour == DEFAULT_HAZARD_PER_HOUR["aws"]
    assert out[f].basis == "mle" and out[f].hazard_per_hour == pytest.approx(0.5)
    assert out[od].hazard_per_hour == 0.0


def test_availability_gives_transitions_over_hours_available():
    off = Offering("aws", "us-west-2", "us-west-2a", "p3.2xlarge")
    seq = [(0, 1), (2, 0), (3, 1), (4, 0), (10, 0)]  # hours, value: 2 falls in 3 hours up
    recs = [Availability(off, T0 + timedelta(hours=h), v) for h, v in seq]
    obs = observations_from_availability(recs)[off]
    assert obs.events == 2 and obs.hours == pytest.approx(3.0)
    est = estimate([off], [], availability=recs)[off]
    assert est.basis == "mle" and est.hazard_per_hour == pytest.approx(2 / 3)


def test_spot_advisor_real_file(shared_data):
    adv = load_spot_advisor(shared_data / "aws_spot_advisor" / "spot_advisor_2025-06-28.csv.gz")
    with gzip.open(shared_data / "aws_spot_advisor" / "spot_advisor_2025-06-28.csv.gz", "rt") as f:
        row = next(r for r in csv.DictReader(f)
                   if r["region"] == "us-east-1" and r["instance_type"] == "p3.2xlarge" and r["os"] == "Linux")
    assert adv[("us-east-1", "p3.2xlarge")] == pytest.approx(advisor_hazard(int(row["interruption_bucket"])))
    assert advisor_hazard(0) < advisor_hazard(1) < advisor_hazard(4)


def test_co_revocation_defaults_are_the_shared_traces_shares(shared_data):
    # one event (revocations of a pool within 3 minutes) takes revoked / alive just before
    from collections import defaultdict
    from pricing.risk import DEFAULT_CO_FRACTION, _co_events

    def share(snap):
        pools = defaultdict(list)
        for lt in snap.lifetimes:
            pools[lt.offering].append(lt)
        k = n = 0
        for lts in pools.values():
            a, b = _co_events(lts)
            k, n = k + a, n + b
        return k / n

    four = shared_data / "spot_availability_traces/cant_be_late/preemption/4-node"
    assert DEFAULT_CO_FRACTION["aws"] == pytest.approx(share(load_trace(four)), abs=0.005)
    gcp = shared_data / "preemption_lifetimes/gcp_preemptible_gpu_lifetimes_2019.csv"
    assert DEFAULT_CO_FRACTION["gcp"] == pytest.approx(share(load_trace(gcp)), abs=0.005)


def test_co_fractions_group_revocations_within_three_minutes():
    from datetime import datetime, timedelta, timezone
    from pricing.model import Lifetime, Offering
    from pricing.risk import co_fractions

    a = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    # 4 alive; at 1 h two go 100 s apart (one event: 2 of 4), at 2 h one of the 2 left
    lts = [Lifetime(a, t0, 3600.0, True), Lifetime(a, t0, 3700.0, True),
           Lifetime(a, t0, 7200.0, True), Lifetime(a, t0, 9000.0, False)]
    other = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge")
    unseen = Offering("gcp", "us-central1", "us-central1-a", "g2-standard-4")
    co = co_fractions([a, other, unseen, a.with_market("on-demand")], lts)
    assert co[a] == pytest.approx(3 / 6)  # (2 + 1) revoked of (4 + 2) alive
    assert co[other] == co[a]  # the same type in another zone: pooled
    assert co[unseen] == 0.17 and co[a.with_market("on-demand")] == 0.0


def test_half_ring_loss_one_pool_against_spread_pools():
    from pricing.risk import half_ring_loss

    # 4 instances in one zone, hazard 2/h, an event takes the whole pool: one window in
    # 3 minutes of 2 events an hour: 1 - exp(-0.1)
    one = half_ring_loss({"a": (4, 2.0, 1.0)})
    assert one == pytest.approx(1 - math.exp(-0.1))
    # one in each of 4 zones: two zones' events in the same window
    spread = half_ring_loss({z: (1, 2.0, 1.0) for z in "abcd"})
    assert spread == pytest.approx(6 * (1 - math.exp(-0.1)) ** 2, rel=1e-9)
    assert spread < 0.6 * one  # two zones at once: rarer than one
    assert half_ring_loss({"od": (4, 0.0, 0.0)}) == 0.0


# --- the hazard by age -------------------------------------------------------------------

def test_age_shape_is_flat_without_revocations_and_falls_where_the_young_go_first():
    from pricing.risk import AGE_BANDS_H, AgeShape, age_shape
    off = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
    assert age_shape([]) == AgeShape()
    assert age_shape([lt(off, 5, False)]) == AgeShape()  # exposure, no revocation
    assert age_shape([lt(off.with_market("on-demand"), 0.1, True)]) == AgeShape()
    # 40 revoked within 10 minutes, 10 that ran 20 h: the first band's rate is far above the
    # average, the open band's below it (one pseudo-event at the average keeps it above 0)
    lives = [lt(off, 1 / 6, True) for _ in range(40)] + [lt(off, 20, False) for _ in range(10)]
    shape = age_shape(lives)
    assert len(shape.relative) == len(AGE_BANDS_H) + 1
    assert shape.relative[0] > 10 and 0 < shape.relative[-1] < 0.1
    # its mean over a window weighs each band by the time spent in it
    s = AgeShape((4.0, 2.0, 1.0, 1.0, 1.0, 1.0, 0.5))
    assert s.mean(0.0, 0.5) == pytest.approx(3.0)
    assert s.mean(10.0, 2.0) == pytest.approx(0.5) and s.mean(7.0, 2.0) == pytest.approx(0.75)
    assert s.mean(0.1, 0.0) == s.at(0.1) == 4.0


def test_capacity_that_has_lasted_is_revoked_less_on_the_shared_traces(shared_data):
    # What AgeShape's docstring states of the Can't-Be-Late availability traces: revoked
    # more than the average in the first hour and far less after 4 h, in every folder.
    from pricing.risk import age_shape
    root = shared_data / "spot_availability_traces" / "cant_be_late" / "availability"
    for folder in ("16-node/aws-08-27-2023", "1-node/aws-02-15-2023", "1-node/aws-10-26-2022"):
        snap = load_trace([root / folder])
        shape = age_shape(x for x in snap.lifetimes if x.offering.instance_type == "p3.2xlarge")
        assert shape.mean(0.0, 1.0) > 1.5, folder
        assert shape.mean(4.0, 4.0) < 0.8 and shape.relative[-1] < 0.4, folder
