"""Prometheus metrics of the daemon (``--metrics-port``).

Design: one :class:`Metrics` object owns its own ``CollectorRegistry`` (so tests and several
daemons in one process never clash on the global registry) and is updated by the daemon's
metrics job from values it already computed; nothing here reads the state or a cloud.

Rule for callers: call :meth:`Metrics.serve` at most once; a port in use raises
:class:`~provisioner.errors.UserError` (one line, exit 2).
"""

from __future__ import annotations

import errno
from typing import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from provisioner.errors import UserError


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
        self.revocations = Counter("spotring_revocations", "revocation notices and kills",
                                   ["kind"], registry=r)
        self.samples = Gauge("spotring_samples_per_s", "training samples/s of the ring",
                             registry=r)
        self._offerings: set[str] = set()
        self._server = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on ``port`` (0: any); returns the port bound."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"--metrics-port {port}: port already in use; pick another "
                                f"or leave it out") from None
            raise UserError(f"--metrics-port {port}: cannot listen ({exc.strerror})") from None
        self._server = server
        return server.server_address[1]

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
