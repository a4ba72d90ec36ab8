"""``provision simulate --every``: one start is one draw of the market, so a deadline is
replayed from every HOURS of the traces and the spread printed; the windows are the same
ones the leave-one-family-out benchmark cuts (``provisioner.sim.windows``)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from provisioner.cli import main
from provisioner.sim.windows import Window, goal_of, summarise, window_starts

HEADER = "time,cloud,region,zone,instance_type,market,price_per_hour,on_demand_per_hour,available\n"
H = 3600.0


def test_starts_are_every_step_and_each_leaves_the_deadline_and_the_tail_inside():
    assert window_starts(0.0, 39 * H, 10.0, 12.0) == [0.0, 12 * H]  # 24 + 10 + 6 > 39
    assert window_starts(0.0, 39 * H, 10.0, 12.0, tail_h=0.0) == [0.0, 12 * H, 24 * H]
    assert window_starts(0.0, 16 * H, 10.0, 5.0) == [0.0]  # an exact fit counts
    assert window_starts(0.0, 15 * H, 10.0, 5.0) == []
    with pytest.raises(ValueError, match="every_h"):
        window_starts(0.0, 40 * H, 10.0, 0.0)


def test_the_spread_counts_starts_past_the_goal_and_missed_deadlines():
    ws = [Window(0.0, 1.02, 0.30, 10.0, 9.0, True), Window(1.0, 1.20, 0.41, 12.0, 9.5, True),
          Window(2.0, None, None, 0.0, None, False)]
    s = summarise(ws, goal_of(1))
    assert s["windows"] == 3 and s["mean_vs_bound"] == pytest.approx(1.11)
    assert s["worst_vs_bound"] == 1.20 and s["past_goal"] == 1 and s["goal"] == 1.05
    assert s["worst_vs_on_demand"] == 0.41 and s["deadlines_missed"] == 1
    assert goal_of(3) == 1.10


@pytest.fixture
def market(tmp_path):
    """48 h of two zones, both out at 20-27 h: the start at 12 h meets the outage, the
    one at 0 h does not."""
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    rows = [f"{t0 + timedelta(hours=h):%Y-%m-%dT%H:%M:%SZ},aws,us-east-1,{zone},p3.2xlarge,"
            f"spot,1.0,4.0,{0 if 20 <= h < 27 else 4}\n"
            for h in range(49) for zone in ("us-east-1a", "us-east-1b")]
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "".join(rows))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[job]\nthroughput_priors = {"p3.2xlarge" = 100.0}\n')
    return ["simulate", "--trace", str(trace), "--config", str(cfg), "--work", "4e6"]


def test_every_start_is_the_single_run_from_that_start(market, capsys):
    assert main(market + ["--deadline", "10", "--every", "12", "--json"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert [w["start_utc"] for w in got["starts"]] == [
        "2024-01-01T00:00:00Z", "2024-01-01T12:00:00Z", "2024-01-02T00:00:00Z"]
    assert "3 starts every 12 h" in err and err.count(" met") == 3  # progress, on stderr
    for w in got["starts"]:  # the same figures as a plain run from that start
        assert main(market + ["--deadline", "10", "--start", w["start_utc"], "--hours", "16",
                              "--json"]) == 0
        one = json.loads(capsys.readouterr().out)
        assert w["vs_bound"] == one["hindsight"]["spotring_cost_per_sample_ratio"]
        assert w["vs_on_demand"] == one["on-demand"]["spotring_cost_per_sample_ratio"]
        assert w["cost"] == one["spotring"]["total_cost_usd"]
    ratios = [w["vs_bound"] for w in got["starts"]]
    assert got["worst_vs_bound"] == max(ratios) and got["windows"] == 3 and got["goal"] == 1.05
    assert got["mean_vs_bound"] == pytest.approx(sum(ratios) / 3, abs=1e-4)
    assert got["deadlines_missed"] == 0


def test_without_json_a_line_per_start_and_the_spread(market, capsys):
    assert main(market + ["--deadline", "10", "--every", "24"]) == 0
    out = capsys.readouterr().out
    assert "2024-01-01 00:00" in out and "2024-01-02 00:00" in out
    assert "over 2 starts:" in out and "the bound on average, worst" in out


@pytest.mark.parametrize("flags,says", [
    (["--every", "12"], "--every 12: replays a deadline from many starts; give --deadline"),
    (["--deadline", "10", "--every", "12", "--policy", "spotring"], "--policy: --every runs"),
    (["--deadline", "10", "--every", "0"], "--every 0.0: must be hours between the starts"),
    (["--deadline", "45", "--every", "12"], "--every 12: no start leaves the deadline (45 h) and"),
])
def test_bad_every_is_refused_with_one_line(market, capsys, flags, says):
    assert main(market + flags) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_every_with_a_report_is_refused_and_writes_nothing(market, tmp_path, capsys):
    report = tmp_path / "rep"
    assert main(market + ["--deadline", "10", "--every", "12", "--report", str(report)]) == 2
    assert "--report: --every runs" in capsys.readouterr().err and not report.exists()


def test_an_on_demand_ring_too_slow_to_finish_still_compares_per_sample(market, capsys):
    # one on-demand instance needs 22 h for 8e6 samples, past every 16 h window: its cost
    # per sample is still what on-demand alone pays, so the ratio is given
    flags = ["--work", "8e6", "--size", "1", "--deadline", "10", "--every", "24", "--json"]
    assert main(market[:-2] + flags) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["starts"] and all(0 < w["vs_on_demand"] < 1 for w in got["starts"])
    assert got["worst_vs_on_demand"] == max(w["vs_on_demand"] for w in got["starts"])
