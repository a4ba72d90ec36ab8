"""Prometheus metrics of the daemon (``[metrics] host/port``, ``--metrics-host/--metrics-port``).

Design: one :class:`Metrics` object owns its own ``CollectorRegistry`` (so tests and several
daemons in one process never clash on the global registry) and is updated by the daemon's
telemetry from values it already computed; nothing here reads the state or a cloud. The
series are the ones a Grafana board of a training fleet plots:

- the fleet and its money: ``spotring_fleet_size{offering}``, ``spotring_cost_per_hour_usd``,
  ``spotring_spend_usd``, and the savings (:mod:`provisioner.daemon.view.savings`):
  ``spotring_on_demand_equivalent_usd`` (the same instance-hours at the on-demand price, less
  the boots an on-demand fleet would not have paid),
  ``spotring_checkpoint_restart_equivalent_usd``, ``spotring_savings_usd`` (on-demand minus
  the spend) and
  ``spotring_spend_ratio`` (spend / on-demand: 0.3 means 70% saved);
- the ring: ``spotring_samples_per_s`` (all), ``spotring_worker_samples_per_s{worker}`` (a
  member's measured rate; a worker that left is removed, not left at its last value),
  ``spotring_steps_lost`` (every step computed and thrown away, across daemon restarts),
  ``spotring_reconfigurations_total`` and ``spotring_reconfiguration_seconds_total`` (each
  formed generation and the longest member's switch into it), ``spotring_epoch``;
- ``spotring_revocations_total{kind}`` (notices and kills);
- the job's own metrics: ``spotring_job_metric{name}`` (each value ``evaluate`` returned),
  ``spotring_job_metric_step`` and ``spotring_job_metric_time_seconds`` (when measured).

Rule for callers: call :meth:`Metrics.serve` at most once; the address comes from the
settings or the flags (loopback by default); a port in use or an address this host does not
have raises :class:`~provisioner.errors.UserError` (one line, exit 2).
"""

from __future__ import annotations

import errno
from typing import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from provisioner.errors import UserError

DEFAULT_HOST = "127.0.0.1"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.fleet = Gauge("spotring_fleet_size", "instances held, by offering", ["offering"],
                           registry=r)
        self.cost_per_hour = Gauge("spotring_cost_per_hour_usd", "fleet cost per hour now",
                                   registry=r)
        self.spend = Gauge("spotring_spend_usd", "spend so far (instance-seconds x price)",
                           registry=r)
        self.on_demand = Gauge("spotring_on_demand_equivalent_usd", "what the same "
                               "instance-seconds cost at the on-demand price", registry=r)
        self.checkpoint_restart = Gauge(
            "spotring_checkpoint_restart_equivalent_usd", "what a checkpoint-restart trainer "
            "would have spent on the same fleet (USD; see provisioner.daemon.view.savings)",
            registry=r)
        self.savings = Gauge("spotring_savings_usd", "on-demand equivalent minus spend",
                             registry=r)
        self.spend_ratio = Gauge("spotring_spend_ratio", "spend / on-demand equivalent "
                                 "(1 - savings share)", registry=r)
        self.revocations = Counter("spotring_revocations", "revocation notices and kills",
                                   ["kind"], registry=r)
        self.samples = Gauge("spotring_samples_per_s", "training samples/s of the ring",
                             registry=r)
        self.worker_samples = Gauge("spotring_worker_samples_per_s", "measured samples/s of "
                                    "one member of the ring", ["worker"], registry=r)
        self.steps_lost = Gauge("spotring_steps_lost", "training steps computed and thrown "
                                "away so far (revocations without notice, restarts)", registry=r)
        self.epoch = Gauge("spotring_epoch", "the ring's current epoch", registry=r)
        self.reconfigurations = Counter("spotring_reconfigurations", "generations of the ring "
                                        "formed (joins, drains, losses)", registry=r)
        self.reconfiguration_s = Counter("spotring_reconfiguration_seconds", "time members "
                                         "spent switching generations (the longest member "
                                         "of each)", registry=r)
        self.job_metric = Gauge("spotring_job_metric", "what the job's evaluate() returned, "
                                "by name (accuracy, mse, ...)", ["name"], registry=r)
        self.job_metric_step = Gauge("spotring_job_metric_step", "the training step the job's "
                                     "metrics were measured at", registry=r)
        self.job_metric_time = Gauge("spotring_job_metric_time_seconds", "when the job's "
                                     "metrics were measured (the run's clock, Unix seconds)",
                                     registry=r)
        self._job_metrics: set[str] = set()
        self._offerings: set[str] = set()
        self._workers: set[str] = set()
        self._server = None
        self.address: tuple[str, int] | None = None

    def serve(self, port: int, host: str = DEFAULT_HOST) -> int:
        """Serve /metrics on ``host:port`` (port 0: any); returns the port bound."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"--metrics-port {port}: port already in use on {host}; pick "
                                f"another or leave it out") from None
            raise UserError(f"--metrics-host {host}: cannot listen on port {port} "
                            f"({exc.strerror or exc}); use 127.0.0.1, 0.0.0.0 or an address "
                            f"of this host") from None
        self._server = server
        self.address = (host, int(server.server_address[1]))
        return self.address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def update(self, fleet: Mapping[str, int], cost_per_hour: float, spend: float,
               samples_per_s: float | None) -> None:
        for key in self._offerings - set(fleet):
            self.fleet.labels(key).set(0)
        for key, n in fleet.items():
            self.fleet.labels(key).set(n)
        self._offerings |= set(fleet)
        self.cost_per_hour.set(cost_per_hour)
        self.spend.set(spend)
        if samples_per_s is not None:
            self.samples.set(samples_per_s)

    def update_savings(self, spend: float, on_demand: float,
                       checkpoint_restart: float) -> None:
        """Spend against the two baselines of :mod:`provisioner.daemon.view.savings`."""
        self.on_demand.set(on_demand)
        self.checkpoint_restart.set(checkpoint_restart)
        self.savings.set(on_demand - spend)
        if on_demand > 0:
            self.spend_ratio.set(spend / on_demand)

    def update_ring(self, workers: Mapping[str, float], steps_lost: int | None,
                    epoch: int | None) -> None:
        """Each member's samples/s (members gone are removed), steps lost, the epoch."""
        for name in self._workers - set(workers):
            self.worker_samples.remove(name)
        for name, sps in workers.items():
            self.worker_samples.labels(name).set(sps)
        self._workers = set(workers)
        if steps_lost is not None:
            self.steps_lost.set(steps_lost)
        if epoch is not None:
            self.epoch.set(epoch)

    def update_job(self, values: Mapping[str, float | None], step: int, t: float) -> None:
        """The job's metrics (a name no longer reported is removed), their step and time."""
        known = {k for k, v in values.items() if isinstance(v, (int, float))}
        for name in self._job_metrics - known:
            self.job_metric.remove(name)
        for name in known:
            self.job_metric.labels(name).set(float(values[name]))  # type: ignore[arg-type]
        self._job_metrics = known
        self.job_metric_step.set(step)
        self.job_metric_time.set(t)

    def reconfigured(self, seconds: float) -> None:
        """One generation formed; ``seconds`` its members took to switch."""
        self.reconfigurations.inc()
        self.reconfiguration_s.inc(max(0.0, seconds))
