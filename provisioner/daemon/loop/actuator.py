"""The write-ahead actuator: every cloud call of the daemon, each behind an intent row.

Design: implements :class:`provisioner.plan.reconcile.Actuator` over a
:class:`~provisioner.drivers.base.CloudDriver`, writing to
:class:`~provisioner.daemon.state.State` *before* each call (a launch intent carries the
idempotency token the driver passes to the cloud) and after it, so a SIGKILL at any point
loses nothing (:mod:`provisioner.daemon.loop.recovery` finishes what it finds open). It also
answers notices: an interruption marks the instance draining, asks the ring to drain it and
avoids its zone; a preemption ends it. Offerings refused for capacity go into
:attr:`WriteAheadActuator.unavailable`, zones that revoked into :attr:`avoid` (TTL caches
whose periods live in :mod:`provisioner.timing`). Cloud workers' exit reports (a failed boot,
a worker unit that failed: :mod:`provisioner.drivers.shiplog`) end their instance at once
(:meth:`WriteAheadActuator.watch_boots`): a boot failure counts against its offering as a
refusal for capacity does; a job error stops every launch of the run (:attr:`job_error`).

Rule: call from the scheduler's jobs under the daemon's lock; ``stopping`` set means no
more launches.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Callable, Mapping, Sequence

from pricing.model import Offering
from provisioner.daemon.ports import MetricsSink, RingCoordinator
from provisioner.daemon.state import EventKind, State
from provisioner.drivers.base import CloudDriver, LaunchRequest, Notice, NoticeKind
from provisioner.drivers.identity import (by_instance, drain_instance, formed_names,
                                          holds_the_ring_alone, instance_of, left)
from provisioner.drivers.shiplog import Failure, ShippedLogs, explain, last_error
from provisioner.errors import CapacityError, DriverError
from provisioner.plan.reconcile import Launch, Removal, zone_of
from provisioner.timing import Intervals, TtlCache, join_deadline

log = logging.getLogger(__name__)


class WriteAheadActuator:
    """Launches, drains and terminations of one job (see the module docstring)."""

    def __init__(self, job_id: str, driver: CloudDriver, state: State, clock: Callable[[], float],
                 intervals: Intervals, *, coordinator: RingCoordinator | None = None,
                 metrics: MetricsSink | None = None,
                 launch_env: Mapping[str, str] | None = None,
                 stopping: threading.Event | None = None,
                 logs: ShippedLogs | None = None) -> None:
        self.job_id = job_id
        self.driver = driver
        self.state = state
        self.clock = clock
        self.coordinator = coordinator
        self.metrics = metrics
        self.launch_env = dict(launch_env or {})
        self.groups: dict[str, str] = {}  # offering key -> the hybrid group (SPOTRING_ZONE)
        self.stopping = stopping or threading.Event()
        self.avoid: TtlCache[tuple[str, str, str]] = TtlCache(intervals.zone_avoid_ttl_s, clock)
        self.unavailable: TtlCache[Offering] = TtlCache(intervals.capacity_ttl_s, clock)
        self.failed: dict[Offering, float] = {}  # offering -> its last revocation or refusal
        self.prices: Mapping[Offering, float] = {}  # set by the scheduler before a round
        self.notice_to_launch_s: list[float] = []  # real seconds, notice seen -> launch call
        self._pending_notice: float | None = None
        self.logs = logs  # the cloud workers' shipped lines and exit reports (None: local)
        self.job_error: str | None = None  # set by watch_boots: no launch succeeds until fixed

    def env_for(self, offering: Offering) -> dict[str, str]:
        """The environment of a launch of ``offering``: the run's, and its hybrid group."""
        group = self.groups.get(offering.key)
        return {**self.launch_env, **({"SPOTRING_ZONE": group} if group else {})}

    # -- the reconciler's verbs ----------------------------------------------------------------
    def launch(self, launch: Launch) -> bool:
        """Launch with a write-ahead intent; False when refused for capacity (the offering
        joins :attr:`unavailable`)."""
        if self.stopping.is_set() or self.job_error is not None:
            return True
        offering = launch.offering
        token = f"{self.job_id}-{uuid.uuid4().hex[:16]}"
        self.state.begin_launch(token, offering, launch.count, self.clock())
        if self._pending_notice is not None:
            self.notice_to_launch_s.append(time.monotonic() - self._pending_notice)
            self._pending_notice = None
        try:
            res = self.driver.launch(LaunchRequest(offering, launch.count, self.job_id, token,
                                                   self.env_for(offering)))
        except CapacityError as exc:
            self.unavailable.add(offering)
            self.failed[offering] = self.clock()
            self.state.abandon_intent(token, self.clock(), f"no capacity: {exc}")
            self.state.record_event(self.clock(), EventKind.NO_CAPACITY, offering=offering,
                                    detail=str(exc))
            return False
        except DriverError as exc:
            self.state.abandon_intent(token, self.clock(), f"failed: {exc}")
            self.state.record_event(self.clock(), EventKind.LAUNCH_FAILED, offering=offering,
                                    detail=str(exc))
            return True
        t = self.clock()
        if offering in self.prices:
            self.state.record_price(offering, t, self.prices[offering])
        self.state.finish_launch(token, [(i.id, i.offering) for i in res.instances], t)
        for inst in res.instances:
            self.state.record_event(t, EventKind.LAUNCH, inst.id, inst.offering, launch.reason)
        for err in res.errors:
            self.state.record_event(t, EventKind.LAUNCH_ERROR, offering=offering, detail=err)
        return True

    def terminate(self, removals: Sequence[Removal]) -> None:
        if removals:
            self.terminate_ids([r.instance_id for r in removals], removals[0].reason)

    def drain(self, removal: Removal) -> None:
        """Mark draining and ask the ring to let it go at a step boundary; an instance not
        in the ring is terminated at once. One whose workers alone hold the ring's state
        waits (a later round drains it) until a replacement has joined: draining it now
        would empty the ring."""
        t = self.clock()
        if self.coordinator is not None and holds_the_ring_alone(
                removal.instance_id, self.coordinator.members(),
                [r.id for r in self.state.live_instances() if r.draining_since is not None]):
            self.state.record_event(t, EventKind.RECONCILE_NOTE, removal.instance_id,
                                    removal.offering, f"{removal.reason}: kept until a "
                                    f"replacement joins (its workers hold the ring alone)")
            return
        if not self.state.mark_draining(removal.instance_id, t):
            return
        self.state.record_event(t, EventKind.DRAIN, removal.instance_id, removal.offering,
                                removal.reason)
        if self.coordinator is None or not drain_instance(self.coordinator, removal.instance_id,
                                                          removal.reason):
            self.terminate_ids([removal.instance_id], f"{removal.reason} (not in the ring)")

    # -- more verbs ----------------------------------------------------------------------------
    def terminate_ids(self, ids: Sequence[str], reason: str) -> None:
        """Terminate with a write-ahead intent."""
        if not ids:
            return
        token = f"term-{uuid.uuid4().hex[:12]}"
        self.state.begin_terminate(token, ids, self.clock())
        self.driver.terminate(list(ids))
        self.state.finish_terminate(token, self.clock(), reason)
        for iid in ids:
            self.state.record_event(self.clock(), EventKind.TERMINATED, iid, detail=reason)

    def release_left(self) -> None:
        """Terminate each draining instance none of whose workers is in the ring any more
        (nor in its newest formed generation: the others no longer step with them): it is
        paid for until its workers left, not until the drain timeout."""
        if self.coordinator is None:
            return
        draining = [r.id for r in self.state.live_instances() if r.draining_since is not None]
        if draining:
            gone = left(draining, [m.name for m in self.coordinator.members()],
                        formed_names(self.coordinator.events()))
            if gone:
                self.terminate_ids(gone, "its workers left the ring")

    def drain_backstop(self, drain_timeout_s: float) -> None:
        """Terminate instances draining for longer than ``drain_timeout_s``, except those
        whose workers the ring keeps (``kept``: the last holders of the state, until a
        joiner holds it or their notice window ends)."""
        t = self.clock()
        kept = set(by_instance(m.name for m in self.coordinator.members()
                               if getattr(m, "kept", False))) if self.coordinator else set()
        late = [r.id for r in self.state.live_instances() if r.draining_since is not None
                and t - r.draining_since >= drain_timeout_s and r.id not in kept]
        if late:
            self.terminate_ids(late, "drain timeout")

    def join_backstop(self, deadline_s: float, speed: float = 1.0) -> list[str]:
        """Terminate each live instance none of whose workers joined the ring within the
        run's join deadline (:func:`provisioner.timing.join_deadline`: ``deadline_s``, or 3x
        the slowest boot measured, at least 5 real minutes at ``speed``) of its launch: a
        boot that failed or a worker that cannot reach the coordinator is not paid for until
        the run ends. Its offering is
        skipped for ``capacity_ttl_s`` and counted as failed, so the planner launches
        elsewhere. Returns the ids terminated (none without a coordinator to ask)."""
        if self.coordinator is None or self.stopping.is_set():
            return []
        t = self.clock()
        live = [r for r in self.state.live_instances() if r.draining_since is None]
        first: dict[str, float] = {}
        for e in self.state.events(kinds=["ring-join"]):
            if e.instance_id:
                first.setdefault(instance_of(e.instance_id), e.t)
        joined = set(first) | self._in_ring()
        launched = {r.id: r.launched_at for r in self.state.instances()}
        boots = [first[i] - launched[i] for i in first
                 if i in launched and first[i] >= launched[i]]
        deadline = join_deadline(deadline_s, boots, speed)
        late = [r for r in live if r.id not in joined and t - r.launched_at >= deadline]
        for r in late:
            self.state.record_event(t, EventKind.JOIN_DEADLINE, r.id, r.offering,
                                    f"none of its workers joined the ring within {deadline:.0f} s "
                                    f"of its launch (daemon.join_deadline_s); "
                                    + self._boot_tail(r.id))
            self.unavailable.add(r.offering)
            self.failed[r.offering] = t
        if late:
            self.terminate_ids([r.id for r in late],
                               f"never joined the ring within {deadline:.0f} s")
        return [r.id for r in late]

    def _boot_tail(self, instance_id: str) -> str:
        """The last lines its boot shipped, for an event (or where its boot log is)."""
        lines: list[str] = []
        if self.logs is not None:
            try:
                lines = self.logs.tail(instance_id)
            except Exception as exc:  # noqa: BLE001 - the store's own errors: said, not fatal
                return f"its shipped boot log could not be read ({type(exc).__name__}: {exc})"
        if not lines:
            return "no boot log lines were shipped (its boot log is on the instance)"
        return "last lines of its boot log:\n" + "\n".join(lines)

    def _in_ring(self) -> set[str]:
        """The instances with a worker in the ring now (none without a coordinator)."""
        if self.coordinator is None:
            return set()
        return set(by_instance(m.name for m in self.coordinator.members()))

    def watch_boots(self) -> list[str]:
        """Read the exit reports of the live instances whose workers have not all joined
        (:mod:`provisioner.drivers.shiplog`) and end each instance that shipped one at once:
        a ``boot-failed`` event with the exit code, its line of the docs table and the last
        lines, then terminated. A boot failure of the offering's image or capacity counts as
        a refusal for capacity (:attr:`unavailable` for ``capacity_ttl_s``, :attr:`failed`:
        the planner's blocked-offering path); a job error (the user's code: a worker's exit 2,
        a boot's exit 20 or 30-32) sets :attr:`job_error` and a ``job-error`` event: no more launches.
        Returns the ids terminated."""
        if self.logs is None or self.stopping.is_set():
            return []
        t = self.clock()
        members = self._in_ring()
        ended: list[str] = []
        for r in self.state.live_instances():
            if r.draining_since is not None or r.id in members:
                continue
            try:
                reports = self.logs.reports(r.id)
            except Exception as exc:  # noqa: BLE001 - the store's own errors: the round goes
                log.warning("exit reports of %s unreadable now: %s", r.id, exc)  # on
                continue
            if not reports:
                continue
            lines = [f"{rep.unit}: {ln}" for rep in reports for ln in rep.lines]
            detail = "; ".join(explain(rep) for rep in reports)
            self.state.record_event(t, EventKind.BOOT_FAILED, r.id, r.offering,
                                    f"{detail}; last lines:\n" + "\n".join(lines[-20:]))
            if any(rep.failure is Failure.JOB for rep in reports):
                if self.job_error is None:
                    self.job_error = (f"the job failed on {r.id} ({detail}): "
                                      f"{last_error([ln for rep in reports for ln in rep.lines])}"
                                      f"; no more launches: fix the job and start the run again")
                    self.state.record_event(t, EventKind.JOB_ERROR, r.id, r.offering,
                                            self.job_error)
            else:
                self.unavailable.add(r.offering)
                self.failed[r.offering] = t
            ended.append(r.id)
            self.terminate_ids([r.id], detail.split(";")[0])
        return ended

    def on_notice(self, n: Notice) -> bool:
        """Handle one notice: drain first, the replacement planned in parallel. True when
        the fleet lost capacity (plan again now)."""
        t = self.clock()
        row = {r.id: r for r in self.state.live_instances()}.get(n.instance_id)
        if row is None:
            return False
        off = row.offering
        if n.kind == NoticeKind.REBALANCE:  # elevated risk: leave now, at a step boundary, so
            # a reclaim that follows with no other notice costs no step
            self.state.record_event(t, EventKind.REBALANCE, n.instance_id, off, n.source)
        if n.kind in (NoticeKind.INTERRUPTION, NoticeKind.REBALANCE):
            if not self.state.mark_draining(n.instance_id, t):
                return False
            self._revoked(off, t, "notice" if n.kind == NoticeKind.INTERRUPTION else "rebalance")
            self.state.record_event(t, EventKind.NOTICE, n.instance_id, off, n.source)
            if self.coordinator is not None:
                drain_instance(self.coordinator, n.instance_id, "revocation notice")
            return True
        # PREEMPTED or TERMINATED: it is gone
        was_draining = row.draining_since is not None
        self.driver.terminate([n.instance_id])
        self.state.end_instance(n.instance_id, t, f"{n.kind}: {n.source}")
        if n.kind == NoticeKind.PREEMPTED:
            self._revoked(off, t, "kill")
            self.state.record_event(t, EventKind.KILLED, n.instance_id, off, n.source)
        else:
            self.state.record_event(t, EventKind.LEFT if was_draining else EventKind.EXITED,
                                    n.instance_id, off, n.source)
        return not was_draining

    def _revoked(self, off: Offering, t: float, kind: str) -> None:
        self.avoid.add(zone_of(off))
        self.failed[off] = t
        self._pending_notice = time.monotonic()
        if self.metrics is not None:
            self.metrics.revocations.labels(kind).inc()
