"""The paced replay clock (issue 31.2): the rate is a pure decision, tested as data; driven by
a fake ring on a fake wall clock, the built-in market's outages land at the same job step
whatever the machine's speed; the clock is monotonic and goes on where a saved one was."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pricing.sources import synthetic
from pricing.sources.pace import MIN_WINDOW_S, Pace, PacedClock, from_saved, pace_rate, smooth

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
REF = 2000.0  # samples/s at which the clock runs at speed
BATCH = 64
FLOOR = 0.1  # the least fraction of speed in these tests
BOOT_S = 10.0  # a worker's boot on the reference machine (the torch import)


@pytest.mark.parametrize("pace, factor, rate", [
    (Pace(120, 0.0), 0.3, 120),        # no reference: a plain replay at speed
    (Pace(120, REF, FLOOR), None, 12),        # nothing measured yet: the floor (0.1)
    (Pace(120, REF, FLOOR), 1.0, 120),        # the reference machine: speed
    (Pace(120, REF, FLOOR), 2.5, 120),        # faster than the reference: never above speed
    (Pace(120, REF, FLOOR), 0.5, 60),         # half as fast: half the rate
    (Pace(120, REF, FLOOR), 0.0, 12),         # a stalled ring: the floor, the market goes on
    (Pace(120, REF, 0.25), 0.2, 30),   # another floor
    (Pace(120, REF, FLOOR), float("nan"), 12),
])
def test_rate_as_data(pace, factor, rate):
    assert pace_rate(pace, factor) == pytest.approx(rate)


def test_bad_pace_is_refused():
    for bad in (dict(speed=0), dict(speed=float("inf")), dict(speed=1, reference=-1),
                dict(speed=1, floor=0), dict(speed=1, floor=1.5)):
        with pytest.raises(ValueError):
            Pace(**bad)


def test_smooth_moves_towards_the_sample_by_wall_time():
    assert smooth(None, 3.0, 1.0) == 3.0
    assert 1.0 < smooth(1.0, 2.0, 1.0) < smooth(1.0, 2.0, 10.0) < 2.0


class Wall:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def market_times(hours: float) -> list[datetime]:
    """When the built-in market (1 outage per offering per hour, seed 7) changes what is
    available: the moments a revocation can land."""
    snap = synthetic.generate(synthetic.GeneratorParams(seed=7, outages_per_hour=1.0,
                                                        horizon_s=hours * 3600))
    return sorted({a.time for a in snap.availability if T0 < a.time < T0 + timedelta(hours=hours)})


def run(machine: float, events: list[datetime], *, boot_s: float = BOOT_S,
        stall_at: int = 40_000) -> tuple[list[int], float]:
    """A ring on a machine ``machine`` times as fast as the reference: it boots (``boot_s /
    machine`` wall seconds, nothing trained), trains at ``REF x machine`` samples/s, and once
    past ``stall_at`` samples stalls for a replacement's boot (again ``boot_s / machine``).
    Returns the step at which the clock passes each of ``events`` (beyond the first boot),
    and the simulated seconds the stall took."""
    wall = Wall()
    clock = PacedClock(T0, wall(), Pace(120, REF, FLOOR), wall=wall)
    samples, dt = 0.0, 0.25
    stepped: list[int] = []
    pending = list(events)
    boot_until = wall.t + boot_s / machine
    stall_until: float | None = None  # set once, when the stall begins
    stalled_sim = 0.0
    while pending:
        wall.t += dt
        before = clock()
        if stall_until is None and samples >= stall_at:
            stall_until = wall.t + boot_s / machine
        stalled = stall_until is not None and wall.t <= stall_until
        training = wall.t > boot_until and not stalled
        if training:
            samples += REF * machine * dt
        clock.observe(samples, training=training)
        now = clock()
        assert now >= before  # monotonic
        if stalled:
            stalled_sim += (now - before).total_seconds()
        while pending and pending[0] <= now:
            pending.pop(0)
            stepped.append(int(samples // BATCH))
    return stepped, stalled_sim


def test_the_market_lands_at_the_same_step_whatever_the_machine_speed():
    """Issue 31.2: on the reference machine and on machines 2x and 4x slower (a loaded
    laptop), each of the market's availability changes in the first hours lands within a
    few percent of the same job step; the stall of a replacement's boot costs the same
    simulated time (the machine factor is held while the ring does not train)."""
    events = market_times(3.0)[:16]
    assert len(events) >= 6, events
    ref_steps, ref_stall = run(1.0, events)
    for machine in (0.5, 0.25):
        steps, stall = run(machine, events)
        assert len(steps) == len(ref_steps)
        # the first boot and the first measurement window, before anything was measured, are
        # charged at the floor (pace.py): their longer wall time here shifts every event by
        # at most the same few steps, once; besides it, each lands at the reference's step
        # within 5%
        first = ((BOOT_S / machine - BOOT_S) * FLOOR + (1 - machine) * MIN_WINDOW_S) * REF / BATCH
        shift = ref_steps[0] - steps[0]
        assert 0 <= shift <= 1.25 * first + 4, (machine, shift, first)
        for got, want in zip(steps, ref_steps):
            assert abs(got - want) <= 0.05 * want + shift + 2, (machine, steps, ref_steps)
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        ref_gaps = [b - a for a, b in zip(ref_steps, ref_steps[1:])]
        assert sum(gaps) == pytest.approx(sum(ref_gaps), rel=0.03), (gaps, ref_gaps)
        assert stall == pytest.approx(ref_stall, rel=0.1), (machine, stall, ref_stall)
    # the old clock (no pacing) puts them at a quarter of the steps on the slow machine
    wall = Wall()
    plain = PacedClock(T0, wall(), Pace(120, 0.0), wall=wall)
    wall.t += 3600 / 120
    assert plain() == T0 + timedelta(hours=1)


def test_a_stalled_ring_does_not_freeze_the_market():
    wall = Wall()
    clock = PacedClock(T0, wall(), Pace(120, REF, FLOOR), wall=wall)
    for _ in range(40):  # trains at the reference, then stops while still a member
        wall.t += 0.5
        clock.observe(REF * (wall.t - 1000.0), training=True)
    assert clock.rate == pytest.approx(120, rel=0.05)
    stuck = REF * (wall.t - 1000.0)
    for _ in range(200):
        wall.t += 0.5
        clock.observe(stuck, training=True)
    assert clock.rate == pytest.approx(12, rel=0.03)  # the floor (re-anchored within 2%)
    before = clock()
    wall.t += 10
    assert (clock() - before).total_seconds() == pytest.approx(120, rel=0.03)


def test_saved_and_restored_goes_on_where_it_was():
    wall = Wall()
    kept: list[dict] = []
    clock = PacedClock(T0, wall(), Pace(120, REF, FLOOR), wall=wall, on_anchor=kept.append)
    for _ in range(20):
        wall.t += 0.5
        clock.observe(REF * 0.5 * (wall.t - 1000.0), training=True)
    assert kept and kept[-1]["speed"] == clock.rate < 120
    wall.t += 7.0  # the daemon dies; its workers go on; a new one starts from the state
    again = from_saved(kept[-1], wall=wall)
    assert again() == clock() and again.rate == clock.rate and again.factor == kept[-1]["factor"]
    # another --speed: re-anchored where it is, then at the new pace
    faster = from_saved(kept[-1], speed=240, wall=wall)
    assert faster() == clock() and faster.rate == pytest.approx(2 * clock.rate, rel=0.05)
    # a plain replay clock's record (older states) goes on at its speed
    old = from_saved({"trace_start": T0.isoformat(), "wall_start": wall.t - 10, "speed": 60},
                     wall=wall)
    assert old() == T0 + timedelta(seconds=600) and old.rate == 60
