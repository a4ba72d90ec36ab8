"""The Prometheus endpoint, scraped over HTTP as Prometheus does: the address is a setting
(loopback by default), and the series a Grafana board plots are there: per-worker
samples/s (a worker gone is removed), steps lost, reconfigurations and their seconds, the
savings against on-demand."""

from __future__ import annotations

import urllib.request

import pytest

from pricing.model import Offering
from provisioner.daemon.view.metrics import Metrics
from provisioner.daemon.view.savings import from_state
from provisioner.daemon.state import State
from provisioner.daemon.loop.telemetry import Telemetry
from provisioner.daemon.view.status import Status
from provisioner.errors import UserError
from provisioner.plan.throughput import ThroughputModel


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30).read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class Coordinator:
    """The two calls telemetry makes of the trainer's coordinator, scripted."""

    def __init__(self) -> None:
        self.stats_ = {"step": 40, "epoch": 2, "steps_lost": 3, "generation": 2}
        self.events_ = [{"kind": "formed", "name": "a", "data": {"switch_ms": 250.0}},
                        {"kind": "join", "name": "b", "data": {}},
                        {"kind": "formed", "name": "a,b", "data": {"switch_ms": 750.0}}]

    def stats(self):
        return dict(self.stats_)

    def events(self):
        return list(self.events_)

    def members(self):
        return []


def test_default_bind_is_loopback_and_a_bad_host_names_the_flag():
    m = Metrics()
    try:
        port = m.serve(0)
        assert m.address == ("127.0.0.1", port)
        assert "spotring_spend_usd" in "".join(scrape(port))
    finally:
        m.close()
    with pytest.raises(UserError, match="--metrics-host 203.0.113.9"):
        Metrics().serve(0, "203.0.113.9")  # TEST-NET-3: not an address of this host


def test_all_interfaces_when_asked():
    m = Metrics()
    try:
        port = m.serve(0, "0.0.0.0")
        assert "spotring_fleet_size" not in scrape(port)  # nothing recorded yet, but served
    finally:
        m.close()


def test_grafana_series_from_telemetry(tmp_path):
    from datetime import datetime, timezone

    state = State(tmp_path / "s.sqlite")
    spot = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot")
    state.record_price(spot, 0.0, 0.9)
    state.record_price(spot.with_market("on-demand"), 0.0, 3.06)
    state.begin_launch("t1", spot, 1, 0.0)
    state.finish_launch("t1", [("i-1", spot)], 0.0)
    m = Metrics()
    port = m.serve(0)
    try:
        tel = Telemetry(state, ThroughputModel(priors={}, unit=400.0), coordinator=Coordinator(),
                        metrics=m)
        now = datetime.fromtimestamp(3600.0, timezone.utc)
        st = Status(now, {spot.key: 1}, 0, {spot.key: 0.9}, 0.9, state.spend(3600.0), 300.0,
                    tel.coordinator.stats(), (), "", {"i-1": 180.0, "i-2": 120.0},
                    savings=from_state(state, 3600.0, 300.0))
        tel.record(st)
        got = scrape(port)
        assert got['spotring_worker_samples_per_s{worker="i-1"}'] == 180.0
        assert got['spotring_worker_samples_per_s{worker="i-2"}'] == 120.0
        assert got["spotring_steps_lost"] == 3.0
        assert got["spotring_epoch"] == 2.0
        assert got["spotring_reconfigurations_total"] == 2.0
        assert got["spotring_reconfiguration_seconds_total"] == pytest.approx(1.0)
        assert got["spotring_spend_usd"] == pytest.approx(0.9)
        assert got["spotring_on_demand_equivalent_usd"] == pytest.approx(3.06)
        assert got["spotring_savings_usd"] == pytest.approx(3.06 - 0.9)
        assert got["spotring_spend_ratio"] == pytest.approx(0.9 / 3.06)
        # no revocation: a checkpoint-restart trainer would have paid the same
        assert got["spotring_checkpoint_restart_equivalent_usd"] == pytest.approx(0.9)
        # i-2 left the ring: its series goes, rather than staying at its last value
        tel.record(Status(now, {spot.key: 1}, 0, {spot.key: 0.9}, 0.9, 0.9, 180.0,
                          tel.coordinator.stats(), (), "", {"i-1": 180.0}))
        got = scrape(port)
        assert 'spotring_worker_samples_per_s{worker="i-2"}' not in got
        assert got["spotring_reconfigurations_total"] == 2.0  # events counted once
    finally:
        m.close()
        state.close()


