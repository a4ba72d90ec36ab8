"""`provision plan` and `provision simulate` end to end on small user-format traces."""

from __future__ import annotations

import json

import pytest

from provisioner.cli import main

HEADER = "time,cloud,region,zone,instance_type,market,price_per_hour,on_demand_per_hour,available\n"


@pytest.fixture()
def prices(tmp_path):
    p = tmp_path / "prices.csv"
    p.write_text(HEADER
                 + "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,3.06,\n"
                 + "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1b,p3.2xlarge,spot,1.2,3.06,\n"
                 + "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1c,p3.2xlarge,spot,1.9,3.06,\n")
    return p


def config(tmp_path, objective: str) -> str:
    c = tmp_path / "c.toml"
    c.write_text('[job]\nmodel_mb = 0.001\nthroughput_priors = {"p3.2xlarge" = 400.0}\n'
                 f"[objective]\n{objective}\n"
                 "[fleet]\nmax_zone_share = 0.5\nzone_allowance = 0\nmax_size = 8\n")
    return str(c)


def test_plan_json_spreads_over_the_two_cheapest_zones(tmp_path, prices, capsys):
    # 400/s each, a little less after the default hazard; target 700 -> 2 instances; at most
    # half the fleet per zone (no allowance) -> 1 in a ($1.0) + 1 in b ($1.2) = $2.2/h.
    cfg = config(tmp_path, 'kind = "min-cost"\ntarget_samples_per_s = 700')
    assert main(["plan", "--config", cfg, "--trace", str(prices), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    fleet = {f["offering"]: f["count"] for f in out["fleet"]}
    assert fleet == {"aws/us-east-1/us-east-1a/p3.2xlarge/spot": 1,
                     "aws/us-east-1/us-east-1b/p3.2xlarge/spot": 1}
    assert out["cost_per_hour"] == pytest.approx(2.2)
    assert "throughput target" in out["binding"] and out["status"] == "optimal"
    assert out["mode"] == "hybrid" and "2 zones" in out["mode_reason"]  # issue 20


def test_plan_text_explains_and_infeasible_budget_exits_2(tmp_path, prices, capsys):
    cfg = config(tmp_path, 'kind = "min-cost"\ntarget_samples_per_s = 700')
    assert main(["plan", "--config", cfg, "--trace", str(prices)]) == 0
    text = capsys.readouterr().out
    assert "bound by:" in text and "training mode: hybrid" in text
    bad = config(tmp_path, 'kind = "min-cost"\ntarget_samples_per_s = 700\nbudget_per_hour = 1.5')
    assert main(["plan", "--config", bad, "--trace", str(prices)]) == 2
    err = capsys.readouterr().err
    assert "budget_per_hour = 1.50" in err and "2.20 $/h" in err


def test_plan_config_error_names_the_field(tmp_path, prices, capsys):
    cfg = config(tmp_path, 'kind = "min-cost"')
    assert main(["plan", "--config", cfg, "--trace", str(prices)]) == 2
    assert "objective.target_samples_per_s" in capsys.readouterr().err


def test_simulate_cli_writes_report_and_json(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    rows = [HEADER]
    for h in range(0, 13):  # zone a goes away between 1 h and 3 h
        t = f"2024-01-01T{h:02d}:00:00Z"
        rows.append(f"{t},aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,4.0,{0 if 1 <= h < 3 else 4}\n")
        rows.append(f"{t},aws,us-east-1,us-east-1b,p3.2xlarge,spot,1.5,4.0,4\n")
    trace.write_text("".join(rows))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[job]\nmodel_mb = 0.001\nthroughput_priors = {"p3.2xlarge" = 100.0}\n'
                   "[fleet]\nmax_zone_share = 1.0\nmax_size = 4\nboot_s = 0\nreform_s = 0\n")
    report = tmp_path / "rep"
    code = main(["simulate", "--trace", str(trace), "--work", "720000", "--size", "1",
                 "--deadline", "4", "--config", str(cfg), "--report", str(report), "--json"])
    assert code == 0
    figs = json.loads(capsys.readouterr().out)
    assert set(figs) == {"spotring", "on-demand", "cheapest-first", "static-spot",
                         "uniform-progress", "hindsight"}
    assert all(f["deadline_met"] for n, f in figs.items() if n != "static-spot")
    assert figs["hindsight"]["total_cost_usd"] <= min(
        f["total_cost_usd"] for n, f in figs.items() if f["completion_hours"] is not None
        and f["completion_hours"] <= 4)
    md = (report / "report.md").read_text()
    assert "| spotring |" in md and "spotring cost ratio" in md
    # zone a went away, zone b never did: spot of the type was there all the time
    assert figs["spotring"]["spot_share"] == {"p3.2xlarge": 1.0}
    assert "p3.2xlarge 100% of the time" in md
    for png in ("price.png", "fleet.png", "throughput.png", "cost.png"):
        assert (report / png).stat().st_size > 1000
    assert json.loads((report / "figures.json").read_text()) == figs


def test_simulate_uniform_progress_needs_a_deadline(tmp_path, prices, capsys):
    assert main(["simulate", "--trace", str(prices), "--work", "1e6",
                 "--policy", "uniform-progress"]) == 2
    assert "needs --deadline" in capsys.readouterr().err


def test_cli_policy_names_match_the_simulator():
    from provisioner.commands.simulate import ALL_POLICIES as cli
    from provisioner.sim.report import ALL_POLICIES

    assert cli == ALL_POLICIES


def test_simulate_reports_bad_trace_rows_with_file_and_line(tmp_path, capsys):
    trace = tmp_path / "bad.csv"
    trace.write_text(HEADER
                     + "2024-01-01T02:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,4.0,4\n"
                     + "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,4.0,4\n"
                     + "2024-01-01T01:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,9.0,4.0,4\n"
                     + "2024-01-01T03:00:00Z,aws,us-east-1,us-east-1b,zz9.unknown,spot,1.0,4.0,4\n"
                     + "2024-01-01T12:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.0,4.0,4\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[job]\nmodel_mb = 0.001\nthroughput_priors = {"p3.2xlarge" = 100.0}\n')
    report = tmp_path / "rep"
    assert main(["simulate", "--trace", str(trace), "--work", "100000", "--size", "1",
                 "--config", str(cfg), "--report", str(report), "--policy", "on-demand",
                 "spotring"]) == 0
    md = (report / "report.md").read_text()
    assert "bad.csv:3: 1 row(s) out of time order" in md       # unsorted: sorted, reported
    assert "bad.csv:4: spot 9.0000 above on-demand 4.0000: dropped" in md  # implausible
    assert "left out: zz9.unknown" in md                        # unknown instance type
    figs = (report / "figures.json").read_text()
    assert '"spotring"' in figs


def test_plan_says_before_it_starts_when_the_budget_cannot_finish_the_work(tmp_path, prices,
                                                                          capsys):
    # 1.2e8 samples at the cheapest $1.0/h per ~400/s cost about $83: a $50 budget cannot
    cfg = tmp_path / "budget.toml"
    cfg.write_text('[job]\nbudget_usd = 50.0\nthroughput_priors = {"p3.2xlarge" = 400.0}\n'
                   '[objective]\nkind = "deadline"\nwork_samples = 1.2e8\ndeadline_hours = 30\n')
    cfg = str(cfg)
    assert main(["plan", "--config", cfg, "--trace", str(prices)]) == 0
    out = capsys.readouterr().out
    assert "note: budget: job.budget_usd leaves $50.00" in out and "raise job.budget_usd" in out
