"""The user formats: event logs and count series (units, start, duplicates, overlaps), and
absurd numbers in any trace refused with file, line and the fix."""

from __future__ import annotations

import gzip
from datetime import datetime, timedelta, timezone

import pytest

from pricing.errors import TraceFormatError
from pricing.model import Offering
from pricing.sources.trace import load_trace
from pricing.sources.trace_formats import USER_COLUMNS

UTC = timezone.utc
T0 = datetime(2024, 3, 1, tzinfo=UTC)
P3 = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_event_log_gives_exact_lives_counts_and_removals(tmp_path):
    # three instances; b is removed at 2 h (a revocation), c added and removed at 3 h
    # (its life is exact), a is still up when the log ends at 5 h (censored).
    p = write(tmp_path, "aws_us-east-1a_p3.2xlarge.csv", "time_h,event,instance_id\n"
              "0,add,a\n0,add,b\n1,add,c\n2,remove,b\n3,remove,c\n5,add,d\n")
    snap = load_trace(p, start=T0)
    assert {a.offering for a in snap.availability} == {P3}
    assert [(a.time - T0, a.available) for a in snap.availability] == [
        (timedelta(0), 2), (timedelta(hours=1), 3), (timedelta(hours=2), 2),
        (timedelta(hours=3), 1), (timedelta(hours=5), 2)]
    revoked = sorted(lt.seconds / 3600 for lt in snap.lifetimes if lt.revoked)
    assert revoked == [2.0, 2.0]  # b lived 0..2 h, c 1..3 h
    censored = sorted(lt.seconds / 3600 for lt in snap.lifetimes if not lt.revoked)
    assert censored == [0.0, 5.0]
    (span,) = snap.spans
    assert (span.start, span.end) == (T0, T0 + timedelta(hours=5))


def test_event_log_duplicates_and_removes_without_adds_are_resolved_and_reported(tmp_path):
    # x is removed at 60 s with no add: alive from the log's start; a second add of a live
    # y and a second remove of a gone y are ignored, not turned into flaps.
    p = write(tmp_path, "aws_us-east-1a_p3.2xlarge_spot.csv", "time_s,event,instance_id\n"
              "0,add,y\n30,add,y\n60,remove,x\n90,remove,y\n120,remove,y\n600,add,z\n")
    snap = load_trace(p, start=T0)
    assert [a.available for a in snap.availability] == [2, 1, 0, 1]
    assert sum(lt.revoked for lt in snap.lifetimes) == 2
    text = "\n".join(snap.notes)
    assert "removed without an add: taken as alive" in text
    assert "p3.2xlarge_spot.csv:3: 2 event(s)" in text and "ignored (duplicates)" in text


