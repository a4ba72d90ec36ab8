"""What members tell each other when a generation forms, the per-layer profile, the emulated
layers, and the GPU profile's script run small on the CPU."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from trainer.pipeline import emulate, profile, virtual_workers
from trainer.pipeline import table as tb
from trainer.pipeline.partition import Holding

REPO = Path(__file__).resolve().parents[3]


def test_a_row_travels_exactly_through_the_table() -> None:
    row = tb.Row(123.25, math.inf, 2, 5, 17, 19, 18, 20, False, (1, 0), 7, (0, 2, 5),
                 (0.1, 0.2, 0.3, 0.4, 0.5), (8.0, 8.0, 4.0, 4.0, 1.0))
    other = tb.Row(50.0, 16e9)
    table = torch.stack([tb.encode(row, 2, 5), tb.encode(other, 2, 5)])
    got = tb.decode(table, 2, 5)
    assert got[0] == row and got[1] == other


def test_the_agreed_wave_and_who_can_reach_it() -> None:
    rows = [tb.Row(1.0, lo=0, hi=3, step=10, reach=12, agreed=11, started=12, fresh=False),
            tb.Row(1.0, lo=3, hi=6, step=10, reach=10, agreed=10, started=11, fresh=False),
            tb.Row(1.0, step=9, agreed=9, started=12, fresh=False),  # a spare
            tb.Row(1.0, agreed=99)]  # a joiner: its numbers mean nothing
    wave = tb.agreed_wave(rows)
    assert wave == 11
    assert tb.holding(0, rows[0], wave) == Holding(0, 0, 3, 11)  # rolls forward
    assert tb.holding(1, rows[1], wave) == Holding(1, 3, 6, -1)  # kept no pack: behind
    assert tb.holding(2, rows[2], wave) == Holding(2, 0, 0, 11)  # knows every wave's size
    assert tb.holding(3, rows[3], wave) == Holding(3)


def test_the_hint_and_the_costs_come_from_one_member_the_same_everywhere() -> None:
    rows = [tb.Row(1.0), tb.Row(1.0, layout_gen=4, bounds=(0, 1, 3), seconds=(1.0, 2.0, 3.0),
                                act=(1.0, 1.0, 1.0)),
            tb.Row(1.0, layout_gen=5, bounds=(0, 2, 3), seconds=(9.0, 9.0, 9.0),
                   act=(2.0, 2.0, 2.0))]
    assert tb.hint(rows) == (0, 2, 3)  # the newest layout
    costs = tb.costs(rows, [10.0, 20.0, 30.0])
    assert costs is not None and costs.seconds == (1.0, 2.0, 3.0)  # the lowest rank's
    assert costs.param_bytes == (10.0, 20.0, 30.0)


def test_emulated_layers_sleep_or_tally_once(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []  # the sleeps asked for, not the wall clock (the host is shared)
    monkeypatch.setattr(emulate.time, "sleep", slept.append)
    layer = emulate.SleepyLayer(4, 0.01)
    x = torch.randn(2, 4, requires_grad=True)
    with emulate.deferred() as owed:
        layer(x).sum().backward()
        assert slept == []  # tallied, not slept
        assert owed() == pytest.approx(0.02 + 0.04)  # forward 10 ms/sample, backward 2x
    layer(x).sum().backward()
    assert sum(slept) == pytest.approx(0.06)  # outside: it sleeps


def test_the_profile_hooks_time_each_layer_then_go_away() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), emulate.SleepyLayer(8, 0.002),
                                torch.nn.Linear(8, 2))
    settings = virtual_workers(model, stages=2, micro_batch=4)
    assert settings.stages == 2
    for _ in range(3):  # what the worker's profiling steps do (the fastest counts)
        model(torch.randn(5, 4))
    got = profile.costs(model)
    assert got is not None
    seconds, act = got
    assert seconds[1] >= 3 * 0.002 and seconds[1] > 2 * max(seconds[0], seconds[2])
    assert act == [8 * 4, 8 * 4, 2 * 4]  # output bytes per sample
    assert not model[1]._forward_hooks and not model[1]._forward_pre_hooks  # detached
    assert profile.costs(model) == got  # remembered (a later membership of the worker)
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert len(profile.measure(m2, torch.randn(3, 4))[0]) == 2


def _load(name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_gpt2_small_flops_put_a_quarter_in_the_head() -> None:
    prof = _load("pipeline_profile")
    layers = prof.flops_profile()  # type: ignore[attr-defined]
    assert len(layers) == 26 and layers[-1]["name"] == "head"
    share = layers[-1]["seconds"] / sum(x["seconds"] for x in layers)
    assert 0.2 < share < 0.35


def test_the_gpu_profile_script_runs_small_on_the_cpu(tmp_path: Path) -> None:
    prof = _load("pipeline_profile")
    out = tmp_path / "p.json"
    assert prof.main(["--out", str(out), "--device", "cpu", "--blocks", "1",  # type: ignore
                      "--width", "32", "--heads", "2", "--seq", "16", "--vocab", "64",
                      "--micro", "2", "--repeats", "1", "--stages", "2"]) == 0
    got = json.loads(out.read_text())
    assert [x["name"].split(":")[1] for x in got["layers"]] == ["Embed", "Attention", "MLP",
                                                                "Head"]
    assert all(x["seconds"] > 0 for x in got["layers"]) and len(got["stage_move_s"]) == 2
