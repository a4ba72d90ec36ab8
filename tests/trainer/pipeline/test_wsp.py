"""The WSP gate and its measure, as pure functions."""

from __future__ import annotations

import pytest

from trainer.pipeline import wsp
from trainer.pipeline.wsp import DONE, START, WaveEvent


def test_the_gate_keeps_d_updates_in_flight() -> None:
    assert [wsp.needed_before(w, 0) for w in range(4)] == [0, 1, 2, 3]
    assert [wsp.needed_before(w, 2) for w in range(5)] == [0, 0, 0, 1, 2]
    with pytest.raises(ValueError):
        wsp.needed_before(3, -1)


def test_every_member_stops_after_the_same_wave() -> None:
    assert wsp.stop_wave(7, 0) == 7 and wsp.stop_wave(7, 2) == 9


def _events(finish: dict[int, list[float]], staleness: int) -> list[WaveEvent]:
    """Replay two VWs through the gate: VW v's wave t takes finish[v][t] seconds and may
    start once every VW finished waves < t - staleness."""
    n = len(finish[0])
    done_at: dict[tuple[int, int], float] = {}
    clock = dict.fromkeys(finish, 0.0)
    evs = []
    for t in range(n):
        for v in finish:
            gate = wsp.needed_before(t, staleness)
            ready = max([clock[v]] + [done_at[(u, gate - 1)] for u in finish if gate > 0])
            evs.append(WaveEvent(ready, v, START, t))
            clock[v] = ready + finish[v][t]
            done_at[(v, t)] = clock[v]
            evs.append(WaveEvent(clock[v], v, DONE, t))
    return evs


@pytest.mark.parametrize("staleness", [0, 1, 2, 3])
def test_a_fast_worker_runs_ahead_by_exactly_the_bound(staleness: int) -> None:
    evs = _events({0: [1.0] * 12, 1: [3.0] * 12}, staleness)
    assert wsp.max_ahead(evs) == staleness


def test_equal_workers_never_run_ahead() -> None:
    assert wsp.max_ahead(_events({0: [1.0] * 6, 1: [1.0] * 6}, 2)) == 0
