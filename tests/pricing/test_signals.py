"""What the clouds say feeds the risk estimate: GCP capacityHistory preemption rates (the
real GCP client against the HTTP fake), AWS spot placement scores (botocore Stubber: moto
does not implement the call), rebalance recommendations; observations outrank them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pricing.model import Offering, RiskEstimate, Signals
from pricing.risk import GCP_RUN_HOURS, estimate, with_signals

NOW = datetime(2026, 1, 2, tzinfo=timezone.utc)
A = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
B = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge")
G = Offering("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")


def test_signals_refine_priors_and_never_replace_observations():
    risks = estimate([A, B, G, A.with_market("on-demand")], [])
    assert risks[A].basis == "default" and risks[G].basis == "default"
    sig = Signals(placement={("us-east-1", "us-east-1a", "p3.2xlarge"): 9.0,
                             ("us-east-1", "us-east-1b", "p3.2xlarge"): 3.0},
                  preemption_rate={("us-central1", "us-central1-a", "a2-highgpu-1g"): 0.5})
    out = with_signals(risks, sig, now=NOW, horizon_h=1.0)
    h = risks[A].hazard_per_hour
    # placement: the prior shared out by score, the mean kept (mean score 6)
    assert out[A].hazard_per_hour == pytest.approx(h * 6 / 9)
    assert out[B].hazard_per_hour == pytest.approx(h * 6 / 3)
    assert out[A].basis == "default+placement-score"
    # capacity history: f / ((1 - f) D): half of the stopped VMs preempted over 24 h runs
    assert out[G].hazard_per_hour == pytest.approx(0.5 / (0.5 * GCP_RUN_HOURS))
    assert out[G].basis == "capacity-history"
    assert out[A.with_market("on-demand")].hazard_per_hour == 0.0
    # a zone with its own revocations keeps its estimate
    own = {A: RiskEstimate(A, 0.3, "mle", 10, 3)}
    assert with_signals(own, sig, now=NOW, horizon_h=1.0)[A].hazard_per_hour == 0.3


def test_a_rebalance_recommendation_expects_a_revocation_within_the_horizon():
    risks = {A: RiskEstimate(A, 0.05, "mle", 10, 1)}
    fresh = with_signals(risks, Signals(rebalance={A: NOW - timedelta(minutes=10)}), now=NOW,
                         horizon_h=1.0)
    assert fresh[A].hazard_per_hour == 1.0 and fresh[A].basis == "mle+rebalance"
    old = with_signals(risks, Signals(rebalance={A: NOW - timedelta(hours=2)}), now=NOW,
                       horizon_h=1.0)
    assert old[A].hazard_per_hour == 0.05


def test_gcp_capacity_history_through_the_real_client():
    pytest.importorskip("google.cloud.compute_v1")
    from tests.pricing.sources.test_gcp import fake, source

    f = fake()
    f.capacity_history = {("us-central1", "a2-highgpu-1g"): [
        ("https://www.googleapis.com/compute/v1/projects/proj/zones/us-central1-a", 0.2,
         "2026-01-01T00:00:00Z"),
        ("https://www.googleapis.com/compute/v1/projects/proj/zones/us-central1-a", 0.4,
         "2026-01-02T00:00:00Z")]}
    with f:
        src = source(f)
        src.want_signals = True
        snap = src.fetch()
        posted = [b for b in f.bodies if b]
    # the newest record of the zone; the request asks for SPOT preemption history
    assert snap.signals.preemption_rate[("us-central1", "us-central1-a", "a2-highgpu-1g")] == 0.4
    assert posted[0]["instanceProperties"]["scheduling"]["provisioningModel"] == "SPOT"
    assert posted[0]["types"] == ["PREEMPTION"]
    # a type the API has no history for is a note, not an error (the fake answers 404)
    assert any("capacity history not read" in n for n in snap.notes)
    risks = with_signals(estimate([q.offering for q in snap.quotes], []), snap.signals,
                         now=NOW, horizon_h=1.0)
    a2 = next(o for o in risks if o.instance_type == "a2-highgpu-1g" and o.zone == "us-central1-a")
    assert risks[a2].basis == "capacity-history"


def test_aws_placement_scores_by_zone_name_with_a_stubbed_client():
    boto3 = pytest.importorskip("boto3")
    from botocore.stub import Stubber

    from pricing.sources.aws import AwsSource

    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x",
                       aws_secret_access_key="x")
    stub = Stubber(ec2)
    stub.add_response("describe_subnets", {"Subnets": [
        {"SubnetId": "subnet-1", "AvailabilityZone": "us-east-1a", "AvailabilityZoneId": "use1-az4"},
        {"SubnetId": "subnet-2", "AvailabilityZone": "us-east-1b", "AvailabilityZoneId": "use1-az6"}]})
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az4", "Score": 8},
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az6", "Score": 2}]})
    stub.add_client_error("get_spot_placement_scores", service_error_code="UnauthorizedOperation")
    with stub:
        sig, notes = AwsSource(["us-east-1"], client=lambda s, r: ec2).signals(
            ["p3.2xlarge", "g5.xlarge"], ["us-east-1"])
    assert sig.placement == {("us-east-1", "us-east-1a", "p3.2xlarge"): 8.0,
                             ("us-east-1", "us-east-1b", "p3.2xlarge"): 2.0}
    assert len(notes) == 1 and "UnauthorizedOperation" in notes[0]  # refused: a note


def test_the_daemons_market_view_takes_rebalance_recommendations_into_the_hazard():
    from pricing.model import PriceQuote, Snapshot
    from pricing.sources.trace import TraceSource
    from provisioner.daemon.loop.market import Market
    from provisioner.plan.throughput import ThroughputModel

    class Anywhere:  # a driver that can place every offering
        def can_place(self, offering):
            return True

    snap = Snapshot(quotes=(PriceQuote(A, NOW - timedelta(hours=1), 0.9, 3.06),
                            PriceQuote(B, NOW - timedelta(hours=1), 0.9, 3.06)))
    m = Market(TraceSource([], snapshot=snap), Anywhere(), timedelta(days=1), horizon_h=0.5)
    m.poll(NOW)
    plain = m.view(ThroughputModel(unit=400.0), NOW, {})
    told = m.view(ThroughputModel(unit=400.0), NOW, {}, {A: NOW - timedelta(minutes=5)})
    assert told.hazards[A] == 2.0  # a revocation expected within the 0.5 h horizon
    assert told.hazards[B] == plain.hazards[B] == plain.hazards[A] < 2.0
