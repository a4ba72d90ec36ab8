"""Every interval and TTL of the provisioner, each with the reason for its value.

Design: one module holds the numbers (Karpenter ``pkg/cache/cache.go``), so a reader who
wonders "why every 2 s?" finds the answer next to the number, and the daemon, the reconciler
and the drivers never hard-code a duration. :class:`Intervals` is a frozen dataclass the
daemon receives (from ``[daemon]`` settings), so tests shorten every period in one place.
:class:`TtlCache` is the small expiring set shared by the launcher and the chooser for
offerings out of capacity and zones that just revoked, with the clock injected.

Rule for callers: times here are *simulated* seconds (the daemon's clock), not wall seconds;
the scheduler divides by the clock's speed to get real periods.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Generic, Hashable, TypeVar

#: Prices: AWS spot prices change at most every few minutes and GCP's about monthly; a minute
#: keeps the plan within one change of the market without throttling the pricing APIs.
PRICE_POLL_S = 60.0
#: Notices: AWS gives a 2-minute warning and GCP 30 s; polling every 2 s leaves more than 90%
#: of the shortest (GCP) window to drain the worker and launch its replacement.
NOTICE_POLL_S = 2.0
#: Plan and reconcile: a fleet change costs a ring re-form (tens of ms) and a worker boot
#: (a minute on a cloud); planning every 30 s reacts to a price move well before that pays.
PLAN_S = 30.0
#: Metrics: samples/s and spend for the dashboard and Prometheus; 5 s is a readable refresh.
METRICS_S = 5.0
#: A zone that just revoked is avoided for 10 minutes: revocations in one spot pool come in
#: bursts (Can't-Be-Late traces show runs of zero availability lasting minutes to hours).
ZONE_AVOID_TTL_S = 600.0
#: An offering that answered "no capacity" is skipped for 3 minutes (Karpenter's
#: unavailable-offerings cache uses 3 minutes for InsufficientInstanceCapacity).
CAPACITY_TTL_S = 180.0
#: AWS's interruption warning is 2 minutes; the local driver gives the same window by default.
LOCAL_NOTICE_WINDOW_S = 120.0
#: A draining worker leaves at its next step boundary (well under a second for the example);
#: after 60 s the daemon terminates it anyway so a hung worker never holds a paid instance.
DRAIN_TIMEOUT_S = 60.0
#: The AWS driver's describe_instances fallback runs at most every 30 s: EventBridge delivers
#: within seconds, so the fallback only catches lost or unconfigured queues, and 30 s keeps
#: DescribeInstances far below its throttling limit while still well inside the 2-minute
#: interruption window.
DESCRIBE_FALLBACK_S = 30.0
#: The GCP driver's list fallback runs at most every 30 s: preemption operations arrive within
#: seconds; the fallback only catches VMs deleted some other way.
LIST_FALLBACK_S = 30.0
#: An instance none of whose workers joined the ring this long after its launch is
#: terminated (a boot that failed, a worker that cannot reach the coordinator): cloud GPU
#: boots take 1-10 minutes (the AWS and GCP e2e boots, docs/deploy.md), so an hour is a boot
#: gone wrong, never a slow one. Once boots are measured in the run the deadline is
#: ``JOIN_DEADLINE_MARGIN`` x the slowest boot seen, if that is longer.
JOIN_DEADLINE_S = 3600.0
JOIN_DEADLINE_MARGIN = 3.0
#: ...and never less than 5 real minutes, whatever the clock's speed: a local run replays at
#: 60-600x, where an hour of its clock is 6-60 real seconds, less than a worker may take to
#: import torch on a loaded machine.
JOIN_DEADLINE_MIN_REAL_S = 300.0
#: A launch intent older than this with no instance found is abandoned: cloud launch calls
#: answer within seconds, so 5 minutes means the call never reached the cloud.
LAUNCH_INTENT_STALE_S = 300.0


@dataclass(frozen=True)
class Intervals:
    """The daemon's periods and TTLs in simulated seconds (defaults: the constants above)."""

    price_poll_s: float = PRICE_POLL_S
    notice_poll_s: float = NOTICE_POLL_S
    plan_s: float = PLAN_S
    metrics_s: float = METRICS_S
    zone_avoid_ttl_s: float = ZONE_AVOID_TTL_S
    capacity_ttl_s: float = CAPACITY_TTL_S
    notice_window_s: float = LOCAL_NOTICE_WINDOW_S
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    launch_intent_stale_s: float = LAUNCH_INTENT_STALE_S
    join_deadline_s: float = JOIN_DEADLINE_S

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"Intervals.{f.name}={value!r}: must be a number >= 0")

    def real(self, simulated_s: float, speed: float) -> float:
        """The wall-clock period for a simulated period at ``speed`` (at least 100 ms, so a
        fast replay never spins the CPU the workers train on)."""
        return max(0.1, simulated_s / max(speed, 1e-9))


def join_deadline(configured_s: float, boots_s: "list[float]", speed: float = 1.0) -> float:
    """The join deadline of this run in simulated seconds: the configured one,
    ``JOIN_DEADLINE_MARGIN`` times the slowest boot measured in the run (launch to its first
    join), or ``JOIN_DEADLINE_MIN_REAL_S`` real seconds at the clock's ``speed``, whichever is
    longest, so a cloud whose boots are slow never has its instances cut while they boot."""
    return max(configured_s, JOIN_DEADLINE_MARGIN * max(boots_s, default=0.0),
               JOIN_DEADLINE_MIN_REAL_S * speed)


K = TypeVar("K", bound=Hashable)


class TtlCache(Generic[K]):
    """A set whose members expire ``ttl_s`` after they were last added.

    ``clock`` returns seconds (any epoch, e.g. the daemon clock's ``timestamp``). Not
    thread-safe by itself; the daemon touches it from scheduler jobs that never overlap on it.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self._until: dict[K, float] = {}

    def add(self, key: K, ttl_s: float | None = None) -> None:
        """Add ``key`` (or extend it) for ``ttl_s`` (default: the cache's TTL)."""
        self._until[key] = self._clock() + (self.ttl_s if ttl_s is None else ttl_s)

    def __contains__(self, key: object) -> bool:
        until = self._until.get(key)  # type: ignore[arg-type]
        if until is None:
            return False
        if until <= self._clock():
            del self._until[key]  # type: ignore[arg-type]
            return False
        return True

    def members(self) -> frozenset[K]:
        """The keys that have not expired."""
        return frozenset(k for k in list(self._until) if k in self)

    def expiry(self, key: K) -> float | None:
        """When ``key`` expires (the clock's seconds), None when it is not a member."""
        return self._until[key] if key in self else None
