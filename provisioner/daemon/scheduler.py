"""The daemon of ``provision run``: apscheduler jobs wiring source, optimiser, driver, ring.

Design: four jobs with fixed ids (``poll_prices``, ``watch_notices``, ``plan_and_reconcile``,
``record_metrics``), each ``coalesce=True, max_instances=1``, periods from ``[daemon]`` in
*simulated* seconds divided by the clock's speed. Every decision goes through the pure parts
(:func:`provisioner.plan.solve.solve`, :func:`provisioner.plan.reconcile.reconcile`); this module
only moves data between them and the outside world, writing to :class:`~provisioner.daemon.state.State`
*before* each cloud call (write-ahead intents) so a SIGKILL at any point loses nothing:

- At start (:meth:`Daemon.recover`): open launch intents are repeated with their token (the
  cloud returns the first attempt's instances), open terminations are repeated, the cloud's
  instances tagged with the job are listed and adopted when a known intent launched them,
  strays are terminated, and instances gone while the daemon was down are closed.
- A notice marks the instance draining, asks the ring's coordinator to drain it (it leaves
  at its next step boundary) and re-plans at once, so the replacement launch runs in
  parallel with the drain; the zone is avoided for ``zone_avoid_ttl_s``.
- An offering that answers "no capacity" is skipped for ``capacity_ttl_s``: the optimiser
  may keep what the offering holds but not grow it (as in a zone that just revoked), so the
  plan itself moves elsewhere instead of re-targeting it every round (the reconciler's
  redirect alone made the next plan drain the redirected instance as surplus and redirect
  again, a launch and a drain every round), and the round re-plans at once so the launch
  fails over in the same round rather than a ``plan_s`` later.
- Samples/s measured per worker flow into the :class:`~provisioner.plan.throughput.ThroughputModel`
  the next plan uses (the closed loop).

Rule for callers: build the daemon, call :meth:`Daemon.start`, and :meth:`Daemon.stop` from
the main thread (a signal handler only sets an event). The clock is injected: ``now()``
returns the simulated time; ``speed`` is simulated seconds per real second.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, Sequence

from apscheduler.schedulers.background import BackgroundScheduler

from pricing import sanity
from pricing.model import Offering, PriceQuote
from provisioner.drivers.base import (INTERRUPTION, PREEMPTED, REBALANCE, CloudDriver, can_place,
                                      LaunchRequest, Notice)
from provisioner.errors import CapacityError, DriverError, InfeasibleError
from provisioner.plan.reconcile import ChurnLimits, Held, reconcile, zone_of
from provisioner.daemon.state import Event, State
from provisioner.timing import Intervals, TtlCache

log = logging.getLogger(__name__)

JOB_IDS = ("poll_prices", "watch_notices", "plan_and_reconcile", "record_metrics")
#: Re-plans within one round after launches refused for capacity: each one adds the refused
#: offerings to the unavailable set, so the third finds a zone with room or gives up until the
#: next round (a stockout seldom spans more than a zone or two of a region).
CAPACITY_REPLANS = 2


@dataclass(frozen=True)
class Status:
    """What the dashboard and ``provision status`` show."""

    now: datetime
    fleet: Mapping[str, int]
    draining: int
    prices: Mapping[str, float]
    cost_per_hour: float
    spend: float
    samples_per_s: float | None
    progress: Mapping[str, Any]
    events: tuple[Event, ...]
    plan: str = ""
    workers: Mapping[str, float] = field(default_factory=dict)


def intervals_from(settings: Any) -> Intervals:
    """The :class:`Intervals` of a ``[daemon]`` settings section."""
    d = settings.daemon
    return Intervals(price_poll_s=d.price_poll_s, notice_poll_s=d.notice_poll_s, plan_s=d.plan_s,
                     metrics_s=d.metrics_s, zone_avoid_ttl_s=d.zone_avoid_ttl_s,
                     capacity_ttl_s=d.capacity_ttl_s, drain_timeout_s=d.drain_timeout_s)


class Daemon:
    """The provisioning loop of one job (see the module docstring)."""

    def __init__(self, settings: Any, driver: CloudDriver, source: Any, state: State, *,
                 now: Callable[[], datetime], speed: float = 1.0,
                 intervals: Intervals | None = None, coordinator: Any = None,
                 throughput: Any = None, metrics: Any = None,
                 launch_env: Mapping[str, str] | None = None) -> None:
        from provisioner.plan.throughput import ThroughputModel

        self.settings = settings
        self.job_id: str = settings.job.id
        self.driver = driver
        self.source = source
        self.state = state
        self.now = now
        self.speed = speed
        self.intervals = intervals or intervals_from(settings)
        self.coordinator = coordinator
        self.throughput = throughput or ThroughputModel(priors=settings.job.throughput_priors,
                                                        unit=settings.job.samples_per_s_per_unit)
        self.metrics = metrics
        self.launch_env = dict(launch_env or {})
        self.limits = ChurnLimits(settings.daemon.max_launches_per_round,
                                  settings.daemon.max_removals_per_round)
        self._lock = threading.RLock()
        self.avoid: TtlCache[tuple[str, str, str]] = TtlCache(self.intervals.zone_avoid_ttl_s,
                                                               self._ts)
        self.unavailable: TtlCache[Offering] = TtlCache(self.intervals.capacity_ttl_s, self._ts)
        self.quotes: list[PriceQuote] = []
        self.available: dict[Offering, int] = {}
        self.lifetimes: tuple = ()
        self.plan_text = ""
        self._last_targets: dict[Offering, int] | None = None
        self.stopping = threading.Event()
        self.scheduler: BackgroundScheduler | None = None
        self.notice_to_launch_s: list[float] = []  # real seconds, notice seen -> launch call
        self._pending_notice: float | None = None
        self._hist_i: int | None = None
        self._rejected = 0
        self._ring_seen = 0
        self.errors: list[str] = []

    def _ts(self) -> float:
        return self.now().timestamp()

    # -- start and stop ----------------------------------------------------------------------
    def start(self) -> None:
        """Recover, take a first price view and plan, then start the scheduled jobs."""
        self.state.set_meta("job", {"id": self.job_id, "driver": getattr(self.driver, "name", ""),
                                    "speed": self.speed})
        if self.state.get_meta("started_at") is None:
            self.state.set_meta("started_at", self._ts())
        self.recover()
        self.poll_prices()
        self.plan_and_reconcile("start")
        self.record_metrics()
        sched = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1,
                                                  "misfire_grace_time": None})
        iv = self.intervals
        for job_id, fn, period in (("poll_prices", self.poll_prices, iv.price_poll_s),
                                   ("watch_notices", self.watch_notices, iv.notice_poll_s),
                                   ("plan_and_reconcile", self.plan_and_reconcile, iv.plan_s),
                                   ("record_metrics", self.record_metrics, iv.metrics_s)):
            sched.add_job(self._guarded(job_id, fn), "interval", id=job_id,
                          seconds=iv.real(period, self.speed), replace_existing=True)
        sched.start()
        self.scheduler = sched
        self.state.record_event(self._ts(), "started", detail=f"driver {self.driver.name}")

    def _guarded(self, name: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            if self.stopping.is_set():
                return
            try:
                fn()
            except Exception as exc:  # a failed round must not stop the daemon
                log.exception("job %s failed", name)
                self.errors.append(f"{name}: {exc}")
                self.state.record_event(self._ts(), "error", detail=f"{name}: {exc}")
        return run

    def stop(self, on_exit: str = "keep") -> None:
        """Stop launching, stop the jobs, and keep or terminate (after draining) the fleet."""
        self.stopping.set()
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=True)
            self.scheduler = None
        with self._lock:
            if on_exit == "terminate":
                live = self.state.live_instances()
                if self.coordinator is not None:
                    for r in live:
                        self.coordinator.drain(r.id, "daemon exit")
                self._terminate([r.id for r in live], "daemon exit (--on-exit terminate)")
            self.record_metrics()
            self.state.record_event(self._ts(), "stopped", detail=f"on exit: {on_exit}")

    # -- recovery ----------------------------------------------------------------------------
    def recover(self) -> None:
        """Finish open intents, adopt the job's instances, terminate strays (see module doc)."""
        t = self._ts()
        for intent in self.state.open_intents():
            if intent.kind == "launch" and intent.offering is not None:
                try:
                    res = self.driver.launch(LaunchRequest(intent.offering, intent.count,
                                                           self.job_id, intent.token,
                                                           self.launch_env))
                except (CapacityError, DriverError) as exc:
                    self.state.abandon_intent(intent.token, t, f"failed after restart: {exc}")
                    continue
                self.state.finish_launch(intent.token, [(i.id, i.offering) for i in res.instances],
                                         t, "finished after restart")
                self.state.record_event(t, "recovered-launch", detail=f"{intent.token}: "
                                        f"{len(res.instances)} instances")
            elif intent.kind == "terminate":
                self.driver.terminate(list(intent.instance_ids))
                self.state.finish_terminate(intent.token, t, "terminated after restart")
        known_tokens = {i.token for i in self.state.intents()}
        known_ids = {iid for i in self.state.intents() for iid in i.instance_ids}
        live = {r.id: r for r in self.state.live_instances()}
        cloud = self.driver.list(self.job_id)
        strays = []
        for inst in cloud:
            if inst.id in live:
                continue
            if inst.tags.get("token") in known_tokens or inst.id in known_ids:
                self.state.adopt(inst.id, inst.offering, t, inst.tags.get("token"))
                self.state.record_event(t, "adopted", inst.id, inst.offering)
            else:
                strays.append(inst.id)
        if strays:
            self._terminate(strays, "stray: tagged with the job but launched by no known intent")
        seen = {i.id for i in cloud}
        for iid in live:
            if iid not in seen:
                self.state.end_instance(iid, t, "gone while the daemon was down")
                self.state.record_event(t, "gone", iid, live[iid].offering)

    # -- jobs --------------------------------------------------------------------------------
    def poll_prices(self) -> None:
        """Fetch the source's view now; record price changes (for spend and the report)."""
        now = self.now()
        snap = self.source.fetch(now=now)
        max_age = timedelta(hours=self.settings.optimizer.max_quote_age_hours)
        quotes, rejected = sanity.check(snap.quotes, now=now, max_age=max_age)
        quotes = [q for q in quotes if can_place(self.driver, q.offering)]
        if rejected and len(rejected) != self._rejected:
            self._rejected = len(rejected)
            self.state.record_event(now.timestamp(), "quotes-rejected", detail=", ".join(
                f"{k} {v}" for k, v in sanity.summarize(rejected).items()))
        with self._lock:
            self.quotes = quotes
            self.available = {a.offering: a.available for a in snap.availability}
            self.lifetimes = snap.lifetimes
        for q in self._history_since(now):  # every change between polls, so spend is exact
            self._record_quote(q)
        for off, (when, price) in sorted(self._price_points().items()):
            self.state.record_price(off, when, price)

    def _history_since(self, now: datetime) -> list[PriceQuote]:
        history = getattr(getattr(self.source, "history", None), "quotes", None)
        if not history:
            return []
        import bisect

        if self._hist_i is None:
            self._hist_i = bisect.bisect_right([q.time for q in history], now)
            return []
        start = self._hist_i
        while self._hist_i < len(history) and history[self._hist_i].time <= now:
            self._hist_i += 1
        return list(history[start:self._hist_i])

    def _record_quote(self, q: PriceQuote) -> None:
        self.state.record_price(q.offering, q.time.timestamp(), q.price_per_hour)
        if q.offering.market == "spot" and q.on_demand_per_hour:
            self.state.record_price(q.offering.with_market("on-demand"), q.time.timestamp(),
                                    q.on_demand_per_hour)

    def _price_points(self) -> dict[Offering, tuple[float, float]]:
        """Price per offering now, with the time it took effect; a spot quote carrying its
        on-demand price also prices the on-demand offering (as the optimiser reads it)."""
        out: dict[Offering, tuple[float, float]] = {}
        for q in self.quotes:
            out[q.offering] = (q.time.timestamp(), q.price_per_hour)
        for q in self.quotes:
            od = q.offering.with_market("on-demand")
            if q.offering.market == "spot" and q.on_demand_per_hour and od not in out:
                out[od] = (q.time.timestamp(), q.on_demand_per_hour)
        return out

    def watch_notices(self) -> None:
        """Handle the driver's notices: drain first, replace in parallel."""
        replan = False
        for n in self.driver.notices():
            replan |= self._on_notice(n)
        if replan:
            self.plan_and_reconcile("notice")

    def _on_notice(self, n: Notice) -> bool:
        t = self._ts()
        rows = {r.id: r for r in self.state.live_instances()}
        row = rows.get(n.instance_id)
        if row is None:
            return False
        off = row.offering
        if n.kind == REBALANCE:
            self.state.record_event(t, "rebalance", n.instance_id, off, n.source)
            return False
        if n.kind == INTERRUPTION:
            if not self.state.mark_draining(n.instance_id, t):
                return False
            self.avoid.add(zone_of(off))
            self._pending_notice = time.monotonic()
            self.state.record_event(t, "notice", n.instance_id, off, n.source)
            if self.metrics is not None:
                self.metrics.revocations.labels("notice").inc()
            if self.coordinator is not None:
                self.coordinator.drain(n.instance_id, "revocation notice")
            return True
        # PREEMPTED or TERMINATED: it is gone
        was_draining = row.draining_since is not None
        self.driver.terminate([n.instance_id])
        self.state.end_instance(n.instance_id, t, f"{n.kind}: {n.source}")
        if n.kind == PREEMPTED:
            self.avoid.add(zone_of(off))
            self._pending_notice = time.monotonic()
            self.state.record_event(t, "killed", n.instance_id, off, n.source)
            if self.metrics is not None:
                self.metrics.revocations.labels("kill").inc()
        else:
            self.state.record_event(t, "left" if was_draining else "exited", n.instance_id, off,
                                    n.source)
        return not was_draining

    def plan_and_reconcile(self, reason: str = "periodic") -> None:
        """Solve for the target fleet and apply the reconciler's actions; when a launch is
        refused for capacity, plan again at once (up to :data:`CAPACITY_REPLANS` times)."""
        for attempt in range(CAPACITY_REPLANS + 1):
            if not self._plan_round(reason if attempt == 0 else f"{reason}; capacity failover",
                                    final=attempt == CAPACITY_REPLANS):
                return

    def _plan_round(self, reason: str, final: bool = True) -> bool:
        """One solve and its actions; True when a launch was refused for capacity. The plan is
        recorded as a decision after its actions, unless a launch was refused and a re-plan
        follows (``final`` false): the log holds one decision per round, the one acted on."""
        if self.stopping.is_set():
            return False
        from provisioner.plan.build import build_problem
        from provisioner.plan.solve import solve

        if self._job_over():
            return False  # the job is over: nothing to launch or replace
        with self._lock:
            now = self.now()
            t = now.timestamp()
            self._drain_backstop(t)
            live = self.state.live_instances()
            current = Counter(r.offering for r in live if r.draining_since is None)
            avoid = self.avoid.members()
            unavailable = self.unavailable.members()
            caps = dict(self.available)
            for off in unavailable:  # out of capacity: keep what it holds, no more
                caps[off] = min(caps.get(off, current[off]), current[off])
            try:
                problem = build_problem(self.settings, self.quotes, self._risks(),
                                        current=current, throughput=self.throughput, now=now,
                                        avoid=[f"{r}/{z}" for _c, r, z in avoid],
                                        available=caps)
                plan = solve(problem, time_limit_s=self.settings.optimizer.time_limit_s)
            except InfeasibleError as exc:
                self.state.record_event(t, "plan-failed", detail=str(exc))
                return False
            targets = {o: n for o, n in plan.counts.items() if n > 0}
            held = [Held(r.id, r.offering, r.launched_at, True, r.draining_since is not None)
                    for r in live]
            prices = {o: p for o, (_t, p) in self._price_points().items()}
            alternatives = sorted(prices, key=lambda o: (prices[o], o))
            actions = reconcile(targets, held, avoid_zones=avoid, unavailable=unavailable,
                                alternatives=alternatives, limits=self.limits)
            for note in actions.notes:
                self.state.record_event(t, "reconcile-note", detail=note)
            if actions.terminations:
                self._terminate([r.instance_id for r in actions.terminations],
                                actions.terminations[0].reason)
            for d in actions.drains:
                self._drain(d.instance_id, d.offering, d.reason)
            refused = False
            for launch in actions.launches:
                refused |= not self._launch(launch.offering, launch.count, launch.reason, prices)
            if targets != self._last_targets and (final or not refused):
                self.plan_text = plan.explain()
                self.state.record_decision(t, targets, f"{reason}: {self.plan_text}")
                self._last_targets = targets
            return refused

    def _job_over(self) -> bool:
        """True once the ring finished, or a member left because the job is complete (the
        others are finishing the same last step: replacing them would only cost money)."""
        if self.coordinator is None:
            return False
        if self.coordinator.stats().get("finished"):
            return True
        events = getattr(self.coordinator, "events", lambda: [])()
        return any(e.get("kind") == "leave" and str(e.get("detail", "")).startswith("finished")
                   for e in events)

    def _risks(self) -> Mapping[Offering, Any]:
        try:
            from pricing.risk import estimate
        except ImportError:
            return {}
        offerings = {q.offering for q in self.quotes}
        return estimate(offerings, self.lifetimes)

    def _drain_backstop(self, t: float) -> None:
        late = [r.id for r in self.state.live_instances() if r.draining_since is not None
                and t - r.draining_since >= self.intervals.drain_timeout_s]
        if late:
            self._terminate(late, "drain timeout")

    def _drain(self, instance_id: str, offering: Offering, reason: str) -> None:
        t = self._ts()
        if not self.state.mark_draining(instance_id, t):
            return
        self.state.record_event(t, "drain", instance_id, offering, reason)
        if self.coordinator is None or not self.coordinator.drain(instance_id, reason):
            self._terminate([instance_id], f"{reason} (not in the ring)")

    def _terminate(self, ids: Sequence[str], reason: str) -> None:
        if not ids:
            return
        t = self._ts()
        token = f"term-{uuid.uuid4().hex[:12]}"
        self.state.begin_terminate(token, ids, t)
        self.driver.terminate(list(ids))
        self.state.finish_terminate(token, self._ts(), reason)
        for iid in ids:
            self.state.record_event(self._ts(), "terminated", iid, detail=reason)

    def _launch(self, offering: Offering, count: int, reason: str,
                prices: Mapping[Offering, float]) -> bool:
        """Launch through the driver with a write-ahead intent; False when refused for
        capacity (the offering joins :attr:`unavailable`), True otherwise."""
        if self.stopping.is_set():
            return True
        t = self._ts()
        token = f"{self.job_id}-{uuid.uuid4().hex[:16]}"
        self.state.begin_launch(token, offering, count, t)
        if self._pending_notice is not None:
            self.notice_to_launch_s.append(time.monotonic() - self._pending_notice)
            self._pending_notice = None
        try:
            res = self.driver.launch(LaunchRequest(offering, count, self.job_id, token,
                                                   self.launch_env))
        except CapacityError as exc:
            self.unavailable.add(offering)
            self.state.abandon_intent(token, self._ts(), f"no capacity: {exc}")
            self.state.record_event(self._ts(), "no-capacity", offering=offering, detail=str(exc))
            return False
        except DriverError as exc:
            self.state.abandon_intent(token, self._ts(), f"failed: {exc}")
            self.state.record_event(self._ts(), "launch-failed", offering=offering,
                                    detail=str(exc))
            return True
        t = self._ts()
        if offering in prices:
            self.state.record_price(offering, t, prices[offering])
        self.state.finish_launch(token, [(i.id, i.offering) for i in res.instances], t)
        for inst in res.instances:
            self.state.record_event(t, "launch", inst.id, inst.offering, reason)
        for err in res.errors:
            self.state.record_event(t, "launch-error", offering=offering, detail=err)
        return True

    def record_metrics(self) -> None:
        """Fleet, cost, spend and samples/s: to the state, Prometheus and the throughput model."""
        st = self.status(events=0)
        t = st.now.timestamp()
        rows: list[tuple[str, str, float]] = [("fleet", k, n) for k, n in st.fleet.items()]
        rows += [("fleet_total", "", sum(st.fleet.values())), ("cost_per_hour", "", st.cost_per_hour),
                 ("spend", "", st.spend)]
        held = {Offering.from_key(k) for k in st.fleet}
        rows += [("price", o.key, p) for o, p in ((Offering.from_key(k), v)
                                                   for k, v in st.prices.items()) if o in held]
        if st.samples_per_s is not None:
            rows.append(("samples_per_s", "", st.samples_per_s))
        for key in ("samples_done", "epoch", "accuracy", "steps_lost"):
            v = st.progress.get(key)
            if isinstance(v, (int, float)):
                rows.append((key, "", float(v)))
        self.state.record_metrics(t, rows)
        if self.metrics is not None:
            self.metrics.update(st.fleet, st.cost_per_hour, st.spend, st.samples_per_s)
        self._observe_throughput(st.workers)
        self._copy_ring_events(t)

    def _copy_ring_events(self, t: float) -> None:
        """Membership events of the ring (joins, drains, losses) into the state's time line."""
        if self.coordinator is None or not hasattr(self.coordinator, "events"):
            return
        events = self.coordinator.events()
        for e in events[self._ring_seen:]:
            self.state.record_event(t, f"ring-{e.get('kind')}", e.get("name") or None,
                                    detail=str(e.get("detail", "")))
        self._ring_seen = len(events)

    def _observe_throughput(self, workers: Mapping[str, float]) -> None:
        by_type: dict[str, list[float]] = defaultdict(list)
        offering = {r.id: r.offering for r in self.state.live_instances()}
        for name, sps in workers.items():
            if name in offering and sps > 0:
                by_type[offering[name].instance_type].append(sps)
        with self._lock:
            for itype, values in sorted(by_type.items()):
                self.throughput = self.throughput.observe(itype, sum(values) / len(values))

    def status(self, events: int = 8) -> Status:
        """A consistent view for the dashboard (no cloud calls)."""
        now = self.now()
        t = now.timestamp()
        live = self.state.live_instances()
        fleet = Counter(r.offering.key for r in live if r.draining_since is None)
        prices = {o.key: p for o, (_t, p) in self._price_points().items()}
        cost = sum(prices.get(r.offering.key, self.state.price_at(r.offering, t) or 0.0)
                   for r in live)
        workers: dict[str, float] = {}
        progress: dict[str, Any] = {}
        sps = None
        if self.coordinator is not None:
            for m in self.coordinator.members():
                workers[m.name] = float(m.samples_per_s or 0.0)
            progress = dict(self.coordinator.stats())
            sps = sum(workers.values())
        return Status(now, dict(fleet), sum(1 for r in live if r.draining_since is not None),
                      prices, cost, self.state.spend(t), sps, progress,
                      tuple(self.state.events(limit=events)) if events else (), self.plan_text,
                      workers)
