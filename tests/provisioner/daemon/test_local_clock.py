"""The local run's simulated clock is kept in the state: a continued run goes on at the time
its workers are at (running on after a crash, from the stop after a clean one)."""

import time
from datetime import datetime, timedelta, timezone

import pytest

from provisioner.daemon.run.local import local_clock
from provisioner.daemon.state import State

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)




def test_fresh_then_crash_then_clean_stop_then_another_speed(tmp_path):
    st = State(tmp_path / "state.sqlite")
    now = local_clock(st, T0, 60, None, False)
    assert abs((now() - T0).total_seconds()) < 60  # starts at the trace's start
    saved = st.get_meta("clock")
    # the daemon was killed 10 real seconds ago (its workers went on): the clock ran on
    st.set_meta("clock", {**saved, "wall_start": saved["wall_start"] - 10})
    now = local_clock(st, T0, 60, None, True)
    assert 600 <= (now() - T0).total_seconds() < 660
    # a clean stop that terminated the fleet at T0 + 1 h: nothing ran since, it goes on there
    ended = {"t": (T0 + timedelta(hours=1)).timestamp(), "fleet_kept": False}
    now = local_clock(st, T0, 60, ended, True)
    assert 0 <= (now() - (T0 + timedelta(hours=1))).total_seconds() < 60
    # ...but with the fleet kept, it kept running
    kept = {**ended, "fleet_kept": True}
    st.set_meta("clock", {**st.get_meta("clock"), "wall_start": time.time() - 20})
    now = local_clock(st, T0, 60, kept, True)
    at = now()
    assert 1200 <= (at - T0 - timedelta(hours=1)).total_seconds() < 1300
    # another --speed: re-anchored where it is, then at the new rate
    now = local_clock(st, T0, 600, None, True)
    assert st.get_meta("clock")["speed"] == 600
    assert abs((now() - at).total_seconds()) < 600


def test_a_paced_clock_is_kept_and_goes_on_at_its_last_rate(tmp_path):
    """Issue 31.2: the paced clock (the ring below the reference) keeps its rate and machine
    factor in the state at each change: a restart goes on at that rate, a clean stop at the
    stop's time with the same factor."""
    st = State(tmp_path / "state.sqlite")
    wall = [1000.0]
    now = local_clock(st, T0, 120, None, False, lambda: wall[0], reference=3000.0)
    assert now.rate == 120 * 0.05  # nothing measured yet: the floor
    for k in range(1, 21):  # the ring trains 1,500 samples/s: half the reference
        wall[0] = 1000.0 + k * 0.5
        now.observe(1500.0 * k * 0.5)
    saved = st.get_meta("clock")
    assert saved["speed"] == now.rate and 55 < now.rate < 65 and saved["max_speed"] == 120
    at = now()
    wall[0] += 10  # the daemon died 10 s ago; its workers went on
    again = local_clock(st, T0, 120, None, True, lambda: wall[0], reference=3000.0)
    assert (again() - at).total_seconds() == pytest.approx(10 * now.rate)
    stop = {"t": (T0 + timedelta(hours=2)).timestamp(), "fleet_kept": False}
    paused = local_clock(st, T0, 120, stop, True, lambda: wall[0], reference=3000.0)
    assert paused() == T0 + timedelta(hours=2) and paused.rate == pytest.approx(now.rate)
