"""Sanity: each rejection reason, and the real GCP history's bad rows caught and counted."""

from __future__ import annotations

import csv
import gzip
import logging
import math
from datetime import datetime, timedelta, timezone

import pytest

from pricing.model import Offering, PriceQuote
from pricing.sanity import check, reason_for, summarize

UTC = timezone.utc
T = datetime(2024, 6, 1, tzinfo=UTC)
SPOT = Offering("gcp", "us-central1", "*", "a2-highgpu-1g", "spot")
OD = SPOT.with_market("on-demand")


@pytest.mark.parametrize("quote,reason", [
    (PriceQuote(SPOT, T, 1.1, 3.67), None),
    (PriceQuote(SPOT, T, math.nan, 3.67), "not-finite"),
    (PriceQuote(SPOT, T, 1.1, math.inf), "not-finite"),
    (PriceQuote(SPOT, T, 0.0, 3.67), "non-positive"),
    (PriceQuote(SPOT, T, -1.0, None), "non-positive"),
    (PriceQuote(SPOT, T, 700.0, None), "placeholder"),
    (PriceQuote(OD, T, 700.0, 700.0), "placeholder"),
    (PriceQuote(SPOT, T, 4.0, 3.67), "spot-above-on-demand"),
    (PriceQuote(OD, T, 0.814064, 0.814064), "below-gpu-floor"),
    (PriceQuote(SPOT, T, 0.244, 0.814064), "below-gpu-floor"),
    (PriceQuote(SPOT, T, 0.01, None), "below-gpu-floor"),
    (PriceQuote(Offering("aws", "us-east-1", "use1-az1", "c5.large"), T, 0.03, None), None),
])
def test_reasons(quote, reason):
    assert reason_for(quote) == reason


def test_stale_and_future():
    q = PriceQuote(SPOT, T, 1.1, 3.67)
    assert reason_for(q, now=T + timedelta(hours=2), max_age=timedelta(hours=1)) == "stale"
    assert reason_for(q, now=T + timedelta(minutes=30), max_age=timedelta(hours=1)) is None
    assert reason_for(q, now=T - timedelta(hours=1)) == "in-future"


def test_check_counts_and_logs(caplog):
    quotes = [PriceQuote(SPOT, T, 1.1, 3.67, "f.csv:2"), PriceQuote(SPOT, T, 700.0, 3.67, "f.csv:3"),
              PriceQuote(SPOT, T, math.nan, 3.67, "f.csv:4")]
    with caplog.at_level(logging.INFO, logger="pricing.sanity"):
        ok, rej = check(quotes)
    assert ok == quotes[:1]
    assert [(r.reason, r.location) for r in rej] == [("placeholder", "f.csv:3"), ("not-finite", "f.csv:4")]
    assert summarize(rej) == {"placeholder": 1, "not-finite": 1}
    assert "rejected 2 of 3 quotes" in caplog.text


def test_real_gcp_history_bad_rows_are_caught(gcp_weekly, gcp_weekly_path):
    """Rows whose on-demand price per GPU is below the floor in the raw csv (counted here
    with the csv module) are exactly the ones rejected."""
    floors = {"a100": 1.5, "a100-80gb": 2.0, "h100-80gb": 5.0, "h100-80gb-mega": 5.0, "l4": 0.35, "rtx6000": 2.0}
    bad_lines = set()
    with gzip.open(gcp_weekly_path, "rt", newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            n = int(r["gpu_count"])
            if n and float(r["ondemand_usd_per_hour"]) / n < floors[r["gpu_type"]] * (
                    2.0 / 1.5 if r["machine_type"].startswith("a2-ultragpu") and r["gpu_type"] == "a100" else 1.0):
                bad_lines.add(line)
    ok, rej = check(gcp_weekly.history.quotes)
    assert len(ok) + len(rej) == len(gcp_weekly.history.quotes)
    assert {int(r.location.rsplit(":", 1)[1]) for r in rej} == bad_lines
    assert len(bad_lines) > 100 and all(r.reason == "below-gpu-floor" for r in rej)
    assert {r.offering.region for r in rej} >= {"northamerica-northeast2"}
