"""What the dashboard and ``provision status`` show: one consistent view, no cloud call.

Design: :class:`Status` is frozen data; :func:`build_status` reads the state, the market's
prices and the ring's coordinator (members' speeds, progress) at one moment.

:func:`summary` is the one reading of a state file from outside its daemon (``provision
status``, ``list`` and ``down``): "now" is the newest time the daemon recorded (its clock may
be simulated), so the cost is the spend up to that moment.

Rule: never call a driver from here (the dashboard refreshes four times a second).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from pricing.model import Offering
from provisioner.daemon.ports import RingCoordinator
from provisioner.daemon.state import Event, State


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


def build_status(now: datetime, state: State, prices: Mapping[Offering, float],
                 coordinator: RingCoordinator | None, plan_text: str,
                 events: int = 8) -> Status:
    """The view at ``now``; ``events`` most recent events (0: none)."""
    t = now.timestamp()
    live = state.live_instances()
    fleet = Counter(r.offering.key for r in live if r.draining_since is None)
    by_key = {o.key: p for o, p in prices.items()}
    cost = sum(by_key.get(r.offering.key, state.price_at(r.offering, t) or 0.0) for r in live)
    workers: dict[str, float] = {}
    progress: dict[str, Any] = {}
    sps = None
    if coordinator is not None:
        for m in coordinator.members():
            workers[m.name] = float(m.samples_per_s or 0.0)
        progress = dict(coordinator.stats())
        sps = sum(workers.values())
    return Status(now, dict(fleet), sum(1 for r in live if r.draining_since is not None),
                  by_key, cost, state.spend(t), sps, progress,
                  tuple(state.events(limit=events)) if events else (), plan_text, workers)


#: The ring's figures a summary keeps (its ``ring`` meta, the last the daemon recorded).
RING_KEYS = ("outcome", "failure", "generation", "step", "epoch", "world", "samples_done",
             "steps_lost", "snapshot", "resumed_from", "adopted", "accuracy")


def summary(state: State, events: int = 12) -> dict[str, Any]:
    """What a state file says about its run, as plain data (``provision status --json``)."""
    times = [t for t, _, _ in state.metric_series("spend")]
    recent = state.events(limit=events) if events else []
    last = state.events(limit=1)
    now = max(times + [e.t for e in recent + last] + [state.get_meta("started_at", 0.0)])
    t0 = float(state.get_meta("started_at", now))
    live = state.live_instances()
    run = state.get_meta("run") or {}
    return {
        "state": str(state.path),
        "job": state.get_meta("job", {}),
        "run_id": run.get("id"),
        "hours": round((now - t0) / 3600.0, 4),
        "spend_usd": round(state.spend(now), 6),
        "finished": bool(state.get_meta("finished", False)),
        "outcome": (run.get("ended") or {}).get("outcome"),
        "fleet_kept": bool((run.get("ended") or {}).get("fleet_kept")),
        "ring": {k: v for k, v in (state.get_meta("ring") or {}).items() if k in RING_KEYS},
        "fleet": [{"id": r.id, "offering": r.offering.key, "state": r.state,
                   "hours": round((now - r.launched_at) / 3600.0, 4)} for r in live],
        "events": [{"hours": round((e.t - t0) / 3600.0, 4), "kind": e.kind,
                    "instance": e.instance_id, "detail": e.detail} for e in recent],
    }
