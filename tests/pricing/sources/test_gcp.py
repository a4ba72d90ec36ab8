"""GCP price source: the real compute and billing clients against a local HTTP fake."""

from __future__ import annotations

import pytest

pytest.importorskip("google.cloud.billing_v1")
from google.auth.credentials import AnonymousCredentials  # noqa: E402

from pricing.errors import CredentialsError, SourceError  # noqa: E402
from pricing.model import Offering  # noqa: E402
from pricing.sources import make_source  # noqa: E402
from pricing.sources.base import PriceSource  # noqa: E402
from pricing.sources.gcp import GcpSource  # noqa: E402
from tests.fakes.gcp_catalog_fake import GcpCatalogFake, sku  # noqa: E402

AMERICAS = ["us-central1", "us-east1"]
# us-central1 list prices (USD/h): A2 core/RAM and A100 GPU as on cloud.google.com/compute/gpus-pricing
RATES = {
    ("A2 Instance Core", "OnDemand"): 0.031611, ("A2 Instance Ram", "OnDemand"): 0.004237,
    ("Nvidia Tesla A100 GPU", "OnDemand"): 2.933908,
    ("Spot Preemptible A2 Instance Core", "Preemptible"): 0.009483, ("Spot Preemptible A2 Instance Ram", "Preemptible"): 0.001271,
    ("Spot Preemptible Nvidia Tesla A100 GPU", "Preemptible"): 0.880172,
    ("G2 Instance Core", "OnDemand"): 0.024988, ("G2 Instance Ram", "OnDemand"): 0.002927,
    ("Nvidia L4 GPU", "OnDemand"): 0.560706,
    ("Spot Preemptible G2 Instance Core", "Preemptible"): 0.00999, ("Spot Preemptible G2 Instance Ram", "Preemptible"): 0.00117,
    ("Spot Preemptible Nvidia L4 GPU", "Preemptible"): 0.2243,
    ("N1 Predefined Instance Core", "OnDemand"): 0.031611, ("N1 Predefined Instance Ram", "OnDemand"): 0.004237,
    ("Nvidia Tesla V100 GPU", "OnDemand"): 2.48,
    ("Spot Preemptible N1 Predefined Instance Core", "Preemptible"): 0.00698,
    ("Spot Preemptible N1 Predefined Instance Ram", "Preemptible"): 0.000935,
    ("Spot Preemptible Nvidia Tesla V100 GPU", "Preemptible"): 0.74,
}
MACHINES = {
    "a2-highgpu-1g": dict(guestCpus=12, memoryMb=85 * 1024, accelerators=[{"guestAcceleratorType": "nvidia-tesla-a100", "guestAcceleratorCount": 1}]),
    "a2-highgpu-2g": dict(guestCpus=24, memoryMb=170 * 1024, accelerators=[{"guestAcceleratorType": "nvidia-tesla-a100", "guestAcceleratorCount": 2}]),
    "g2-standard-4": dict(guestCpus=4, memoryMb=16 * 1024, accelerators=[{"guestAcceleratorType": "nvidia-l4", "guestAcceleratorCount": 1}]),
    "n2-standard-4": dict(guestCpus=4, memoryMb=16 * 1024),
}


def fake() -> GcpCatalogFake:
    skus = [sku(f"{d} running in Americas", usage, AMERICAS, usd,
                unit="GiBy.h" if "Ram" in d else "h") for (d, usage), usd in RATES.items()]
    skus.append(sku("Commitment v1: A2 Cpu in Americas for 1 Year", "Commit1Yr", AMERICAS, 0.02))
    mt = lambda *names: [dict(MACHINES[n], name=n) for n in names]  # noqa: E731
    return GcpCatalogFake(
        zones={"us-central1-a": "us-central1", "us-central1-b": "us-central1", "europe-west4-a": "europe-west4"},
        machine_types={"us-central1-a": mt("a2-highgpu-1g", "a2-highgpu-2g", "g2-standard-4", "n2-standard-4"),
                       "us-central1-b": mt("g2-standard-4"), "europe-west4-a": mt("a2-highgpu-1g")},
        accelerator_types={"us-central1-a": {"nvidia-tesla-a100": 16, "nvidia-l4": 8, "nvidia-tesla-v100": 2},
                           "us-central1-b": {"nvidia-l4": 8}},
        skus=skus, page_size=3)


