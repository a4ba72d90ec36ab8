"""The daemon of ``provision run``: four apscheduler jobs over the daemon's parts.

Design: four jobs with fixed ids (``poll_prices``, ``watch_notices``, ``plan_and_reconcile``,
``record_metrics``), each ``coalesce=True, max_instances=1``, periods from ``[daemon]`` in
*simulated* seconds divided by the clock's speed. The jobs only move data between the parts
the composition root (:func:`provisioner.daemon.wiring.build_daemon`) gave it:

- :class:`~provisioner.daemon.loop.market.Market`: the last good prices and availability;
- :class:`~provisioner.plan.pipeline.Planner`: THE decision, the same the simulator runs;
- :class:`~provisioner.daemon.loop.actuator.WriteAheadActuator`: every cloud call behind an
  intent, notices, the capacity and zone caches, the cloud workers' exit reports (each round,
  before the join deadline's backstop: a failed boot ends at once); the plan is carried out by
  :func:`provisioner.plan.reconcile.apply_round` (launches first, nothing removed while a
  replacement is refused; a refusal plans again at once, up to :data:`CAPACITY_REPLANS`);
- :func:`~provisioner.daemon.loop.recovery.recover`: what a restart finishes and adopts;
- :class:`~provisioner.daemon.loop.telemetry.Telemetry`: metrics, the closed throughput loop.

A notice drains first and re-plans at once, so the replacement launch runs in parallel
with the drain. Progress for a deadline objective is the ring's ``samples_done`` since the
job started (``started_at`` in the state).

Rule for callers: build with :func:`provisioner.daemon.wiring.build_daemon`, call
:meth:`Daemon.start`, and :meth:`Daemon.stop` from the main thread (a signal handler only
sets an event). ``now()`` returns the simulated time; ``speed`` is simulated seconds per
real second.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Callable

from apscheduler.schedulers.background import BackgroundScheduler

from pricing.model import Offering
from provisioner.config import Settings
from provisioner.daemon.loop.actuator import WriteAheadActuator
from provisioner.daemon.loop.market import Market
from provisioner.daemon.ports import PriceFeed, RingCoordinator
from provisioner.daemon.loop.recovery import recover
from provisioner.daemon.state import DiskFull, EventKind, State, is_disk_full
from provisioner.daemon.view.status import Status, build_status
from provisioner.daemon.loop.telemetry import Telemetry
from provisioner.drivers.base import CloudDriver, Notice
from provisioner.errors import InfeasibleError
from provisioner.plan.mode import PASSED, ModeChoice, run_mode
from provisioner.plan.pipeline import FleetView, Planner, Progress
from provisioner.plan.reconcile import ChurnLimits, Held, RoundInput, apply_round
from provisioner.timing import Intervals

log = logging.getLogger(__name__)

JOB_IDS = ("poll_prices", "watch_notices", "plan_and_reconcile", "record_metrics")
#: Re-plans within one round after launches refused for capacity: each one adds the refused
#: offerings to the unavailable set, so the third finds a zone with room or gives up until the
#: next round (a stockout seldom spans more than a zone or two of a region).
CAPACITY_REPLANS = 2


def intervals_from(settings: Settings) -> Intervals:
    """The :class:`Intervals` of a ``[daemon]`` settings section."""
    d = settings.daemon
    return Intervals(price_poll_s=d.price_poll_s, notice_poll_s=d.notice_poll_s, plan_s=d.plan_s,
                     metrics_s=d.metrics_s, zone_avoid_ttl_s=d.zone_avoid_ttl_s,
                     capacity_ttl_s=d.capacity_ttl_s, drain_timeout_s=d.drain_timeout_s,
                     join_deadline_s=d.join_deadline_s)


class Daemon:
    """The provisioning loop of one job (see the module docstring)."""

    def __init__(self, settings: Settings, driver: CloudDriver, source: PriceFeed,
                 state: State, *, now: Callable[[], datetime], speed: float,
                 intervals: Intervals, market: Market, planner: Planner,
                 actuator: WriteAheadActuator, telemetry: Telemetry,
                 coordinator: RingCoordinator | None, stopping: threading.Event) -> None:
        self.settings = settings
        self.job_id: str = settings.job.id
        self.driver = driver
        self.source = source
        self.state = state
        self.now = now
        self.speed = speed
        self.intervals = intervals
        self.market = market
        self.planner = planner
        self.actuator = actuator
        self.telemetry = telemetry
        self.coordinator = coordinator
        self.stopping = stopping
        self.limits = ChurnLimits(settings.daemon.max_launches_per_round,
                                  settings.daemon.max_removals_per_round)
        self._lock = threading.RLock()
        self.plan_text = ""
        self._last_targets: dict[Offering, int] | None = None
        self._rejected: dict[str, int] = {}
        self.scheduler: BackgroundScheduler | None = None
        self.errors: list[str] = []
        self._pending: dict[str, Notice] = {}  # notices whose handling failed: tried again
        self.mode: ModeChoice | None = None  # the run's training mode, fixed at its first plan

    def _fix_mode(self, plan: Any, t: float) -> None:
        """Fix the run's training mode from its first plan (:func:`run_mode`), for good."""
        choice = run_mode(self.settings.job.mode, self.driver.name, plan)
        self.state.set_meta("training_mode", dataclasses.asdict(choice))
        self.state.record_event(t, EventKind.MODE, detail=f"{choice.mode}: {choice.reason}")
        self._use_mode(choice)

    def _use_mode(self, choice: ModeChoice) -> None:
        """Every launch from now on carries ``choice`` (SPOTRING_MODE, the groups)."""
        self.mode = choice
        if choice.mode in PASSED:
            self.actuator.launch_env["SPOTRING_MODE"] = choice.mode
        self.actuator.groups = dict(choice.groups) if choice.mode == "hybrid" else {}

    def _ts(self) -> float:
        return self.now().timestamp()

    @property
    def throughput(self) -> Any:
        return self.telemetry.throughput

    @property
    def notice_to_launch_s(self) -> list[float]:
        return self.actuator.notice_to_launch_s

    # -- start and stop ----------------------------------------------------------------------
    def start(self) -> None:
        """Recover, take a first price view and plan, then start the scheduled jobs."""
        self.state.set_meta("job", {"id": self.job_id, "driver": self.driver.name,
                                    "speed": self.speed})
        if self.state.get_meta("started_at") is None:
            self.state.set_meta("started_at", self._ts())
        self.telemetry.begin()
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
        self.state.record_event(self._ts(), EventKind.STARTED, detail=f"driver {self.driver.name}")

    def _guarded(self, name: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            if self.stopping.is_set():
                return
            try:
                fn()
            except Exception as exc:  # a failed round must not stop the daemon
                if is_disk_full(exc):
                    self._disk_full(name, exc)
                    return
                log.exception("job %s failed", name)
                self.errors.append(f"{name}: {exc}")
                try:
                    self.state.record_event(self._ts(), EventKind.ERROR,
                                            detail=f"{name}: {exc}")
                except DiskFull:
                    pass
        return run

    def _disk_full(self, job: str, exc: Exception) -> None:
        """A round skipped for a full disk: no traceback, nothing recorded (there is no room);
        the job runs again at its next period. The state says it once per pause, whether its
        own write or a driver's file found no space."""
        if not isinstance(exc, DiskFull):
            self.state.pause(exc)
        log.debug("job %s skipped: %s", job, exc)

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
                self.actuator.terminate_ids([r.id for r in live],
                                            "daemon exit (--on-exit terminate)")
            self.record_metrics()
            self.state.record_event(self._ts(), EventKind.STOPPED, detail=f"on exit: {on_exit}")

    def recover(self) -> None:
        """Finish open intents, adopt the job's instances, terminate strays. A continued
        run keeps the training mode its workers train in (launches included)."""
        saved = self.state.get_meta("training_mode")
        if self.mode is None and saved:
            self._use_mode(ModeChoice(**saved))
        recover(self.job_id, self.driver, self.state, self.actuator, self._ts())

    # -- the four jobs -----------------------------------------------------------------------
    def poll_prices(self) -> None:
        """Fetch the source's view now; record price changes (for spend and the report)."""
        now = self.now()
        self.market.poll(now)
        rejected = self.market.rejected
        if rejected and rejected != self._rejected:
            self._rejected = dict(rejected)
            self.state.record_event(now.timestamp(), EventKind.QUOTES_REJECTED, detail=", ".join(
                f"{k} {v}" for k, v in rejected.items()))
        for q in self.market.changes_since(now):  # every change between polls: exact spend
            self.state.record_price(q.offering, q.time.timestamp(), q.price_per_hour)
            if q.offering.market == "spot" and q.on_demand_per_hour:
                self.state.record_price(q.offering.with_market("on-demand"), q.time.timestamp(),
                                        q.on_demand_per_hour)
        for off, (when, price) in sorted(self.market.price_points().items()):
            self.state.record_price(off, when, price)

    @property
    def quotes(self) -> list:
        return self.market.quotes

    def watch_notices(self) -> None:
        """Handle the driver's notices: drain first, replace in parallel. A notice whose
        handling found the disk full is kept and handled again at the next round: a driver
        reports each notice once, and one lost would leave its instance "live" in the state
        for good (never replaced). Then release the draining instances whose workers left."""
        replan = False
        for n in self.driver.notices():
            self._pending[f"{n.instance_id}/{n.kind}"] = n
        for key, n in list(self._pending.items()):
            try:
                replan |= self.actuator.on_notice(n)
            except Exception as exc:
                if not is_disk_full(exc):
                    del self._pending[key]  # another failure: said once, not retried
                raise
            del self._pending[key]
        self.actuator.release_left()
        if replan:
            self.plan_and_reconcile("notice")

    def plan_and_reconcile(self, reason: str = "periodic") -> None:
        """Decide the target fleet (:class:`Planner`) and carry it out through
        :func:`apply_round`. The plan is recorded as a decision once per round, the one
        acted on."""
        if self.stopping.is_set() or self._job_over():
            return
        with self._lock:
            self.actuator.drain_backstop(self.intervals.drain_timeout_s)
            self.actuator.watch_boots()  # failed boots and job errors: ended before they bill
            self.actuator.join_backstop(self.intervals.join_deadline_s, self.speed)
            if self.actuator.job_error is not None:
                return  # the job fails on every worker: nothing to launch (the run ends)
            decided: list[tuple[str, dict[Offering, int]]] = []

            def plan(attempt: int) -> RoundInput | None:
                given = self._decide()
                if given is None:
                    return None
                decided.append(given[1:])  # type: ignore[arg-type]
                return given[0]

            result = apply_round(plan, self.actuator, limits=self.limits,
                                 replans=CAPACITY_REPLANS)
            if result is None or not decided:
                return
            t = self._ts()
            for note in result.actions.notes:
                self.state.record_event(t, EventKind.RECONCILE_NOTE, detail=note)
            text, targets = decided[-1]
            if targets != self._last_targets:
                self.plan_text = text
                why = reason + ("; capacity failover" if result.plans > 1 else "")
                self.state.record_decision(t, targets, f"{why}: {text}")
                self._last_targets = targets

    def _decide(self) -> tuple[RoundInput, str, dict[Offering, int]] | None:
        """One decision of the planner over the views of now; None when it failed."""
        now = self.now()
        t = now.timestamp()
        live = self.state.live_instances()
        ages: dict[Offering, list[float]] = {}  # seconds since each held one's launch
        for r in live:
            if r.draining_since is None:
                ages.setdefault(r.offering, []).append(t - r.launched_at)
        current = Counter({o: len(a) for o, a in ages.items()})
        act = self.actuator
        avoid = act.avoid.members()
        unavailable = act.unavailable.members()
        caps = {o: min(self.market.available.get(o, current[o]), current[o])
                for o in unavailable}  # out of capacity: keep what it holds, no more
        rebalance = {Offering.from_key(e.offering): datetime.fromtimestamp(e.t, timezone.utc)
                     for e in self.state.events(limit=50, kinds=[EventKind.REBALANCE])
                     if e.offering}  # recommendations: a hazard input (pricing.risk)
        market = self.market.view(self.telemetry.throughput, now, caps, rebalance)
        blocked = frozenset(o for o in market.prices if (o.cloud, o.region, o.zone) in avoid)
        until: dict[Offering, float] = {}  # when each may grow again
        for o in blocked | unavailable:
            ends = [u for u in (act.avoid.expiry((o.cloud, o.region, o.zone)),
                                act.unavailable.expiry(o)) if u is not None]
            if ends:
                until[o] = max(ends)
        fleet = FleetView(held=dict(current), blocked=blocked, failed=dict(act.failed),
                          ages={o: tuple(a) for o, a in ages.items()}, blocked_until=until)
        try:
            decision = self.planner.decide(market, fleet, self._progress(t), t)
        except InfeasibleError as exc:
            self.state.record_event(t, EventKind.PLAN_FAILED, detail=str(exc))
            return None
        if self.mode is None and decision.plan is not None:
            self._fix_mode(decision.plan, t)
        targets = {o: n for o, n in decision.target.items() if n > 0}
        held = [Held(r.id, r.offering, r.launched_at, True, r.draining_since is not None)
                for r in live]
        prices = {o: p for o, (_t, p) in self.market.price_points().items()}
        act.prices = prices
        return (RoundInput(targets, held, avoid_zones=avoid, unavailable=unavailable,
                           alternatives=sorted(prices, key=lambda o: (prices[o], o))),
                decision.explain(), targets)

    def _progress(self, t: float) -> Progress:
        """The job's progress for the planner, from its goal (the planner's input,
        :func:`provisioner.plan.objective.planner_input`): the ring's samples done since
        the job's start and the spend so far."""
        started = float(self.state.get_meta("started_at") or t)
        done = 0.0
        if self.coordinator is not None:
            done = float(self.coordinator.stats().get("samples_done") or 0.0)
        goal = self.planner.goal
        spent = self.state.spend(t) if goal.budget_usd is not None else 0.0
        return goal.progress(started, done, spent=spent)

    def _job_over(self) -> bool:
        """True once the ring says the job ended (done, lost or failed: its ``outcome`` is
        no longer ``running``) or is completing (a member finished its last step): nothing to
        launch or replace (a member that finished and exited is not a loss to make up)."""
        if self.coordinator is None:
            return False
        stats = self.coordinator.stats()
        return (bool(stats.get("finished")) or bool(stats.get("completing"))
                or stats.get("outcome", "running") != "running")

    def record_metrics(self) -> None:
        """Fleet, cost, spend and samples/s: to the state, Prometheus and the throughput model."""
        self.telemetry.record(self.status(events=0))

    def status(self, events: int = 8) -> Status:
        """A consistent view for the dashboard (no cloud calls)."""
        prices = {o: p for o, (_t, p) in self.market.price_points().items()}
        return build_status(self.now(), self.state, prices, self.coordinator, self.plan_text,
                            events)
