"""Trace loading (every format in ../shared/data and the user CSV) and replay."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timedelta, timezone

import pytest

from pricing.errors import TraceFormatError
from pricing.model import Offering
from pricing.sources.base import PriceSource
from pricing.sources.trace import ReplayClock, TraceSource, load_trace
from pricing.sources.trace_formats import USER_COLUMNS

UTC = timezone.utc
HEADER = ",".join(USER_COLUMNS)


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_gcp_weekly_real_file(gcp_weekly):
    snap = gcp_weekly.history
    assert len(snap.quotes) > 170_000
    off = Offering("gcp", "us-central1", "*", "a2-highgpu-1g", "spot")
    series = [q for q in snap.quotes if q.offering == off]
    # README: $1.102/h spot in 2023-05 with on-demand $3.673/h
    first = series[0]
    assert first.time.year == 2023 and first.time.month == 5
    assert first.price_per_hour == pytest.approx(1.102, abs=0.001)
    assert first.on_demand_per_hour == pytest.approx(3.673, abs=0.001)
    # before spot prices existed: on-demand quotes only
    od = [q for q in snap.quotes if q.offering == off.with_market("on-demand")]
    assert od and all(q.time < first.time for q in od)
    assert snap.gpus["a3-highgpu-8g"].model == "H100" and snap.gpus["a3-highgpu-8g"].count == 8
    assert snap.gpus["g2-standard-4"].model == "L4"
    # the two three-week holes in the weekly series are reported, not silently bridged
    assert any("gap of 21 days" in n and "2022-03-07" in n for n in snap.notes)


def test_trace_source_view_at_time(gcp_weekly):
    src = gcp_weekly
    assert isinstance(src, PriceSource)
    off = Offering("gcp", "us-central1", "*", "a2-highgpu-1g", "spot")
    at = datetime(2024, 1, 1, tzinfo=UTC)
    view = src.fetch(now=at)
    (q,) = [q for q in view.quotes if q.offering == off]
    history = [h for h in src.history.quotes if h.offering == off and h.time <= at]
    assert q == history[-1] and q.time <= at
    later = src.fetch(now=at, regions=["us-central1"], gpus=["nvidia-l4"])
    assert later.quotes and all(q.offering.region == "us-central1" and
                                src.history.gpus[q.offering.instance_type].model == "L4"
                                for q in later.quotes)
    assert src.fetch().quotes[0].time <= src.end  # default: end of trace


def test_aws_events_real_file(shared_data):
    snap = load_trace(shared_data / "aws_spot_price_history" / "ericpauley_2022-05-31_all_types.csv.gz")
    assert snap.quotes and all(q.offering.cloud == "aws" for q in snap.quotes)
    q = next(q for q in snap.quotes if q.offering.zone == "use1-az4")
    assert q.offering.region == "us-east-1" and q.on_demand_per_hour is None
    assert any("skipped" in n for n in snap.notes)
    times = [q.time for q in snap.quotes]
    assert times == sorted(times)


def test_cant_be_late_real_folder(shared_data):
    root = shared_data / "spot_availability_traces" / "cant_be_late"
    snap = load_trace(root / "availability" / "1-node" / "aws-02-15-2023" / "us-east-1a_v100_1.json")
    data = json.loads((root / "availability/1-node/aws-02-15-2023/us-east-1a_v100_1.json").read_text())["data"]
    falls = sum(1 for a, b in zip(data, data[1:]) if a == 1 and b == 0)
    ups = sum(data)
    assert {a.offering for a in snap.availability} == {Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge")}
    assert sum(lt.revoked for lt in snap.lifetimes) == falls
    assert sum(lt.seconds for lt in snap.lifetimes) == pytest.approx(ups * 195)
    multi = load_trace(root / "availability" / "16-node" / "aws-08-27-2023" / "us-east-2b_v100_1.json")
    d16 = json.loads((root / "availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json").read_text())["data"]
    assert sum(lt.revoked for lt in multi.lifetimes) == sum(max(0, a - b) for a, b in zip(d16, d16[1:]))
    assert sum(lt.seconds for lt in multi.lifetimes) == pytest.approx(sum(d16) * 300)
    assert max(a.available for a in multi.availability) == 16 and multi.availability[0].capacity == 16
    gcp = load_trace(root / "preemption" / "1-node" / "gcp-04-30-2023" / "us-central1-a_c3-88.json")
    assert gcp.availability[0].offering == Offering("gcp", "us-central1", "us-central1-a", "c3-highcpu-88")


def test_lifetimes_real_file_censoring(shared_data):
    snap = load_trace(shared_data / "preemption_lifetimes" / "gcp_preemptible_gpu_lifetimes_2019.csv")
    assert len(snap.lifetimes) == 152
    assert all(lt.revoked == (lt.seconds < 24 * 3600) for lt in snap.lifetimes)
    assert {lt.offering.instance_type for lt in snap.lifetimes} == {"n1+k80", "n1+p100", "n1+v100"}


def test_whole_shared_data_folder_loads(shared_data):
    """Every trace-carrying file in ../shared/data, as a folder, in one call."""
    paths = [shared_data / d for d in ("aws_spot_price_history", "preemption_lifetimes/gcp_preemptible_gpu_lifetimes_2019.csv",
                                        "spot_availability_traces")]
    src = TraceSource(paths)
    clouds = {lt.offering.cloud for lt in src.history.lifetimes}
    assert clouds == {"aws", "gcp"} and src.history.quotes and src.history.availability and src.history.lifetimes


def test_user_csv_with_gaps_disorder_and_empty_cells(tmp_path):
    p = write(tmp_path, "mine.csv", HEADER + "\n"
              "2024-01-01T00:10:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.9,3.06,1\n"
              "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,3.06,1\n"
              "2024-01-01T00:20:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,,,0\n"
              "2024-01-01T00:30:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,,,1\n"
              "2024-01-01T10:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.1,,1\n")
    snap = load_trace(p)
    assert [q.price_per_hour for q in snap.quotes] == [1.0, 0.9, 1.1]
    assert snap.quotes[2].on_demand_per_hour is None
    assert any("mine.csv:3" in n and "out of time order" in n for n in snap.notes)
    assert any("mine.csv:6" in n and "gap" in n for n in snap.notes)
    assert [a.available for a in snap.availability] == [1, 0, 1]
    revoked = [lt for lt in snap.lifetimes if lt.revoked]
    assert len(revoked) == 1 and revoked[0].seconds == 1200
    src = TraceSource(p)
    view = src.fetch(now=datetime(2024, 1, 1, 0, 25, tzinfo=UTC))
    assert view.quotes[0].price_per_hour == 0.9 and view.availability[0].available == 0
    # the running lifetime is censored at the view time, never seen in the future
    assert all(lt.start + timedelta(seconds=lt.seconds) <= datetime(2024, 1, 1, 0, 25, tzinfo=UTC)
               for lt in view.lifetimes)


@pytest.mark.parametrize("body,problem", [
    ("2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,abc,,1\n", "mine.csv:2: column 'price_per_hour'"),
    ("yesterday,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1,,1\n", "mine.csv:2: column 'time'"),
    ("2024-01-01T00:00:00Z,azure,us-east-1,us-east-1a,p3.2xlarge,spot,1,,1\n", "mine.csv:2: Offering.cloud"),
    ("2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1\n", "mine.csv:2: expected 9 columns"),
    ("2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1,,-1\n", "mine.csv:2: column 'available'"),
])
def test_malformed_user_csv_names_file_and_line(tmp_path, body, problem):
    p = write(tmp_path, "mine.csv", HEADER + "\n" + body)
    with pytest.raises(TraceFormatError) as err:
        load_trace(p)
    assert problem in str(err.value)


def test_unknown_missing_and_broken_files(tmp_path):
    with pytest.raises(TraceFormatError, match=r"x.csv:1: unknown trace format"):
        load_trace(write(tmp_path, "x.csv", "a,b,c\n1,2,3\n"))
    with pytest.raises(TraceFormatError, match="no such file"):
        load_trace(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_trace(bad)
    folder = tmp_path / "aws-01-02-2023"
    folder.mkdir()
    (folder / "us-east-1a_v100_1.json").write_text('{"metadata": {"gap_seconds": 60}, "data": [1, 2.5]}')
    with pytest.raises(TraceFormatError, match=r"data\[1\]=2.5"):
        load_trace(folder / "us-east-1a_v100_1.json")
    (folder / "us-east-1a_v100_1.json").write_text('{"metadata": {}, "data": [1]}')
    with pytest.raises(TraceFormatError, match="gap_seconds"):
        load_trace(folder / "us-east-1a_v100_1.json")
    (folder / "us-east-1a_a100_9.json").write_text('{"metadata": {"gap_seconds": 60}, "data": [1]}')
    with pytest.raises(TraceFormatError, match="token 'a100_9' unknown"):
        load_trace(folder / "us-east-1a_a100_9.json")


def test_gcp_weekly_bad_number_names_line(tmp_path):
    p = tmp_path / "g.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write("snapshot_time,machine_type,gpu_type,gpu_count,vcpus,ram_gb,region,ondemand_usd_per_hour,spot_usd_per_hour\n"
                "2024-01-01T00:00:00+00:00,a2-highgpu-1g,a100,1,12,85,us-central1,3.67,1.1\n"
                "2024-01-01T00:00:00+00:00,a2-highgpu-1g,a100,1,12,85,us-east1,3.67,n/a\n")
    with pytest.raises(TraceFormatError, match=r"g.csv.gz:3: column 'spot_usd_per_hour'"):
        load_trace(p)


def test_replay_clock_speed_with_injected_clock(tmp_path):
    p = write(tmp_path, "r.csv", HEADER + "\n"
              "2024-01-01T00:00:00Z,gcp,us-central1,*,g2-standard-4,spot,0.30,0.85,\n"
              "2024-01-01T01:00:00Z,gcp,us-central1,*,g2-standard-4,spot,0.25,0.85,\n"
              "2024-01-01T02:00:00Z,gcp,us-central1,*,g2-standard-4,spot,0.40,0.85,\n")
    wall = [1000.0]
    src = TraceSource(p, speed=60.0, clock=lambda: wall[0])
    assert src.fetch().quotes[0].price_per_hour == 0.30
    wall[0] += 60.0  # one wall minute at 60x = one trace hour
    assert src.now() == datetime(2024, 1, 1, 1, tzinfo=UTC)
    assert src.fetch().quotes[0].price_per_hour == 0.25
    wall[0] += 90.0
    assert src.fetch().quotes[0].price_per_hour == 0.40
    clock = ReplayClock(datetime(2024, 1, 1), wall_start=0.0, speed=3600.0, clock=lambda: 2.0)
    assert clock.trace_time() == datetime(2024, 1, 1, 2, tzinfo=UTC)
    with pytest.raises(ValueError, match="speed"):
        ReplayClock(datetime(2024, 1, 1), 0.0, speed=0)


def test_aws_price_files_and_on_demand_join(shared_data):
    """2017 on-demand and 2021 regional spot files load; a view joins the on-demand price of
    the same cloud/region/type to spot quotes whose file had none."""
    src = TraceSource([shared_data / "aws_prices"])
    od = [q for q in src.history.quotes if q.offering.market == "on-demand"]
    assert len(od) == 42 and all(q.offering.zone == "*" for q in od)
    view = src.fetch()
    p2 = next(q for q in view.quotes if q.offering == Offering("aws", "us-east-1", "*", "p2.xlarge", "spot"))
    assert p2.on_demand_per_hour == 0.9  # us-east-1 p2.xlarge in the 2017 file
    assert any("joined" in n for n in view.notes)
    assert all(q.on_demand_per_hour is None for q in view.quotes
               if q.offering.market == "spot" and q.offering.instance_type.startswith("c5."))


def test_non_trace_files_hint_or_are_skipped_in_folders(shared_data, tmp_path):
    with pytest.raises(TraceFormatError, match="--advisor"):
        load_trace(shared_data / "aws_spot_advisor" / "spot_advisor_2021-02-10.csv.gz")
    (tmp_path / "zones.csv").write_text("NAME;ZONE\nnvidia-l4;us-central1-a\n")
    (tmp_path / "t.csv").write_text(HEADER + "\n2024-01-01T00:00:00Z,gcp,us-central1,*,g2-standard-4,spot,0.3,0.85,\n")
    snap = load_trace(tmp_path)
    assert len(snap.quotes) == 1 and any("skipped" in n and "zones.csv" in n for n in snap.notes)


def test_make_source_trace_replays_and_sanitizes(tmp_path, monkeypatch):
    from pricing.sources import make_source

    p = write(tmp_path, "r.csv", HEADER + "\n"
              "2024-01-01T00:00:00Z,gcp,us-central1,*,g2-standard-4,spot,0.30,0.85,\n"
              "2024-01-01T01:00:00Z,gcp,us-central1,*,g2-standard-4,spot,700.0,0.85,\n"
              "2024-01-01T02:00:00Z,gcp,us-central1,*,g2-standard-4,spot,0.40,0.85,\n")
    wall = [0.0]
    src = make_source("trace", trace=[p], speed=3600.0, clock=lambda: wall[0])
    wall[0] = 1.5  # 1.5 trace hours in: the 700.0 placeholder was refused at load
    assert src.fetch().quotes[0].price_per_hour == 0.30
    assert [r.reason for r in src.fetch().rejected] == ["placeholder"]
    wall[0] = 2.0
    assert src.fetch().quotes[0].price_per_hour == 0.40
    monkeypatch.setenv("SPOTRING_DATA", str(tmp_path / "empty"))
    with pytest.raises(TraceFormatError, match="no trace"):
        make_source("trace")
    with pytest.raises(ValueError, match="source kind"):
        make_source("azure")


def test_cant_be_late_tokens_name_types_with_that_gpu_and_count():
    """``<gpu>_<n>`` in a Can't-Be-Late file name is n GPUs of that model (k80_8 is
    p2.8xlarge, 8 K80s; p2.16xlarge has 16)."""
    from pricing.catalog import canonical_gpu, gpu_for
    from pricing.sources.trace_formats import CANT_BE_LATE_TYPES

    for token, itype in CANT_BE_LATE_TYPES.items():
        gpu, _, count = token.rpartition("_")
        spec = gpu_for(itype)
        if gpu in ("k80", "v100"):
            assert spec is not None, itype
            assert (spec.model, spec.count) == (canonical_gpu(gpu), int(count)), (token, itype)
