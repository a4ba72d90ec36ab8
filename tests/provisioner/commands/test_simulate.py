"""``provision simulate`` refuses absurd input with one line naming the flag and the fix
(exit 2, nothing written), and its --json never holds Infinity or NaN."""

from __future__ import annotations

import json

import pytest

from provisioner.cli import main

HEADER = "time,cloud,region,zone,instance_type,market,price_per_hour,on_demand_per_hour,available\n"


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(HEADER
                 + "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,4.0,4\n"
                 + "2024-01-01T12:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,4.0,4\n")
    return p


@pytest.mark.parametrize("flags,says", [
    (["--work", "inf"], "--work inf: must be samples to train"),
    (["--work", "nan"], "--work nan"),
    (["--work", "1e6", "--deadline", "1e9"], "--deadline 1000000000.0: must be hours"),
    (["--work", "1e6", "--deadline", "100"], "--deadline 100: beyond the 12.0 h the traces cover"),
    (["--work", "1e6", "--tick", "0"], "--tick 0.0: must be seconds between decisions"),
    (["--work", "1e6", "--hours", "1e300"], "--hours 1e+300"),
    (["--work", "1e6", "--checkpoint", "0"], "--checkpoint 0.0"),
    (["--work", "1e6", "--size", "0"], "--size 0"),
    (["--work", "1e6", "--on-demand", "p3.2xlarge=1e308"], "--on-demand p3.2xlarge=1e+308"),
    (["--work", "1e6", "--on-demand", "p3.2xlarge=inf"], "--on-demand p3.2xlarge=inf"),
    (["--work", "1e6", "--trace-start", "yesterday"], "--trace-start 'yesterday': not an ISO"),
])
def test_absurd_flags_are_refused_with_one_line(trace, tmp_path, capsys, flags, says):
    report = tmp_path / "rep"
    code = main(["simulate", "--trace", str(trace), "--report", str(report)] + flags)
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1
    assert not report.exists()


def test_a_report_folder_that_cannot_be_written_is_refused_before_anything_runs(
        trace, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["simulate", "--trace", str(trace), "--work", "1e5",
                 "--report", str(blocker / "rep")]) == 2
    err = capsys.readouterr().err
    assert "a-file is not a writable folder" in err and len(err.strip().splitlines()) == 1


def test_json_has_no_infinity_when_a_policy_cannot_run_the_work(trace, capsys):
    # 1e12 samples cannot be done in 12 h: every run is flagged unfinished, the bound is
    # for spotring's work, and nothing in the JSON is Infinity or NaN.
    cfg = trace.parent / "c.toml"
    cfg.write_text('[job]\nthroughput_priors = {"p3.2xlarge" = 100.0}\n')
    assert main(["simulate", "--trace", str(trace), "--work", "1e12", "--json", "--config",
                 str(cfg)]) == 0
    out = capsys.readouterr().out
    figs = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert figs["spotring"]["finished"] is False and figs["spotring"]["work_done_fraction"] < 1
    assert "spotring_cost_per_sample_ratio" not in figs["on-demand"]
    assert "spotring_cost_per_sample_ratio_unequal_work" in figs["on-demand"]
    assert figs["hindsight"]["spotring_cost_per_sample_ratio"] > 0  # the bound of the same work