def source(f: GcpCatalogFake) -> GcpSource:
    return GcpSource("proj", endpoint_url=f.endpoint, credentials=AnonymousCredentials())


def expected(name: str, usage: str) -> float:
    m = MACHINES[name]
    fam, gpu = ("A2", "Nvidia Tesla A100 GPU") if name.startswith("a2") else ("G2", "Nvidia L4 GPU")
    pre = "Spot Preemptible " if usage == "Preemptible" else ""
    n = m["accelerators"][0]["guestAcceleratorCount"]
    return (m["guestCpus"] * RATES[(f"{pre}{fam} Instance Core", usage)]
            + m["memoryMb"] / 1024 * RATES[(f"{pre}{fam} Instance Ram", usage)]
            + n * RATES[(f"{pre}{gpu}", usage)])


def test_fetch_prices_machine_types_from_sku_components(gcp_weekly):
    with fake() as f:
        src = source(f)
        assert isinstance(src, PriceSource)
        snap = src.fetch()
        pages = sum(1 for r in f.requests if r.endswith("/skus"))
    assert pages == 7  # 19 SKUs in pages of 3: the pager followed nextPageToken
    got = {(q.offering.zone, q.offering.instance_type): q for q in snap.quotes}
    assert set(got) == {("us-central1-a", "a2-highgpu-1g"), ("us-central1-a", "a2-highgpu-2g"),
                        ("us-central1-a", "g2-standard-4"), ("us-central1-b", "g2-standard-4"),
                        ("us-central1-a", "n1-standard-8+v100x1"), ("us-central1-a", "n1-standard-16+v100x2")}
    # N1 + attached V100s: 8 vCPUs and 30 GB per GPU, up to the type's maximum cards (2)
    n1 = got[("us-central1-a", "n1-standard-16+v100x2")]
    assert n1.price_per_hour == pytest.approx(16 * 0.00698 + 60 * 0.000935 + 2 * 0.74)
    assert n1.on_demand_per_hour == pytest.approx(16 * 0.031611 + 60 * 0.004237 + 2 * 2.48)
    assert snap.gpus["n1-standard-8+v100x1"].model == "V100"
    q = got[("us-central1-a", "a2-highgpu-1g")]
    assert q.offering == Offering("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "spot")
    assert q.price_per_hour == pytest.approx(expected("a2-highgpu-1g", "Preemptible"))
    assert q.on_demand_per_hour == pytest.approx(expected("a2-highgpu-1g", "OnDemand"))
    assert got[("us-central1-a", "a2-highgpu-2g")].price_per_hour == pytest.approx(expected("a2-highgpu-2g", "Preemptible"))
    assert snap.gpus["a2-highgpu-2g"].count == 2 and snap.gpus["g2-standard-4"].model == "L4"
    # europe-west4 has no SKU rates in the fake: no quote, and the notes say so
    assert any("a2-highgpu-1g in europe-west4" in n for n in snap.notes)
    # the component sum reproduces the latest on-demand price in the real weekly history
    real = next(h for h in gcp_weekly.fetch().quotes
                if h.offering == Offering("gcp", "us-central1", "*", "a2-highgpu-1g")).on_demand_per_hour
    assert q.on_demand_per_hour == pytest.approx(real, rel=1e-4)


def test_filters_and_helpers():
    with fake() as f:
        src = source(f)
        snap = src.fetch(regions=["us-central1"], gpus=["nvidia-l4"])
        assert {q.offering.instance_type for q in snap.quotes} == {"g2-standard-4"}
        assert src.accelerator_types()["us-central1-b"] == {"L4": 8}
        assert src.zones()["europe-west4-a"] == "europe-west4"


def test_api_errors_are_translated():
    with fake() as f:
        f.fail_next("/skus", 403)
        with pytest.raises(CredentialsError, match="--source trace"):
            source(f).fetch()
        f.fail_next("/zones", 404)
        with pytest.raises(SourceError, match="listing GCP zones"):
            source(f).fetch()


def test_no_credentials(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    with pytest.raises(CredentialsError, match="--source trace"):
        make_source("gcp").fetch()
