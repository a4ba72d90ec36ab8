"""State: write-ahead intents survive a crash; spend = Σ instance-seconds × price."""

import multiprocessing
import os
import signal

import pytest

from pricing.model import Offering
from provisioner.errors import ConfigError
from provisioner.daemon.state import State

A = Offering("local", "r1", "r1-a", "local.v100")
B = Offering("local", "r1", "r1-b", "local.k80")


def test_spend_over_price_changes_and_instance_lives(tmp_path):
    s = State(tmp_path / "s.sqlite")
    s.record_price(A, 0, 3.6)      # $3.6/h = $0.001/s
    s.record_price(A, 100, 7.2)
    s.record_price(A, 150, 7.2)    # unchanged: not recorded
    s.record_price(B, 0, 0.36)
    assert len(s.price_series(A)) == 2
    s.begin_launch("t1", A, 1, 50)
    s.finish_launch("t1", [("i-1", A)], 50)
    s.adopt("i-2", B, 0)
    s.end_instance("i-1", 200, "drained")
    assert not s.end_instance("i-1", 300, "again")  # ended once
    # i-1: 50..100 at 0.001/s + 100..200 at 0.002/s = 0.05 + 0.2; i-2: 0..400 at 0.0001/s
    assert s.spend(400) == pytest.approx(0.25 + 0.04)
    assert s.instance_seconds(400) == pytest.approx(150 + 400)
    assert s.price_at(A, 120) == 7.2 and s.price_at(A, 10) == 3.6


def test_open_intents_are_found_after_reopen(tmp_path):
    p = tmp_path / "s.sqlite"
    s = State(p)
    s.begin_launch("tok-a", A, 2, 10)
    s.begin_launch("tok-a", A, 2, 11)  # idempotent
    s.begin_launch("tok-b", B, 1, 12)
    s.finish_launch("tok-b", [("i-9", B)], 13)
    s.begin_terminate("term-1", ["i-9"], 14)
    s.close()
    s2 = State(p)
    open_ = s2.open_intents()
    assert [(i.token, i.kind, i.count) for i in open_] == [("tok-a", "launch", 2),
                                                          ("term-1", "terminate", 1)]
    s2.finish_terminate("term-1", 15, "scale down")
    assert [r.id for r in s2.live_instances()] == []
    assert s2.instances()[0].end_reason == "scale down"


def _crash_writer(path, ready):
    s = State(path)
    s.begin_launch("tok-crash", A, 3, 1.0)
    s.record_event(1.0, "launch-intent", offering=A)
    ready.set()
    signal.pause()


def test_committed_intent_survives_sigkill(tmp_path):
    p = tmp_path / "s.sqlite"
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_crash_writer, args=(p, ready))
    proc.start()
    assert ready.wait(20)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    s = State(p)
    assert [i.token for i in s.open_intents()] == ["tok-crash"]
    assert s.events()[0].kind == "launch-intent"


def test_draining_events_decisions_metrics(tmp_path):
    s = State(tmp_path / "s.sqlite")
    s.adopt("i-1", A, 0)
    assert s.mark_draining("i-1", 5) and not s.mark_draining("i-1", 6)
    assert s.live_instances()[0].state == "draining"
    s.record_decision(1, {A: 2, B: 0}, "cheapest")
    assert s.decisions() == [(1, {A.key: 2, B.key: 0}, "cheapest")]
    for k in range(5):
        s.record_event(k, "notice" if k % 2 else "launch", "i-1", A, f"d{k}")
    assert [e.detail for e in s.events(limit=2)] == ["d3", "d4"]
    assert len(s.events(kinds=["notice"])) == 2
    s.record_metrics(3, [("fleet", A.key, 2), ("samples_per_s", "", 100.5)])
    assert s.metric_series("samples_per_s") == [(3, "", 100.5)]
    s.set_meta("job", {"id": "x"})
    assert s.get_meta("job") == {"id": "x"} and s.get_meta("nope", 1) == 1


def test_unwritable_path_is_a_config_error(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="state_path"):
        State(tmp_path / "f" / "s.sqlite")


def _files(folder):
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_read_only_never_writes_to_the_file_it_reads(tmp_path):
    from provisioner.errors import UserError

    path = tmp_path / "s.sqlite"
    s = State(path)
    s.adopt("i-1", A, 0)
    s.set_meta("job", {"id": "x"})
    s.close()  # no daemon: no -wal file, read immutable, nothing created beside it
    before = _files(tmp_path)
    r = State.read_only(path)
    assert [i.id for i in r.live_instances()] == ["i-1"] and r.get_meta("job") == {"id": "x"}
    with pytest.raises(Exception):
        r.set_meta("job", {"id": "y"})
    r.close()
    assert _files(tmp_path) == before
    # while a daemon writes, the reader sees its rows through the shared WAL
    w = State(path)
    w.adopt("i-2", A, 1)
    main_file = _files(tmp_path)["s.sqlite"]
    r = State.read_only(path)
    assert [i.id for i in r.live_instances()] == ["i-1", "i-2"]
    r.close()
    assert _files(tmp_path)["s.sqlite"] == main_file
    w.close()
    with pytest.raises(UserError, match="no state file"):
        State.read_only(tmp_path / "none.sqlite")
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(UserError, match="not a"):
        State.read_only(tmp_path / "report.json")
    assert (tmp_path / "report.json").read_text() == "{}"
