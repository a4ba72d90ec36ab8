"""One contract, run against every PriceSource: trace (user CSV), AWS (moto), GCP (HTTP fake)."""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone

import moto
import pytest
from google.auth.credentials import AnonymousCredentials

from pricing.catalog import gpu_for
from pricing.model import Snapshot
from pricing.sources.aws import AwsSource
from pricing.sources.base import PriceSource
from pricing.sources.gcp import GcpSource
from pricing.sources.trace import TraceSource
from pricing.sources.trace_formats import USER_COLUMNS
from tests.pricing.sources.test_gcp import fake as gcp_fake


@contextlib.contextmanager
def trace_source(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(",".join(USER_COLUMNS) + "\n"
                 "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,g4dn.xlarge,spot,0.16,0.526,1\n"
                 "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.95,3.06,1\n"
                 "2024-01-01T00:00:00Z,aws,us-west-2,us-west-2a,g4dn.xlarge,spot,0.17,0.526,1\n")
    yield TraceSource(p), ("us-east-1", "T4"), datetime(2024, 1, 2, tzinfo=timezone.utc)


@contextlib.contextmanager
def aws_source(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto.mock_aws():
        yield AwsSource(["us-east-1", "us-west-2"]), ("us-west-2", "T4"), datetime.now(timezone.utc)


@contextlib.contextmanager
def gcp_source(tmp_path, monkeypatch):
    with gcp_fake() as f:
        yield (GcpSource("proj", endpoint_url=f.endpoint, credentials=AnonymousCredentials()),
               ("us-central1", "L4"), datetime.now(timezone.utc))


@pytest.mark.parametrize("make", [trace_source, aws_source, gcp_source], ids=["trace", "aws", "gcp"])
def test_price_source_contract(make, tmp_path, monkeypatch):
    args = (tmp_path,) if make is trace_source else (tmp_path, monkeypatch)
    with make(*args) as (src, (region, gpu), now):
        assert isinstance(src, PriceSource) and src.name in ("trace", "aws", "gcp")
        everything = src.fetch(now=now)
        assert isinstance(everything, Snapshot) and everything.quotes
        narrowed = src.fetch(regions=[region], gpus=[gpu], now=now)
        assert narrowed.quotes and len(narrowed.quotes) < len(everything.quotes)
        for q in narrowed.quotes:
            spec = narrowed.gpus.get(q.offering.instance_type) or gpu_for(q.offering.instance_type)
            assert q.offering.region == region and spec is not None and spec.model == gpu
            assert q.time <= now and q.price_per_hour > 0
        # one quote per offering: the view at `now`, not a history
        assert len({q.offering for q in everything.quotes}) == len(everything.quotes)
