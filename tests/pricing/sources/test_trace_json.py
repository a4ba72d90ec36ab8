"""Traces as users have them: raw `aws ec2 describe-spot-price-history` JSON, Can't-Be-Late
layouts on GCP and with the time of day, 0/1 capacity probes in the user CSV."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timezone

import pytest

from pricing.errors import TraceFormatError
from pricing.model import Offering
from pricing.sources.trace import load_trace
from pricing.sources.trace_json import cbl_type


def event(zone, itype, price, ts, product="Linux/UNIX"):
    return {"AvailabilityZone": zone, "InstanceType": itype, "ProductDescription": product,
            "SpotPrice": f"{price:.6f}", "Timestamp": ts}


def test_raw_describe_spot_price_history_json_is_read_pages_and_all(tmp_path):
    # the CLI prints newest first, one document per page (concatenated when saved page by
    # page); Windows rows are skipped, the older "(Amazon VPC)" Linux spelling is kept
    page1 = {"SpotPriceHistory": [
        event("us-east-1b", "p3.2xlarge", 0.95, "2020-05-26T13:00:00+00:00"),
        event("us-east-1a", "p3.2xlarge", 0.92, "2020-05-26T12:30:00.000Z"),
        event("us-east-1a", "p3.2xlarge", 1.40, "2020-05-26T12:20:00Z", "Windows")],
        "NextToken": "abc"}
    page2 = {"SpotPriceHistory": [
        event("us-east-1a", "p3.2xlarge", 0.90, "2020-05-26T12:00:00Z",
              "Linux/UNIX (Amazon VPC)")]}
    p = tmp_path / "history.json"
    p.write_text(json.dumps(page1, indent=2) + "\n" + json.dumps(page2))
    snap = load_trace(p)
    a = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
    assert [(q.offering, q.price_per_hour) for q in snap.quotes] == [
        (a, 0.90), (a, 0.92), (a.__class__("aws", "us-east-1", "us-east-1b", "p3.2xlarge"), 0.95)]
    assert snap.quotes[0].time == datetime(2020, 5, 26, 12, tzinfo=timezone.utc)
    assert any("1 events of other operating systems skipped" in n for n in snap.notes)
    gz = tmp_path / "h.json.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    assert len(load_trace(tmp_path).quotes) == 6  # the folder reads .json.gz too


@pytest.mark.parametrize("text,says", [
    ('{"SpotPriceHistory": [{"InstanceType": "p3.2xlarge"}]}', "missing AvailabilityZone"),
    ('{"SpotPriceHistory": {}}', "must be a list"),
    ('{"SpotPriceHistory": [' + json.dumps(event("us-east-1a", "p3.2xlarge", 0.9, "soon"))
     + "]}", "Timestamp 'soon'"),
    ('{"SpotPriceHistory": [' + json.dumps(event("us-east-1a", "p3.2xlarge", 1e6, "2020-01-01"))
     + "]}", "not believable"),
    ('{"Reservations": []}', "unknown JSON trace: expected the output of `aws ec2 describe"),
    ('{"SpotPriceHistory": [', "not valid JSON: Expecting value at column 23 (a .json trace "
     "is the output of `aws ec2 describe-spot-price-history --output json`, whole"),
    ("garbage", "not valid JSON: Expecting value at column 1"),
])
def test_a_bad_json_trace_is_one_line_naming_the_file_and_the_fix(tmp_path, text, says):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(TraceFormatError) as err:
        load_trace(p)
    msg = str(err.value)
    assert says in msg and msg.startswith(str(p)) and "\n" not in msg


def _cbl(root, folder, name, data, meta=None):
    d = root / "availability" / "1-node" / folder
    d.mkdir(parents=True, exist_ok=True)
    f = d / name
    f.write_text(json.dumps({"metadata": {"gap_seconds": 600, **(meta or {})}, "data": data}))
    return f


def test_cant_be_late_layouts_map_gcp_tokens_to_gcp_types(tmp_path):
    f = _cbl(tmp_path, "gcp-03-01-2023", "us-central1-a_v100_1.json", [1, 0, 1])
    snap = load_trace(f)
    off = snap.availability[0].offering
    assert off == Offering("gcp", "us-central1", "us-central1-a", "n1+v100", "spot")
    assert snap.gpus["n1+v100"].model == "V100" and snap.availability[0].capacity == 1
    assert cbl_type("gcp", "a100_8") == "a2-highgpu-8g" and cbl_type("gcp", "t4_4") == "n1+t4x4"
    assert cbl_type("aws", "v100_1") == "p3.2xlarge" and cbl_type("aws", "t4_1") == "g4dn.xlarge"
    with pytest.raises(TraceFormatError, match="token 'intel_64' unknown on gcp"):
        load_trace(_cbl(tmp_path, "gcp-03-01-2023", "us-central1-a_intel_64.json", [1, 1]))


def test_cant_be_late_keeps_the_time_of_day(tmp_path):
    day = load_trace(_cbl(tmp_path, "aws-03-01-2023", "us-west-2a_v100_1.json", [1, 1]))
    assert day.availability[0].time == datetime(2023, 3, 1, tzinfo=timezone.utc)
    assert any("start of day UTC: the folder gives only the date" in n for n in day.notes)
    timed = load_trace(_cbl(tmp_path, "aws-03-01-2023-14-30", "us-west-2a_v100_1.json", [1, 1]))
    assert timed.availability[0].time == datetime(2023, 3, 1, 14, 30, tzinfo=timezone.utc)
    meta = load_trace(_cbl(tmp_path, "aws-03-02-2023", "us-west-2b_v100_1.json", [1, 0],
                           {"start": "2023-03-02T09:15:00Z"}))
    assert meta.availability[0].time == datetime(2023, 3, 2, 9, 15, tzinfo=timezone.utc)
    assert meta.spans[0].end == datetime(2023, 3, 2, 9, 35, tzinfo=timezone.utc)
    with pytest.raises(TraceFormatError, match="metadata.start 'noon'"):
        load_trace(_cbl(tmp_path, "aws-03-03-2023", "us-west-2c_v100_1.json", [1, 0],
                        {"start": "noon"}))


HEADER = "time,cloud,region,zone,instance_type,market,price_per_hour,on_demand_per_hour,available\n"


def test_a_0_1_column_of_the_user_csv_is_a_capacity_probe_and_a_count_stays_a_count(tmp_path):
    from provisioner.plan.throughput import ThroughputModel
    from provisioner.sim.world import build_world

    p = tmp_path / "probe.csv"
    rows = ["2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.9,3.06,1",
            "2024-01-01T01:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,,,0",
            "2024-01-01T02:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,,,1",
            "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1b,p3.2xlarge,spot,0.9,3.06,2",
            "2024-01-01T01:00:00Z,aws,us-east-1,us-east-1b,p3.2xlarge,spot,,,1",
            "2024-01-01T03:00:00Z,aws,us-east-1,us-east-1b,p3.2xlarge,spot,,,1"]
    p.write_text(HEADER + "\n".join(rows) + "\n")
    snap = load_trace(p)
    caps = {a.offering.zone: a.capacity for a in snap.availability}
    assert caps == {"us-east-1a": 1, "us-east-1b": None}
    assert any("read as capacity probes" in n for n in snap.notes)
    world = build_world(snap, ThroughputModel(unit=400.0), max_size=16)
    a, b = (Offering("aws", "us-east-1", z, "p3.2xlarge") for z in ("us-east-1a", "us-east-1b"))
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()
    assert world.available(a, t0) == 16 and world.available(a, t0 + 3600) == 0
    assert world.available(b, t0) == 2 and world.available(b, t0 + 3600) == 1
