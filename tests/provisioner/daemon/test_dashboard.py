"""The dashboard fits the terminal, shows booting workers, the savings and the ETA, and
says events in words."""

import io
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from rich.console import Console

from provisioner.daemon.view.dashboard import render
from provisioner.daemon.view.savings import Savings
from provisioner.daemon.state import Event
from provisioner.daemon.view.status import Status, WorkerRow, describe

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
SPOT = "local/local-1/local-1{z}/{t}/spot"


def status(n_events=40, n_workers=4):
    keys = [SPOT.format(z=z, t=t) for z in "abc" for t in ("p3.2xlarge", "p2.xlarge")]
    prices = {k: 0.9 for k in keys}
    prices.update({k.replace("/spot", "/on-demand"): 3.06 for k in keys})
    phases = ["active", "active", "draining", "booting", "joining", "active", "active"]
    workers = tuple(WorkerRow(f"loc-{i:010x}-0", keys[i % 6], phases[i % 7],
                              None if phases[i % 7] == "booting" else 1234.5, 0.918)
                    for i in range(n_workers))
    kinds = [("launch", "deficit of 1 for x"),
             ("notice", "trace: local/local-1/local-1b/p3.2xlarge/spot availability 0 < held 1"),
             ("killed", "market: job-time outage at 45% of the job (kill)"),
             ("ring-join", "admitted as member 1795518234329"),
             ("ring-generation", "published: membership change"),
             ("ring-formed", "formed at step 146"),
             ("ring-lost", "member 1795518443195: collective failed"),
             ("reconcile-note", '{"offering": "x", "why": "capacity"}')]
    events = tuple(Event(T0 + 36 * i, kinds[i % len(kinds)][0], f"loc-{i:010x}-0",
                         keys[i % 6], kinds[i % len(kinds)][1]) for i in range(n_events))
    return Status(now=datetime.fromtimestamp(T0 + 1800, timezone.utc),
                  fleet={keys[0]: 2, keys[1]: 1}, draining=1, prices=prices,
                  cost_per_hour=2.754, spend=1.3371, samples_per_s=4321.0,
                  progress={"epoch": 12, "step": 300, "accuracy": 0.962, "loss": 0.123,
                            "steps_lost": 1, "samples_done": 19200},
                  events=events, workers={}, instances=workers,
                  savings=Savings(1.3371, 4.9112, 3.1878, 2963.0, 1406.6, 3),
                  eta_s=756.0, speed=120.0, total_epochs=30,
                  counts={"notice": 2, "killed": 1, "launch": 6})


def lines_of(st, width, height):
    con = Console(width=width, height=height, file=io.StringIO(), record=True,
                  force_terminal=True, color_system=None)
    con.print(render(st, T0, width=width, height=height))
    return con.export_text().rstrip("\n").split("\n")


@pytest.mark.parametrize("n_events,n_workers", [(0, 0), (3, 1), (40, 4), (200, 12)])
def test_at_80x24_no_line_is_wider_than_80_and_there_are_at_most_24(n_events, n_workers):
    lines = lines_of(status(n_events, n_workers), 80, 24)
    assert len(lines) <= 24
    assert max(len(ln) for ln in lines) <= 80


def test_at_80x24_the_head_has_the_savings_the_eta_and_the_booting_worker():
    text = "\n".join(lines_of(status(), 80, 24))
    assert "saved 73%" in text  # 1 - 1.3371 / 4.9112 against on-demand
    assert "saved 58%" in text  # 1 - 1.3371 / 3.1878 against checkpoint-restart
    assert "ETA 0.21 h (6 s real)" in text
    assert "epoch 12/30" in text
    # savings only for work done: before the ring trained a sample, and for a lost job, none
    for progress in ({**status().progress, "samples_done": 0},
                     {**status().progress, "outcome": "lost"}):
        text_none = "\n".join(lines_of(replace(status(), progress=progress), 80, 24))
        assert "saved 73%" not in text_none and "saved -" in text_none
    assert "booting" in text and "draining" in text
    assert "events" in text


def test_a_bigger_terminal_grows_with_the_market_and_more_events():
    small = lines_of(status(), 80, 24)
    big = lines_of(status(), 200, 50)
    assert len(big) <= 50 and max(len(ln) for ln in big) <= 200
    assert len(big) > len(small)
    text = "\n".join(big)
    assert "market" in text and "on-demand $/h" in text
    assert sum("launched in" in ln for ln in big) > sum("launched in" in ln for ln in small)


def test_many_workers_are_cut_with_a_count_not_pushed_off_the_screen():
    lines = lines_of(status(n_workers=12), 80, 24)
    assert any("more" in ln for ln in lines)
    assert len(lines) <= 24


def test_events_are_said_in_words_not_raw_json():
    said = [describe(e) for e in status().events[:8]]
    assert said[1].startswith("loc-0000000001-0 got a notice: the market took back capacity "
                              "in p3.2xlarge local-1b (1 held, 0 left)")
    assert "killed without notice: job-time outage at 45% of the job" in said[2]
    assert said[3] == "loc-0000000003-0 joined the ring"
    assert "the ring trains with 1 member (formed at step 146)" == said[5]
    assert "{" not in said[7] and "offering x, why capacity" in said[7]
    assert all("{" not in s for s in said)


def test_at_80_columns_a_long_run_keeps_its_revocations_and_rates_whole():
    """Days of a big fleet (large counts, spend and rates): the head lines still show the
    revocations survived, the steps lost and the rate in full, not behind an ellipsis."""
    import dataclasses

    st = dataclasses.replace(status(), spend=12345.6789, cost_per_hour=123.456,
                             samples_per_s=1234567.0,
                             counts={"notice": 1234, "killed": 567, "launch": 9999},
                             progress={"epoch": 1234, "step": 987654, "accuracy": 0.962,
                                       "loss": 0.000123, "steps_lost": 567})
    text = "\n".join(lines_of(st, 80, 24))
    head = text.split("workers")[0]
    for needle in ("notices 1234", "kills 567", "steps lost 567", "$12,345.68", "1.2M samples/s",
                   "loss 0.000123", "epoch 1234/30"):
        assert needle in head, (needle, head)
    assert "…" not in head, head  # every head line whole


def test_when_the_job_is_over_the_empty_fleet_says_so():
    import dataclasses

    st = dataclasses.replace(status(n_workers=0), progress={"finished": True, "epoch": 30})
    assert "none left: the job is over" in "\n".join(lines_of(st, 80, 24))
