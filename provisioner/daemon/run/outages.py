"""The built-in market's job-time outages, carried out on the local fleet.

Design: the generated market (:mod:`pricing.sources.synthetic`) places its random outages in
simulated time, so how many a run meets depends on how fast this machine trains against the
clock: the same demo saw none on a fast machine (the paced clock, :mod:`pricing.sources.pace`,
now keeps simulated time in step with the job on machines up to the reference's speed, never
faster than ``--speed``). Its ``job_outages`` are placed in the JOB'S OWN TIME
instead (fractions of the run's epochs: by default a notice at 20%, a kill at 45%, a notice
at 70%), so every run of the main job meets them whatever the machine's speed.
:class:`JobTimeOutages` carries them out: each tick it reads the ring's progress, asks
:func:`pricing.sources.synthetic.next_job_outage` which one is due, picks the instance that
takes it (:func:`pick_victim`) and revokes it through the local driver, with a notice
(SIGTERM, the notice window) or without (SIGKILL), exactly as a trace's outage would; the
daemon then sees an ordinary notice or kill and drains and replaces as always.

The victim is the newest active member of the ring, and only while the ring holds at least
two (a revocation of the last holder of the job's state would test the snapshots, not the
elastic ring); until then the outage waits, and the later ones wait behind it. An outage
that has waited :data:`LATE` of the job (or past :data:`LAST_CALL`) takes the newest
instance still booting instead (spot capacity is also taken back from instances that have
not joined yet), so a short job on a machine where workers boot slowly still meets every
outage of the schedule. The number
carried out is kept in the state's meta (``job_outages_fired``), so a continued run does not
repeat them.

Rule for callers: tick from one thread (the local run's watch loop); give the run's total
epochs (``--until-epochs``): without a known length nothing is placed.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Collection, Mapping, Sequence

from pricing.sources.synthetic import JobOutage, next_job_outage

log = logging.getLogger(__name__)

META_KEY = "job_outages_fired"
#: How long (a fraction of the job) a due outage waits for a second active member before it
#: takes a booting instance instead.
LATE = 0.15
#: Past this done fraction a due outage takes a booting instance at once (the job ends soon).
LAST_CALL = 0.9


def job_progress(stats: Mapping[str, Any], total_epochs: int) -> float:
    """The job's done fraction (0..1) from the ring's stats: epochs done / total."""
    if total_epochs <= 0:
        return 0.0
    try:
        epoch = float(stats.get("epoch") or 0)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, min(1.0, epoch / total_epochs))


def pick_victim(live: Sequence[tuple[str, float]], active: Collection[str], *,
                booting: bool = False) -> str | None:
    """The instance that takes the next outage: of ``live`` (id, launch time) instances that
    are ``active`` ring members, the newest (the local driver's rule for any revocation);
    while fewer than two are, with ``booting`` the newest live instance that is not a member
    yet, else None (see the module docstring)."""
    members = [(t, iid) for iid, t in live if iid in active]
    if len(members) >= 2:
        return max(members)[1]
    others = [(t, iid) for iid, t in live if iid not in active]
    return max(others)[1] if booting and others else None


class JobTimeOutages:
    """Carries out a schedule of :class:`JobOutage` (see the module docstring)."""

    def __init__(self, schedule: Sequence[JobOutage], total_epochs: int, *,
                 stats: Callable[[], Mapping[str, Any]],
                 active: Callable[[], Collection[str]],
                 live: Callable[[], Sequence[tuple[str, float]]],
                 revoke: Callable[[str, bool, str], bool], fired: int = 0,
                 on_fired: Callable[[int], None] = lambda n: None) -> None:
        self.schedule = tuple(sorted(schedule, key=lambda o: o.at))
        self.total_epochs = total_epochs
        self._stats, self._active, self._live, self._revoke = stats, active, live, revoke
        self.fired = fired
        self._on_fired = on_fired

    def tick(self) -> JobOutage | None:
        """Carry out the outage due now, if any instance can take it; returns it when done."""
        if not self.schedule or self.total_epochs <= 0:
            return None
        stats = self._stats()
        if stats.get("finished"):
            return None
        progress = job_progress(stats, self.total_epochs)
        due = next_job_outage(self.schedule, progress, self.fired)
        if due is None:
            return None
        late = progress >= min(due.at + LATE, LAST_CALL)
        victim = pick_victim(self._live(), self._active(), booting=late)
        if victim is None:
            return None
        kind = "notice" if due.notice else "kill"
        source = f"market: job-time outage at {due.at:.0%} of the job ({kind})"
        if not self._revoke(victim, not due.notice, source):
            return None
        self.fired += 1
        self._on_fired(self.fired)
        log.info("job-time outage %d/%d: %s of %s", self.fired, len(self.schedule), kind, victim)
        return due
