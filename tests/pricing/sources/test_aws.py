"""AWS price source against moto (mock_aws) and botocore's Stubber for what moto lacks."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import boto3
import moto
import pytest
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber

from pricing.errors import CredentialsError
from pricing.sources.aws import FALLBACK_ON_DEMAND, AwsSource, parse_price_list_item
from pricing.sources.base import PriceSource
from pricing.sources.boto import make_client
from provisioner.cli import main

UTC = timezone.utc
NOW = datetime(2024, 6, 1, 12, tzinfo=UTC)


@pytest.fixture()
def aws(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with moto.mock_aws():
        yield


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_):
        yield self._body

    def read(self, *_):
        return self._body


def test_fetch_against_moto_fans_out_and_joins(aws):
    src = AwsSource(["us-east-1", "us-west-2"], clock=lambda: datetime.now(UTC))
    assert isinstance(src, PriceSource)
    snap = src.fetch(gpus=["nvidia t4"], now=datetime.now(UTC))
    regions = {q.offering.region for q in snap.quotes}
    assert regions == {"us-east-1", "us-west-2"}
    assert {q.offering.instance_type for q in snap.quotes} <= {t for t, s in snap.gpus.items() if s.model == "T4"}
    assert snap.gpus["g4dn.12xlarge"].count == 4 and snap.gpus["g4dn.12xlarge"].memory_gib == 16
    # one quote per offering, zones as the account's AZ names
    assert len({q.offering for q in snap.quotes}) == len(snap.quotes)
    assert all(q.offering.zone.startswith(q.offering.region) for q in snap.quotes)
    # moto has no Price List: the dated us-east-1 fallback is used and said
    east = next(q for q in snap.quotes if q.offering.region == "us-east-1" and q.offering.instance_type == "g4dn.xlarge")
    assert east.on_demand_per_hour == FALLBACK_ON_DEMAND["g4dn.xlarge"]
    assert any("fallback" in n or "built-in" in n for n in snap.notes)
    assert all(q.on_demand_per_hour is None for q in snap.quotes if q.offering.region == "us-west-2")


def test_throttling_is_retried_not_fatal(aws):
    ec2 = make_client("ec2", "us-east-1")
    sends = []

    def handler(request, **_):
        sends.append(1)
        if len(sends) == 1:
            body = (b"<Response><Errors><Error><Code>Throttling</Code><Message>Rate exceeded</Message>"
                    b"</Error></Errors><RequestID>r</RequestID></Response>")
            request.url = "https://injected.invalid/"
            return AWSResponse(request.url, 400, {}, _Raw(body))
        return None

    ec2.meta.events.register_first("before-send.ec2.DescribeSpotPriceHistory", handler)
    src = AwsSource(["us-east-1"], client=lambda s, r: ec2 if s == "ec2" else make_client(s, r))
    quotes = src.spot_history("us-east-1", ["g4dn.xlarge"], datetime.now(UTC) - timedelta(hours=1))
    assert len(sends) == 2 and quotes


def _stubbed(service, region="us-east-1"):
    client = boto3.client(service, region_name=region, aws_access_key_id="x", aws_secret_access_key="y")
    return client, Stubber(client)


def test_spot_history_reads_every_page():
    ec2, stub = _stubbed("ec2")
    t = NOW - timedelta(hours=1)
    ev = lambda az, p, m: {"AvailabilityZone": az, "InstanceType": "p3.2xlarge",  # noqa: E731
                           "ProductDescription": "Linux/UNIX", "SpotPrice": p, "Timestamp": t + timedelta(minutes=m)}
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [ev("us-east-1a", "0.95", 2)], "NextToken": "p2"})
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [ev("us-east-1b", "0.91", 1)], "NextToken": "p3"},
                      {"InstanceTypes": ["p3.2xlarge"], "StartTime": t,
                       "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"], "NextToken": "p2"})
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [ev("us-east-1a", "0.97", 3)]})
    with stub:
        quotes = AwsSource(["us-east-1"], client=lambda s, r: ec2).spot_history("us-east-1", ["p3.2xlarge"], t)
    assert [(q.offering.zone, q.price_per_hour) for q in quotes] == [
        ("us-east-1b", 0.91), ("us-east-1a", 0.95), ("us-east-1a", 0.97)]
    stub.assert_no_pending_responses()


def test_placement_scores_with_stubber():
    ec2, stub = _stubbed("ec2")
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az4", "Score": 9},
        {"Region": "us-west-2", "AvailabilityZoneId": "usw2-az1", "Score": 3}]},
        {"InstanceTypes": ["p3.2xlarge"], "TargetCapacity": 2, "SingleAvailabilityZone": True,
         "RegionNames": ["us-east-1", "us-west-2"]})
    with stub:
        scores = AwsSource(["us-east-1", "us-west-2"], client=lambda s, r: ec2).placement_scores(["p3.2xlarge"], target_capacity=2)
    assert scores == {("us-east-1", "use1-az4"): 9, ("us-west-2", "usw2-az1"): 3}


def _product(itype, region, usd):
    return json.dumps({"product": {"attributes": {"instanceType": itype, "regionCode": region}},
                       "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": {"unit": "Hrs",
                                                                              "pricePerUnit": {"USD": usd}}}}}}})


def test_on_demand_from_price_list_pages():
    pricing, stub = _stubbed("pricing")
    stub.add_response("get_products", {"PriceList": [_product("p3.2xlarge", "eu-west-1", "3.3740000000")],
                                       "NextToken": "n"})
    stub.add_response("get_products", {"PriceList": [_product("g5.xlarge", "eu-west-1", "1.1230000000"),
                                                     _product("g5.xlarge", "eu-west-1", "0.0000000000")]})
    with stub:
        prices, notes = AwsSource(["eu-west-1"], client=lambda s, r: pricing).on_demand_prices(["eu-west-1"])
    assert prices == {("eu-west-1", "p3.2xlarge"): 3.374, ("eu-west-1", "g5.xlarge"): 1.123} and notes == []
    assert parse_price_list_item({"product": {"attributes": {}}, "terms": {}}) is None


def test_no_credentials_is_a_credentials_error(monkeypatch, tmp_path, capsys):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(CredentialsError, match="--source trace"):
        AwsSource(["us-east-1"]).fetch()
    assert main(["prices", "--source", "aws", "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert "AWS_PROFILE" in err and "--source trace" in err and "Traceback" not in err and err.count("\n") == 1


def test_cli_against_threaded_moto_server_refuses_moto_prices(monkeypatch, capsys):
    """The whole `provision prices --source aws` path over HTTP: moto's canned spot price
    ($0.00001/h) is far below any GPU's floor, so every quote is refused and reported."""
    from moto.server import ThreadedMotoServer

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        code = main(["prices", "--source", "aws", "--region", "us-east-1", "--gpu", "T4", "--json",
                     "--endpoint-url", f"http://{host}:{port}"])
    finally:
        server.stop()
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out[out.index("["):]) == []  # moto prints a banner first
    assert "below-gpu-floor" in err and "refused" in err
