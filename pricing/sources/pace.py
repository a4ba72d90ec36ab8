"""A replay clock paced by the job: simulated time never runs ahead of what the ring trains.

Design. A :class:`~pricing.sources.trace.ReplayClock` maps wall time to simulated time at a
fixed ``speed``, so everything charged in simulated time (the market's random outages per
simulated hour, the spend, a worker's boot) follows the WALL clock: a slower or loaded
machine trains fewer samples per simulated hour and so meets a harsher market and a higher
bill for the same job (issue 31.2: 31-52 notices and $64-142 where a quiet machine met 4 and
$8.62). :class:`PacedClock` runs at

    rate = speed x clamp(factor, floor, 1),   factor = smoothed(measured / reference)

where ``reference`` is the ring's samples/s of the job on a quiet reference machine (the
demo's config carries it, measured by ``benchmarks/demo.py``) and ``measured`` the ring's
samples/s here (the coordinator's ``samples_done`` over wall time). On the reference machine
(or a faster one) the rate is ``speed``, as before; on a machine three times slower it is a
third of it, so a simulated hour holds the same samples and the same market on any machine.
The rate is decided by one pure function, :func:`pace_rate`, tested as data.

Choices, and why:

- The factor is a property of the MACHINE, not of the moment: it is measured only while the
  ring trains and HELD while it does not (every member booting, a ring re-forming after a
  loss). So a worker's boot (the torch import, which a loaded machine slows as much as it
  slows the steps) is charged in simulated seconds at the same machine factor: boots cost the
  same simulated time on any machine. Before the first measurement the factor is ``floor``
  (nothing has trained yet: the market waits for the job rather than racing its first boot).
- ``floor`` (a fraction of ``speed``) keeps a stalled or very slow ring from freezing the
  market: notice windows, deadlines and the duration limit still pass.
- Never above ``speed``: a machine faster than the reference replays at ``speed``, as
  ``--speed`` promised (the job's time then runs slower than the market, as it always did).
- Smoothing is an exponential moving average over wall time (:data:`SMOOTH_S`), so one slow
  step or a re-form does not jerk the clock; ``samples_done`` going backwards (a ring resumed
  from a snapshot) restarts the measurement, it is no negative throughput.
- Monotonic: a rate change re-anchors the clock where it is (``anchor_sim`` at ``anchor_wall``,
  then ``rate`` per wall second), and no reading is below the previous one even if the wall
  clock steps back. Each re-anchor calls ``on_anchor`` with :meth:`PacedClock.saved`, which
  the local run keeps in its state, so a restarted daemon (or ``provision down``) goes on at
  the simulated time its workers are at, at the last rate (:func:`from_saved`).

Rule for callers: read the clock from any thread (``clock()`` returns an aware datetime);
feed it from ONE thread with :meth:`PacedClock.observe` (the ring's ``samples_done``) a few
times a second. A ``reference`` of 0 disables pacing: the clock is a plain replay at ``speed``.
"""

from __future__ import annotations

import math
import threading
import time as _time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

from pricing.model import utc

__all__ = ["Pace", "pace_rate", "smooth", "PacedClock", "from_saved", "SMOOTH_S", "MIN_WINDOW_S"]

#: Time constant (wall seconds) of the throughput's moving average: several steps of the
#: example even on a loaded machine, short against a revocation's consequences (a boot, 10 s+).
SMOOTH_S = 5.0
#: The shortest wall interval one throughput measurement spans (steps are discrete: shorter
#: windows see 0 or 2 steps and jitter).
MIN_WINDOW_S = 1.0
#: A rate change smaller than this fraction does not re-anchor (nor write the state).
RATE_EPS = 0.02


@dataclass(frozen=True)
class Pace:
    """How a clock follows the job: at most ``speed`` simulated seconds per wall second; at
    ``speed`` when the ring trains ``reference`` samples/s or more; never below ``floor x
    speed``. ``reference`` 0: no pacing (always ``speed``)."""

    speed: float
    reference: float = 0.0
    floor: float = 0.05

    def __post_init__(self) -> None:
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"Pace.speed={self.speed!r}: must be a finite number > 0")
        if not (math.isfinite(self.reference) and self.reference >= 0):
            raise ValueError(f"Pace.reference={self.reference!r}: must be a finite number >= 0")
        if not 0 < self.floor <= 1:
            raise ValueError(f"Pace.floor={self.floor!r}: must be in (0, 1]")


def pace_rate(pace: Pace, factor: float | None) -> float:
    """Simulated seconds per wall second for the machine ``factor`` (smoothed measured /
    reference throughput; None: not measured yet). See the module docstring: ``speed`` without
    a reference, else ``speed x clamp(factor, floor, 1)`` (``floor`` while unmeasured)."""
    if pace.reference <= 0:
        return pace.speed
    f = pace.floor if factor is None or not math.isfinite(factor) else factor
    return pace.speed * min(1.0, max(pace.floor, f))