def test_event_log_with_a_start_and_on_demand_for_a_zone_star_region(tmp_path, capsys):
    # An autoscaling group's log (hours from --trace-start) gives availability and removals;
    # prices come from a user CSV with an empty zone ("*": the region's price); on-demand
    # from --on-demand, which must price the region although its spot zone is "*".
    log = tmp_path / "aws_us-east-1a_p3.2xlarge.csv"
    log.write_text("time_h,event,instance_id\n" + "".join(
        f"0,add,i{k}\n" for k in range(8)) + "3,remove,i0\n6,remove,i1\n6,add,i8\n24,add,i9\n")
    prices = tmp_path / "prices.csv"
    prices.write_text(HEADER + "2024-03-01T00:00:00Z,aws,us-east-1,,p3.2xlarge,spot,0.9,,\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[job]\nthroughput_priors = {"p3.2xlarge" = 100.0}\n')
    assert main(["simulate", "--trace", str(log), str(prices), "--trace-start",
                 "2024-03-01T00:00:00Z", "--on-demand", "p3.2xlarge=3.06", "--work", "3e6",
                 "--json", "--config", str(cfg), "--policy", "spotring", "on-demand"]) == 0
    figs = json.loads(capsys.readouterr().out)
    assert figs["on-demand"]["finished"] and figs["spotring"]["finished"]
    assert figs["on-demand"]["total_cost_usd"] > figs["spotring"]["total_cost_usd"]


def test_without_json_a_summary_table_and_the_money_line_are_printed(trace, capsys):
    assert main(["simulate", "--trace", str(trace), "--work", "1e6",
                 "--policy", "spotring", "on-demand"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["policy", "cost", "USD"]
    assert lines[1].startswith("spotring") and lines[2].startswith("on-demand")
    assert "spotring spent $" in out and "saved" in out and "{" not in out


def test_raw_describe_spot_price_history_json_simulates(tmp_path, capsys):
    # what `aws ec2 describe-spot-price-history --output json` prints, unchanged (it was
    # refused as an unknown trace)
    ev = [{"AvailabilityZone": z, "InstanceType": "p3.2xlarge", "ProductDescription": "Linux/UNIX",
           "SpotPrice": p, "Timestamp": t} for z, p, t in (
        ("us-east-1b", "0.950000", "2020-05-26T13:00:00.000Z"),
        ("us-east-1a", "0.918000", "2020-05-26T12:00:00.000Z"))]
    p = tmp_path / "history.json"
    p.write_text(json.dumps({"SpotPriceHistory": ev}, indent=4))
    assert main(["simulate", "--trace", str(p), "--work", "1e6", "--hours", "5", "--json",
                 "--on-demand", "p3.2xlarge=3.06", "--policy", "spotring", "on-demand"]) == 0
    figs = json.loads(capsys.readouterr().out)
    assert figs["spotring"]["finished"] and figs["spotring"]["money"]["saved_vs_on_demand_usd"] > 0
    assert "spot_share" not in figs["spotring"]  # prices only: no capacity was measured


def test_the_share_of_time_spot_had_capacity_is_reported_for_pacing_spot_share(
        tmp_path, capsys):
    # zone a there 0-3 h, out 3-9 h; zone b out 0-6 h, there 6-12 h: some zone had spot
    # 0-3 h and 6-12 h, 9 of the 12 h (a zone out is not spot out, both out is)
    rows = [("00", "a", 4), ("03", "a", 0), ("09", "a", 4), ("12", "a", 4),
            ("00", "b", 0), ("06", "b", 4), ("12", "b", 4)]
    t = tmp_path / "t.csv"
    t.write_text(HEADER + "".join(
        f"2024-01-01T{h}:00:00Z,aws,us-east-1,us-east-1{z},p3.2xlarge,spot,1.0,4.0,{n}\n"
        for h, z, n in rows))
    args = ["simulate", "--trace", str(t), "--work", "1e5", "--policy", "spotring"]
    assert main(args + ["--json"]) == 0
    figs = json.loads(capsys.readouterr().out)
    assert figs["spotring"]["spot_share"] == {"p3.2xlarge": pytest.approx(0.75)}
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "p3.2xlarge 75% of the time" in out and "[pacing] spot_share" in out


def test_with_a_deadline_it_says_what_the_deadline_costs_at_least(trace, tmp_path, capsys):
    # 4 spot instances at most, $1/h, on-demand $4/h; 1e7 samples (the 4-instance ring does
    # about 1.4e6 an hour) by 9 h. Keeping 2 h of slack means finishing by 7 h, on more
    # instances: dearer than the bound; kept safe alone, no dearer than it here.
    cfg = tmp_path / "c.toml"
    cfg.write_text('[job]\nthroughput_priors = {"p3.2xlarge" = 100.0}\nmodel_mb = 1.0\n')
    args = ["simulate", "--trace", str(trace), "--work", "1e7", "--deadline", "9",
            "--config", str(cfg), "--policy", "spotring", "hindsight"]
    assert main(args + ["--json"]) == 0
    bound = json.loads(capsys.readouterr().out)["hindsight"]
    assert bound["margin_hours"] == 2.0
    assert (bound["total_cost_usd"] <= bound["deadline_safe_usd"] + 1e-6
            < bound["margin_kept_usd"])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "the deadline on this market, at least: $" in out
    assert f"${bound['margin_kept_usd']:,.2f}" in out and "keeping 2 h of slack" in out