def test_count_series_duplicate_times_and_overlaps_are_one_change_not_flaps(tmp_path):
    # ms from the start; 2,000 ms appears twice (the last, 4, kept: no 2 in between); the
    # rows going back to 1,000 ms repeat a period already read (a second export appended):
    # dropped. Revocations: 4 -> 3 (one) and 4 -> 1 (three).
    p = write(tmp_path, "gcp_us-central1-a_a2-highgpu-1g.csv", "time_ms,count\n"
              "0,4\n1000,3\n2000,2\n2000,4\n3000,4\n1000,0\n2000,0\n7200000,1\n")
    snap = load_trace(p, start=T0)
    off = Offering("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "spot")
    assert [(a.offering, a.available) for a in snap.availability] == [
        (off, 4), (off, 3), (off, 4), (off, 1)]
    text = "\n".join(snap.notes)
    assert "csv:5: 1 row(s) repeat the time" in text
    assert "csv:7: 2 row(s) go back in time" in text
    assert sum(lt.revoked for lt in snap.lifetimes) == 1 + 3


def test_unit_times_without_a_start_are_refused_with_the_flag_to_pass(tmp_path):
    p = write(tmp_path, "aws_us-east-1a_p3.2xlarge.csv", "time_s,count\n0,1\n60,0\n")
    with pytest.raises(TraceFormatError, match=r"csv:2: column 'time_s'.*--trace-start"):
        load_trace(p)
    epoch = write(tmp_path, "aws_us-east-1b_p3.2xlarge.csv",
                  f"time_s,count\n{T0.timestamp():.0f},1\n{T0.timestamp() + 60:.0f},0\n")
    assert load_trace(epoch).availability[0].time == T0  # epoch seconds need no start


@pytest.mark.parametrize("name,text,problem", [
    ("aws_us-east-1a_p3.2xlarge.csv", "time,count\n2024-01-01T00:00:00Z,3\n",
     "csv:2: the count series has a single time"),
    ("aws_us-east-1a_p3.2xlarge.csv", "time,event,instance_id\n2024-01-01T00:00:00Z,add,a\n",
     "csv:2: the event log has a single time"),
    ("aws_us-east-1a_p3.2xlarge.csv", "time,count\n", "no rows"),
    ("mytrace.csv", "time,count\n2024-01-01T00:00:00Z,3\n2024-01-01T01:00:00Z,3\n",
     "name the file <cloud>_<zone>_<instance_type>"),
    ("aws_us-east-1a_p3.2xlarge.csv", "time_h,count\n0,3\n1e300,3\n", "csv:3: column 'time_h'"),
    ("aws_us-east-1a_p3.2xlarge.csv", "time_h,count\n0,3\n1,inf\n", "csv:3: column 'count'"),
    ("aws_us-east-1a_p3.2xlarge.csv", "time_h,count\n0,3\n1,2.5\n", "must be a count"),
    ("aws_us-east-1a_p3.2xlarge.csv", "time_h,event,instance_id\n0,add,a\n1,evicted,a\n",
     "csv:3: column 'event': 'evicted' must be add or remove"),
    ("u.csv", ",".join(USER_COLUMNS) + "\n2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,"
     "p3.2xlarge,spot,1e308,,1\n", "u.csv:2: column 'price_per_hour': '1e308' is not believable"),
    ("u.csv", ",".join(USER_COLUMNS) + "\n2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,"
     "p3.2xlarge,spot,nan,,1\n", "u.csv:2: column 'price_per_hour': 'nan' is not believable"),
])
def test_bad_user_traces_name_file_line_and_fix(tmp_path, name, text, problem):
    with pytest.raises(TraceFormatError) as err:
        load_trace(write(tmp_path, name, text), start=T0)
    assert problem in str(err.value)


def test_absurd_tick_and_corrupt_gzip_are_refused(tmp_path):
    folder = tmp_path / "availability" / "1-node" / "aws-01-02-2023"
    folder.mkdir(parents=True)
    f = folder / "us-east-1a_v100_1.json"
    f.write_text('{"metadata": {"gap_seconds": 1e300}, "data": [1, 0]}')
    with pytest.raises(TraceFormatError, match=r"gap_seconds=1e\+300: must be a number of seconds"):
        load_trace(f)
    f.write_text('{"metadata": {"gap_seconds": 60}, "data": [1]}')
    with pytest.raises(TraceFormatError, match="needs at least two"):
        load_trace(f)
    good = gzip.compress(b"time,count\n" + b"".join(b"%d,1\n" % i for i in range(5000)))
    bad = tmp_path / "aws_us-east-1a_p3.2xlarge.csv.gz"
    bad.write_bytes(good[:40] + b"\x00" * 64 + good[104:])  # the stream broken mid-file
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_trace(bad, start=T0)


def test_two_files_observing_one_offering_over_one_period_keep_the_first(tmp_path):
    a = write(tmp_path, "aws_us-east-1a_p3.2xlarge.csv", "time_h,count\n0,2\n4,2\n")
    b = tmp_path / "b"
    b.mkdir()
    b = write(b, "aws_us-east-1a_p3.2xlarge.csv", "time_h,count\n2,0\n6,0\n")
    snap = load_trace([a, b], start=T0)
    assert [a.available for a in snap.availability] == [2]
    assert any("overlapping" in n and "dropped" in n for n in snap.notes)
    assert len(snap.spans) == 1
