from datetime import datetime, timezone

import pytest

from pricing.model import Offering, PriceQuote


def test_offering_key_round_trip():
    o = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
    assert Offering.from_key(o.key) == o
    assert o.with_market("on-demand").market == "on-demand"


@pytest.mark.parametrize("field,kwargs", [
    ("cloud", dict(cloud="azure")),
    ("market", dict(market="reserved")),
    ("zone", dict(zone="")),
])
def test_offering_rejects_bad_fields_naming_them(field, kwargs):
    base = dict(cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="p3.2xlarge", market="spot")
    base.update(kwargs)
    with pytest.raises(ValueError, match=f"Offering.{field}"):
        Offering(**base)


def test_quote_times_are_utc_and_discount():
    o = Offering("gcp", "us-central1", "*", "a2-highgpu-1g")
    q = PriceQuote(o, datetime(2024, 1, 1), 1.1, 3.673)
    assert q.time.tzinfo == timezone.utc
    assert q.discount == pytest.approx(1 - 1.1 / 3.673)
    assert PriceQuote(o, datetime(2024, 1, 1), 1.1, None).discount is None
