"""Fixtures of the pricing tests: the real GCP weekly history, loaded once per session."""

from __future__ import annotations

import pytest

from pricing.sources.trace import TraceSource


@pytest.fixture(scope="session")
def gcp_weekly_path(shared_data):
    return shared_data / "gcp_gpu_price_history" / "gcp_gpu_vm_prices_history.csv.gz"


@pytest.fixture(scope="session")
def gcp_weekly(gcp_weekly_path) -> TraceSource:
    """TraceSource over the 178k-row GCP file (about 2 s to load; shared by tests)."""
    return TraceSource(gcp_weekly_path)
