"""Telemetry: metrics rows, Prometheus, the closed throughput loop, the ring's events.

Prometheus gets, beside the status: the savings (the status's
:class:`~provisioner.daemon.view.savings.Savings`, the dashboard's and report's own figures),
each member's samples/s, the steps lost (:func:`provisioner.daemon.outcome.totals`, the
report's own figure) and each formed generation's switch time (the ring's ``formed`` events).

Design: :meth:`Telemetry.record` takes one :class:`~provisioner.daemon.view.status.Status` and
writes it to the state's metrics table and to Prometheus, feeds each worker type's measured
samples/s into the :class:`~provisioner.plan.throughput.ThroughputModel` the next plan
reads (the closed loop), and copies the ring's membership events into the time line. It
also keeps the ring's :class:`~provisioner.daemon.outcome.Ledger` (the figures carried across
coordinator lives: a daemon restart starts a new coordinator) and the ring's last stats in
the state's meta (``ledger``, ``ring``), so a restarted daemon and ``provision status`` read
where the ring was.

The job's own metrics (what its ``evaluate`` returns: accuracy, mse, r2, ...) are recorded
each time they change, with the step, epoch and run time they were measured at (the
``job_metrics`` meta, ``job_metric`` rows per name, ``spotring_job_metric{name}``), so the
dashboard, ``provision status``, the report and Prometheus all show them.

Rule: the throughput model is replaced, never mutated (it is immutable); read it through
:attr:`Telemetry.throughput`.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from typing import Any, Mapping

from pricing.model import Offering
from provisioner.daemon.outcome import Ledger, advance, restarted, totals
from provisioner.daemon.ports import MetricsSink, RingCoordinator
from provisioner.daemon.state import State, ring_kind
from provisioner.daemon.view.status import Status
from provisioner.drivers.identity import per_instance
from provisioner.plan.throughput import ThroughputModel


class Telemetry:
    def __init__(self, state: State, throughput: ThroughputModel, *,
                 coordinator: RingCoordinator | None = None,
                 metrics: MetricsSink | None = None, speed: float = 1.0) -> None:
        self.state = state
        self.speed = speed  # the run's seconds per real second
        self.throughput = throughput
        self.coordinator = coordinator
        self.metrics = metrics
        self._lock = threading.Lock()
        self._ring_seen = 0
        self.ledger = Ledger()
        self.measured: dict[str, Any] | None = None  # the job's metrics as last recorded

    def begin(self) -> None:
        """At the daemon's start: a ledger found in the state means a new coordinator for a
        run that had one (see :func:`provisioner.daemon.outcome.restarted`)."""
        if self.coordinator is None:
            return
        found = self.state.get_meta("ledger")
        self.ledger = restarted(Ledger.from_meta(found)) if found else Ledger()
        self.state.set_meta("ledger", self.ledger.as_meta())
        self.measured = self.state.get_meta("job_metrics")

    def record(self, st: Status) -> None:
        """Fleet, cost, spend, samples/s and progress: to the state and Prometheus."""
        t = st.now.timestamp()
        rows: list[tuple[str, str, float]] = [("fleet", k, n) for k, n in st.fleet.items()]
        rows += [("fleet_total", "", sum(st.fleet.values())),
                 ("cost_per_hour", "", st.cost_per_hour), ("spend", "", st.spend)]
        held = {Offering.from_key(k) for k in st.fleet}
        rows += [("price", o.key, p) for o, p in ((Offering.from_key(k), v)
                                                   for k, v in st.prices.items()) if o in held]
        if st.samples_per_s is not None:
            rows.append(("samples_per_s", "", st.samples_per_s))
        for key in ("samples_done", "epoch", "step", "accuracy", "steps_lost"):
            v = st.progress.get(key)
            if isinstance(v, (int, float)):
                rows.append((key, "", float(v)))
        measured = self.job_metrics(st.progress, t)
        # what lives in memory first (Prometheus, the throughput model): a full disk pauses
        # the state's writes below, not the figures a scrape or the next plan reads
        if self.metrics is not None:
            self.metrics.update(st.fleet, st.cost_per_hour, st.spend, st.samples_per_s)
            if st.savings is not None:
                self.metrics.update_savings(st.savings.spend_usd, st.savings.on_demand_usd,
                                            st.savings.checkpoint_restart_usd)
            lost = (totals(self.ledger, st.progress, st.spend)["steps_lost"]
                    if self.coordinator is not None and st.progress else None)
            epoch = st.progress.get("epoch")
            self.metrics.update_ring(st.workers, lost,
                                     int(epoch) if isinstance(epoch, (int, float)) else None)
            if self.measured is not None:
                self.metrics.update_job(self.measured["values"], int(self.measured["step"]),
                                        float(self.measured["t"]))
        self.observe(st.workers)
        if measured is not None:  # what evaluate returned, at the step and time first seen
            rows += [("job_metric", k, v) for k, v in measured["values"].items()
                     if isinstance(v, (int, float)) and math.isfinite(v)]
        self.state.record_metrics(t, rows)
        if measured is not None:
            self.state.set_meta("job_metrics", measured)
        if self.coordinator is not None and st.progress:
            self.keep_ledger(st.progress)
        self.copy_ring_events(t)

    def job_metrics(self, stats: Mapping[str, object], t: float) -> dict[str, Any] | None:
        """What the job's ``evaluate`` returned, when it changed since the last record:
        ``{"values", "step", "epoch", "t"}`` (the step, epoch and run's time it was first
        seen at, or the trainer's own ``metrics_step`` when it reports one); else None. The
        newest stays in :attr:`measured` (Prometheus, the dashboard)."""
        from provisioner.clio import finite

        values = stats.get("metrics")
        if not isinstance(values, Mapping) or not values:
            return None
        values = {str(k): v for k, v in values.items()}
        if self.measured is not None and self.measured["values"] == finite(values):
            return None
        step = stats.get("metrics_step", stats.get("step")) or 0
        epoch = stats.get("metrics_epoch", stats.get("epoch")) or 0
        self.measured = {"values": finite(values), "step": int(step),  # type: ignore[arg-type]
                         "epoch": int(epoch), "t": t}  # type: ignore[arg-type]
        return self.measured

    def keep_ledger(self, stats: Mapping[str, object]) -> None:
        """Advance the ledger with the ring's stats; both kept in the state's meta."""
        from provisioner.clio import finite

        with self._lock:
            led = advance(self.ledger, stats)
            if led != self.ledger:
                self.ledger = led
                self.state.set_meta("ledger", led.as_meta())
        self.state.set_meta("ring", finite({k: v for k, v in stats.items() if k != "rejected"}))

    def observe(self, workers: Mapping[str, float]) -> None:
        """Measured samples/s per instance (its workers' sum), averaged per instance type,
        into the model."""
        by_type: dict[str, list[float]] = defaultdict(list)
        offering = {r.id: r.offering for r in self.state.live_instances()}
        for iid, sps in per_instance(workers).items():  # an instance: all its GPUs' workers
            if iid in offering and sps > 0:
                by_type[offering[iid].instance_type].append(sps)
        with self._lock:
            for itype, values in sorted(by_type.items()):
                self.throughput = self.throughput.observe(itype, sum(values) / len(values))

    def copy_ring_events(self, t: float) -> None:
        """Membership events of the ring (joins, drains, losses) into the time line."""
        if self.coordinator is None:
            return
        events = self.coordinator.events()
        wall = time.time()
        for e in events[self._ring_seen:]:
            # at the run's time it happened (the ring stamps its events with the wall clock;
            # the run's clock may run faster), not when it was copied: the time line stays
            # in order
            try:
                ago = max(0.0, wall - float(e.get("time") or wall))
            except (TypeError, ValueError):
                ago = 0.0
            self.state.record_event(t - ago * self.speed, ring_kind(e.get("kind")),
                                    e.get("name") or None, detail=str(e.get("detail", "")))
            self._ring_seen += 1  # one at a time: a write that fails is tried again, once
            if self.metrics is not None and e.get("kind") == "formed":
                switch_ms = (e.get("data") or {}).get("switch_ms") or 0.0
                self.metrics.reconfigured(float(switch_ms) / 1000.0)