def smooth(previous: float | None, sample: float, dt: float, tau: float = SMOOTH_S) -> float:
    """The exponential moving average over wall time: ``sample`` measured over ``dt`` seconds
    moves ``previous`` by ``1 - exp(-dt / tau)`` of the way (the first sample is taken as is)."""
    if previous is None:
        return sample
    w = 1.0 - math.exp(-max(dt, 0.0) / tau)
    return previous + w * (sample - previous)


class PacedClock:
    """Simulated time paced by the ring's throughput (see the module docstring)."""

    def __init__(self, anchor_sim: datetime, anchor_wall: float, pace: Pace, *,
                 factor: float | None = None, wall: Callable[[], float] = _time.time,
                 on_anchor: Callable[[dict[str, Any]], None] = lambda saved: None) -> None:
        self.pace = pace
        self._wall = wall
        self._on_anchor = on_anchor
        self._lock = threading.Lock()
        self._anchor_sim = utc(anchor_sim)
        self._anchor_wall = float(anchor_wall)
        self.factor = factor
        self.rate = pace_rate(pace, factor)
        self._last = self._anchor_sim
        self._seen: tuple[float, float] | None = None  # (wall, samples) where a window began
        self._on_anchor(self.saved())

    def __call__(self) -> datetime:
        """Simulated time now (monotonic)."""
        w = self._wall()
        with self._lock:
            t = self._anchor_sim + timedelta(seconds=(w - self._anchor_wall) * self.rate)
            if t < self._last:
                return self._last
            self._last = t
            return t

    def saved(self) -> dict[str, Any]:
        """What the state keeps (``trace_start``/``wall_start``/``speed`` as a
        :class:`~pricing.sources.trace.ReplayClock` reads them: the anchor and the current
        rate), plus the pace and the factor."""
        return {"trace_start": self._anchor_sim.isoformat(), "wall_start": self._anchor_wall,
                "speed": self.rate, "max_speed": self.pace.speed,
                "reference": self.pace.reference, "floor": self.pace.floor,
                "factor": self.factor}

    def observe(self, samples_done: float | None, *, training: bool = True) -> float:
        """Feed the ring's ``samples_done`` (None or ``training`` False: the ring does not
        train now, the factor is held). Returns the rate in force."""
        if self.pace.reference <= 0:
            return self.rate
        w = self._wall()
        if samples_done is None or not training:
            self._seen = None
            return self.rate
        if self._seen is None or samples_done < self._seen[1] or w < self._seen[0]:
            self._seen = (w, float(samples_done))
            return self.rate
        dt = w - self._seen[0]
        if dt < MIN_WINDOW_S:
            return self.rate
        measured = (samples_done - self._seen[1]) / dt
        self._seen = (w, float(samples_done))
        factor = smooth(self.factor, measured / self.pace.reference, dt)
        self._set(factor, w)
        return self.rate

    def _set(self, factor: float, w: float) -> None:
        rate = pace_rate(self.pace, factor)
        with self._lock:
            self.factor = factor
            if abs(rate - self.rate) <= RATE_EPS * self.rate:
                return
            now = self._anchor_sim + timedelta(seconds=(w - self._anchor_wall) * self.rate)
            self._anchor_sim, self._anchor_wall = max(now, self._last), w
            self.rate = rate
            saved = self.saved()
        self._on_anchor(saved)


def from_saved(saved: Mapping[str, Any], *, speed: float | None = None,
               reference: float | None = None, floor: float | None = None,
               wall: Callable[[], float] = _time.time,
               on_anchor: Callable[[dict[str, Any]], None] = lambda saved: None) -> PacedClock:
    """The clock a state kept (:meth:`PacedClock.saved`; a plain replay clock's
    ``trace_start``/``wall_start``/``speed`` too), going on at its anchor and last rate.
    ``speed``/``reference``/``floor`` given: the new pace (the clock re-anchored where it is
    now when it changes)."""
    rate = float(saved["speed"])
    old = Pace(float(saved.get("max_speed") or rate), float(saved.get("reference") or 0.0),
               float(saved.get("floor") or Pace.floor))
    factor = saved.get("factor")
    anchor_sim = datetime.fromisoformat(saved["trace_start"])
    anchor_wall = float(saved["wall_start"])
    new = Pace(old.speed if speed is None else speed,
               old.reference if reference is None else reference,
               old.floor if floor is None else floor)
    w = wall()
    if new != old or not math.isclose(pace_rate(old, factor), rate, rel_tol=1e-9):
        # re-anchored where it is now, at the new pace's rate
        anchor_sim = utc(anchor_sim) + timedelta(seconds=(w - anchor_wall) * rate)
        anchor_wall = w
    return PacedClock(anchor_sim, anchor_wall, new,
                      factor=None if factor is None else float(factor), wall=wall,
                      on_anchor=on_anchor)
