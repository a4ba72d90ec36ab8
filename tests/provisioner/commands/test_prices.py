"""`provision prices`: the target command on the real GCP history, errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from provisioner.cli import main
from pricing.sources.trace_formats import USER_COLUMNS

KEYS = {"cloud", "region", "zone", "instance_type", "market", "gpu", "gpu_count", "spot_price",
        "on_demand_price", "hazard_per_hour", "discount", "quote_time", "age_s", "hazard_basis"}


def test_target_command_on_real_gcp_history(shared_data, capsys):
    gcp_weekly_path = shared_data / "gcp_gpu_price_history" / "gcp_gpu_vm_prices_history.csv.gz"
    lifetimes = shared_data / "preemption_lifetimes" / "gcp_preemptible_gpu_lifetimes_2019.csv"
    assert main(["prices", "--source", "trace", "--trace", str(gcp_weekly_path), str(lifetimes), "--json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert rows and all(KEYS <= set(r) for r in rows)
    gpus = {r["gpu"] for r in rows}
    assert {"A100-40GB", "A100-80GB", "H100", "L4"} <= gpus
    for r in rows:
        assert r["market"] == "spot" and 0 < r["spot_price"] <= r["on_demand_price"]
        assert 0 < r["hazard_per_hour"] < 1 and r["hazard_basis"] in {"mle", "pooled", "default", "spot-advisor"}
    a2 = next(r for r in rows if r["region"] == "us-central1" and r["instance_type"] == "a2-highgpu-1g")
    assert a2["gpu_count"] == 1 and 1.0 < a2["spot_price"] < a2["on_demand_price"] < 5.0
    # bad rows of the file (no GPU component) refused and reported, never listed
    assert "refused" in err and "below-gpu-floor" in err
    assert all(r["on_demand_price"] / r["gpu_count"] >= 1.5 for r in rows if r["gpu"].startswith("A100"))


def test_table_and_filters_on_user_trace(tmp_path, capsys):
    p = tmp_path / "mine.csv"
    p.write_text(",".join(USER_COLUMNS) + "\n"
                 "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.95,3.06,1\n"
                 "2024-01-01T00:00:00Z,aws,us-east-1,us-east-1b,p3.2xlarge,spot,700.0,3.06,1\n"
                 "2024-01-01T00:00:00Z,aws,us-west-2,us-west-2a,g4dn.xlarge,spot,0.16,0.526,1\n"
                 "2024-01-01T02:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.05,3.06,0\n"
                 "2024-01-01T03:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1.00,3.06,1\n")
    assert main(["prices", "--trace", str(p), "--gpu", "v100", "--json", "--store", str(tmp_path / "p.sqlite")]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert [(r["zone"], r["spot_price"]) for r in rows] == [("us-east-1a", 1.00)]
    assert rows[0]["hazard_basis"] == "mle" and rows[0]["hazard_per_hour"] == pytest.approx(0.5)
    assert "placeholder 1" in err and "mine.csv:3" in err
    from pricing.store import PriceStore
    stored = PriceStore(tmp_path / "p.sqlite").latest()
    assert [(q.offering.zone, q.price_per_hour) for q in stored] == [("us-east-1a", 1.00)]
    assert main(["prices", "--trace", str(p), "--at", "2024-01-01T01:00:00Z", "--region", "us-east-1"]) == 0
    out, _ = capsys.readouterr()
    assert "us-east-1a" in out and "0.9500" in out and "us-west-2" not in out


def test_malformed_trace_exits_2_naming_file_and_line(tmp_path, capsys):
    p = tmp_path / "bad.csv"
    p.write_text(",".join(USER_COLUMNS) + "\n2024-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,cheap,,1\n")
    assert main(["prices", "--trace", str(p)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv:2" in err and "price_per_hour" in err and "Traceback" not in err
    assert main(["prices", "--trace", str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_no_trace_and_no_data_dir_is_a_user_error(monkeypatch, capsys):
    monkeypatch.delenv("SPOTRING_DATA", raising=False)
    assert main(["prices", "--source", "trace"]) == 2
    assert "--trace PATH" in capsys.readouterr().err
    assert main(["prices", "--source", "trace", "--trace", "x.csv", "--at", "soon"]) == 2
