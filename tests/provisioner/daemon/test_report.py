"""A report a person reads (issue 31, item 5): every figure explained once, with its unit;
percentages as percentages; no Python reprs; the job and the run named; events complete or
saying how many were cut, in time order; savings only for work done (none for a run that
trained nothing, none for a lost job, which is called lost)."""

from __future__ import annotations

import json
import re

import pytest

from pricing.model import Offering
from provisioner.daemon.state import State
from provisioner.daemon.view import report_text
from provisioner.daemon.view.report import figures, write_report
from provisioner.daemon.view.report_text import FIELDS, markdown

OFF = Offering("local", "local-1", "local-1a", "p3.2xlarge")


def a_state(path, *, outcome="done", samples=True):
    st = State(path)
    st.set_meta("started_at", 0.0)
    st.set_meta("run", {"id": "20261126T101010Z-abc123", "name": "digits-try2",
                        "identity": {"job_file": "/home/u/myjob.py"},
                        "ended": {"outcome": outcome, "reason": f"reason {outcome}",
                                  "failure": None, "stopped": True}})
    st.set_meta("job_metrics", {"values": {"mse": 0.0123, "r2": 0.91}, "step": 120,
                                "epoch": 3, "t": 1800.0})
    st.record_price(OFF, 0.0, 0.9)
    st.record_price(OFF.with_market("on-demand"), 0.0, 3.06)
    st.begin_launch("t1", OFF, 1, 0.0)
    st.finish_launch("t1", [("loc-1", OFF)], 0.0)
    # written out of time order (a ring event copied late), and one about the ring itself
    st.record_event(300.0, "launch", "loc-1", OFF, "deficit")
    st.record_event(200.0, "ring-join", "loc-1", None, "admitted")
    st.record_event(400.0, "ring-lost", "", None, "every member holding the state is gone")
    ring = {"samples_done": 25_600 if samples else 0, "epoch": 3 if samples else 0,
            "step": 400 if samples else 0, "outcome": outcome}
    return st, ring


def test_every_figure_has_one_row_that_explains_it(tmp_path):
    st, ring = a_state(tmp_path / "s.sqlite")
    fig = figures(st, 3600.0, ring)
    assert set(fig) <= set(FIELDS), set(fig) - set(FIELDS)
    assert all(meaning for _, _, meaning in FIELDS.values())


def test_the_report_reads_as_words_with_units_and_names_the_job(tmp_path):
    st, ring = a_state(tmp_path / "s.sqlite")
    path = write_report(st, tmp_path / "r", 3600.0, ring,
                        title="spotring run digits-try2: /home/u/myjob.py")
    md = path.read_text()
    fig = json.loads((tmp_path / "r" / "report.json").read_text())
    assert md.startswith("# spotring run digits-try2: /home/u/myjob.py")
    assert fig["job"] == "/home/u/myjob.py" and fig["name"] == "digits-try2"
    assert fig["saved_vs_on_demand_pct"] == pytest.approx(100 * (1 - 0.9 / 3.06), abs=0.1)
    assert "| saved vs on-demand | 70.6% |" in md
    assert "| spend | $0.9000 |" in md
    assert "mse 0.0123, r2 0.91 (measured at step 120, epoch 3, 0.50 h" in md
    assert not re.search(r"\bNone\b|\bTrue\b|\bFalse\b", md), md
    events = [ln for ln in md.splitlines() if re.match(r"- +\d", ln)]
    times = [float(ln.split()[1]) for ln in events]
    assert times == sorted(times) and len(events) == 3
    assert "the ring: every member holding the state is gone" in md
    assert "  lost by the ring" not in md  # no empty worker name


def test_events_cut_say_how_many(tmp_path, monkeypatch):
    st, ring = a_state(tmp_path / "s.sqlite")
    for k in range(30):
        st.record_event(500.0 + k, "launch", f"loc-{k}", OFF, "deficit")
    monkeypatch.setattr(report_text, "MAX_EVENTS", 10)
    fig = figures(st, 3600.0, ring)
    md = markdown("t", fig, st.events(limit=10, in_time=True), fig["events_total"], 0.0,
                  None, [])
    assert "(23 earlier events are not listed here; the state holds all 33" in md
    assert md.count("\n- ") == 10


@pytest.mark.parametrize("outcome, samples, why", [("lost", True, "the job was lost"),
                                                   ("done", False, "the run trained nothing")])
def test_savings_only_for_work_done(tmp_path, outcome, samples, why):
    st, ring = a_state(tmp_path / "s.sqlite", outcome=outcome, samples=samples)
    fig = figures(st, 3600.0, ring)
    assert fig["saved_vs_on_demand_pct"] is None
    assert fig["saved_vs_checkpoint_restart_pct"] is None
    text = report_text.summary(fig)
    assert f"no savings claimed: {why}" in text and "less than on-demand" not in text
    if outcome == "lost":
        assert text.startswith("The job was LOST")


def test_counts_never_contradict_the_events(tmp_path):
    st, ring = a_state(tmp_path / "s.sqlite")
    fig = figures(st, 3600.0, ring)
    # the ring-level loss (no member named) is not a member lost
    assert fig["members_lost"] == 0 and fig["joins"] == 1 and fig["events_total"] == 3
