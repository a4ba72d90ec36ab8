"""The daemon's collaborators, typed: the ring's coordinator, the price feed, the metrics.

Design: one small Protocol per collaborator (the cloud driver's is
:class:`provisioner.drivers.base.CloudDriver`), so the daemon calls methods instead of
probing objects with ``getattr``, and a fake implements the same Protocol
(``tests/fakes/local_coordinator.py``). The coordinator is the trainer's
(:class:`trainer.control.coordinator.Coordinator`), built in exactly one place,
:func:`provisioner.daemon.wiring.make_coordinator`.

Rule: the daemon relies on nothing of the coordinator beyond :class:`RingCoordinator`;
"the job finished" and "every member lost" are ``stats()["finished"]`` and
``stats().get("lost")``, never parsed from event text.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from pricing.model import Snapshot


@runtime_checkable
class RingCoordinator(Protocol):
    """What the daemon uses of the trainer's coordinator."""

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the workers dial."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def drain(self, member_name: str, reason: str) -> bool:
        """Ask a member to leave at its next step boundary; False when it is not a member."""
        ...

    def members(self) -> Sequence[Any]:
        """``trainer.protocol.messages.MemberInfo`` rows (id, name, generation, batch,
        samples_per_s, state, joined_at)."""
        ...

    def stats(self) -> Mapping[str, Any]:
        """generation, step, epoch, samples_done, world, steps_lost, finished, lost, loss,
        accuracy."""
        ...

    def events(self) -> Sequence[Mapping[str, Any]]:
        """Membership events: dicts of time, kind, name, generation, detail."""
        ...


class PriceFeed(Protocol):
    """A price source as the daemon polls it (:class:`pricing.sources.base.PriceSource`)."""

    def fetch(self, *, now: datetime | None = None) -> Snapshot: ...


@runtime_checkable
class Replayed(Protocol):
    """A price feed replaying a recorded history (:class:`pricing.sources.trace.
    TraceSource`): every price change between two polls is recorded, so spend is exact."""

    history: Snapshot


class RevocationCounter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Revocations(Protocol):
    def labels(self, kind: str) -> RevocationCounter: ...


class MetricsSink(Protocol):
    """What the daemon writes to Prometheus (:class:`provisioner.daemon.view.metrics.Metrics`)."""

    revocations: Revocations

    def update(self, fleet: Mapping[str, int], cost_per_hour: float, spend: float,
               samples_per_s: float | None) -> None: ...

    def update_savings(self, spend: float, on_demand: float,
                       checkpoint_restart: float) -> None: ...

    def update_ring(self, workers: Mapping[str, float], steps_lost: int | None,
                    epoch: int | None) -> None: ...

    def update_job(self, values: Mapping[str, float | None], step: int, t: float) -> None: ...

    def reconfigured(self, seconds: float) -> None: ...