def test_every_metric_evaluate_returns_reaches_every_view(tmp_path, monkeypatch):
    """Issue 31.3: a job whose evaluate returns mse and r2 (no accuracy) shows both, with the
    step and time they were measured at, in Prometheus, the state (provision status, its
    JSON and text), the dashboard and the progress line."""
    from datetime import datetime, timezone

    from rich.console import Console

    from provisioner.commands.run_terminal import progress_line
    from provisioner.daemon.view.dashboard import render
    from provisioner.daemon.view.status import build_status, summary
    from provisioner.daemon.view.tables import status_lines

    state = State(tmp_path / "s.sqlite")
    state.set_meta("started_at", 0.0)
    coord = Coordinator()
    m = Metrics()
    port = m.serve(0)
    try:
        tel = Telemetry(state, ThroughputModel(priors={}, unit=400.0), coordinator=coord,
                        metrics=m)
        tel.begin()

        def record(t: float) -> None:
            now = datetime.fromtimestamp(t, timezone.utc)
            tel.record(build_status(now, state, {}, coord, "", 0))

        record(600.0)  # no evaluate yet: nothing claimed
        assert state.get_meta("job_metrics") is None
        coord.stats_ = {**coord.stats_, "step": 120, "epoch": 3,
                        "metrics": {"mse": 0.0123, "r2": 0.91}}
        record(1800.0)
        coord.stats_["step"] = 130  # the same values later: still measured at step 120
        record(1900.0)
        got = scrape(port)
        assert got['spotring_job_metric{name="mse"}'] == pytest.approx(0.0123)
        assert got['spotring_job_metric{name="r2"}'] == pytest.approx(0.91)
        assert got["spotring_job_metric_step"] == 120.0
        assert got["spotring_job_metric_time_seconds"] == 1800.0
        assert [v for _, k, v in state.metric_series("job_metric") if k == "r2"] == [0.91]

        doc = summary(state)
        assert doc["job_metrics"] == {"values": {"mse": 0.0123, "r2": 0.91}, "step": 120,
                                      "epoch": 3, "hours": 0.5}
        assert doc["ring"]["metrics"] == {"mse": 0.0123, "r2": 0.91}
        text = "\n".join(status_lines(doc, 80))
        assert "job: mse 0.0123, r2 0.91 (at step 120, epoch 3, 0.50 h)" in text, text
        st = build_status(datetime.fromtimestamp(1900.0, timezone.utc), state, {}, coord, "",
                          5)
        con = Console(width=80, height=24, record=True)
        con.print(render(st, 0.0, width=80, height=24))
        frame = con.export_text()
        assert "mse 0.0123" in frame and "r2 0.91" in frame and "step 120" in frame, frame
        assert "mse 0.0123, r2 0.91" in progress_line(st, 0.0)
    finally:
        m.close()
        state.close()


def test_the_planner_learns_an_instance_s_throughput_not_one_gpu_s(tmp_path):
    """Issue 29.3: a host with several GPUs runs a worker per GPU (``<instance>/<gpu>``);
    the throughput model the next plan reads gets the instance's samples/s (its workers'
    sum), averaged over the instances of a type; a worker of an instance the daemon does
    not hold teaches nothing."""
    state = State(tmp_path / "s.sqlite")
    quad = Offering("aws", "us-east-1", "us-east-1a", "g4dn.12xlarge", "spot")
    state.begin_launch("t1", quad, 2, 0.0)
    state.finish_launch("t1", [("i-1", quad), ("i-2", quad)], 0.0)
    tel = Telemetry(state, ThroughputModel(priors={"g4dn.12xlarge": 50.0}, unit=400.0))
    tel.observe({"i-1/0": 100.0, "i-1/1": 120.0, "i-1/2": 90.0, "i-1/3": 110.0,
                 "i-2/0": 95.0, "i-2/1": 105.0, "i-2/2": 100.0, "i-2/3": 100.0,
                 "i-9/0": 5000.0})
    assert tel.throughput.samples_per_s("g4dn.12xlarge") == pytest.approx((420.0 + 400.0) / 2)
