"""What the dashboard and ``provision status`` show: one consistent view, no cloud call.

Design: :class:`Status` is frozen data; :func:`build_status` reads the state, the market's
prices and the ring's coordinator (members' speeds, progress) at one moment: every
instance with where it stands (booting, joining, active, draining: a launched worker shows
before it joins), the spend against on-demand and checkpoint-restart
(:mod:`provisioner.daemon.view.savings`) and the ETA. :func:`describe` says an event in words.

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
from provisioner.daemon.view.savings import (Savings, checkpoint_every_s, eta_from_state,
                                        from_state)
from provisioner.daemon.state import Event, EventKind, State
from provisioner.drivers.identity import by_instance, instance_phase, per_instance


@dataclass(frozen=True)
class WorkerRow:
    """One live instance as the dashboard lists it."""

    id: str
    offering: str  # the offering key
    phase: str  # booting | joining | active | draining
    samples_per_s: float | None
    price: float | None


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
    instances: tuple[WorkerRow, ...] = ()
    savings: Savings | None = None
    eta_s: float | None = None  # the run's (simulated) seconds to the end; None: unknown
    speed: float = 1.0  # simulated seconds per real second
    total_epochs: int | None = None
    counts: Mapping[str, int] = field(default_factory=dict)  # notices, kills, launches
    paused_since: float | None = None  # wall time the state's writes found a full disk
    job_metrics: Mapping[str, Any] | None = None  # what evaluate returned: values, step, t


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
    phases: dict[str, str] = {}
    progress: dict[str, Any] = {}
    sps = None
    if coordinator is not None:
        for m in coordinator.members():
            workers[m.name] = float(m.samples_per_s or 0.0)
            phases[m.name] = str(m.state)
        progress = dict(coordinator.stats())
        sps = sum(workers.values())
    rows = []
    speeds = per_instance(workers)  # members -> their instances (one worker per GPU)
    states = by_instance(phases)
    for r in live:
        phase = "draining" if r.draining_since is not None else instance_phase(
            [phases[m] for m in states.get(r.id, [])])
        rows.append(WorkerRow(r.id, r.offering.key, phase, speeds.get(r.id),
                              by_key.get(r.offering.key, state.price_at(r.offering, t))))
    every_s = checkpoint_every_s(state)
    run = state.get_meta("run") or {}
    total = (run.get("identity") or {}).get("until_epochs") or None
    clock = state.get_meta("clock") or {}
    counts = {k: len(state.events(kinds=[k])) for k in (EventKind.NOTICE, EventKind.KILLED,
                                                         EventKind.LAUNCH)}
    return Status(now, dict(fleet), sum(1 for r in live if r.draining_since is not None),
                  by_key, cost, state.spend(t), sps, progress,
                  tuple(state.events(limit=events)) if events else (), plan_text, workers,
                  tuple(rows), from_state(state, t, every_s), eta_from_state(state, total),
                  float(clock.get("speed") or 1.0), total, counts, state.paused_since,
                  state.get_meta("job_metrics"))


#: The ring's figures a summary keeps (its ``ring`` meta, the last the daemon recorded).
RING_KEYS = ("outcome", "failure", "generation", "step", "epoch", "world", "samples_done",
             "steps_lost", "snapshot", "resumed_from", "adopted", "accuracy", "loss",
             "metrics")


def number(v: Any) -> str:
    """A metric's value in four significant digits (``-`` when it is not a number)."""
    return f"{v:.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def metrics_text(values: Mapping[str, Any], limit: int | None = None) -> str:
    """``accuracy 0.981, mse 0.01234``: what the job's ``evaluate`` returned, in words; with
    ``limit``, the first ``limit`` and how many more."""
    items = list(values.items())
    shown = items if limit is None else items[:limit]
    text = ", ".join(f"{k} {number(v)}" for k, v in shown)
    return text + (f" (+{len(items) - len(shown)} more)" if len(shown) < len(items) else "")


def measured(record: Mapping[str, Any] | None, t0: float) -> dict[str, Any] | None:
    """The job's metrics record as plain data: values, step, epoch and hours into the run."""
    if not record or not record.get("values"):
        return None
    return {"values": dict(record["values"]), "step": record.get("step"),
            "epoch": record.get("epoch"),
            "hours": round((float(record.get("t") or t0) - t0) / 3600.0, 4)}


def summary(state: State, events: int = 12) -> dict[str, Any]:
    """What a state file says about its run, as plain data (``provision status --json``)."""
    times = [t for t, _, _ in state.metric_series("spend")]
    recent = state.events(limit=events) if events else []
    last = state.events(limit=1)
    now = max(times + [e.t for e in recent + last] + [state.get_meta("started_at", 0.0)])
    t0 = float(state.get_meta("started_at", now))
    live = state.live_instances()
    run = state.get_meta("run") or {}
    ended = run.get("ended") or {}
    return {
        "state": str(state.path),
        "job": state.get_meta("job", {}),
        "run_id": run.get("id"),
        "name": run.get("name"),
        "total_epochs": (run.get("identity") or {}).get("until_epochs"),
        "hours": round((now - t0) / 3600.0, 4),
        "spend_usd": round(state.spend(now), 6),
        "finished": bool(ended) if run else bool(state.get_meta("finished", False)),
        "outcome": ended.get("outcome"),
        "fleet_kept": bool(ended.get("fleet_kept")),
        "ring": {k: v for k, v in (state.get_meta("ring") or {}).items() if k in RING_KEYS},
        "outcome_text": ended.get("reason"),
        "job_metrics": measured(state.get_meta("job_metrics"), t0),
        "fleet": [{"id": r.id, "offering": r.offering.key, "where": short_offering(r.offering.key),
                   "state": r.state, "hours": round((now - r.launched_at) / 3600.0, 4)}
                  for r in live],
        "events": [{"hours": round((e.t - t0) / 3600.0, 4), "kind": e.kind,
                    "instance": e.instance_id, "detail": e.detail, "text": describe(e)}
                   for e in recent],
        "failed_boots": failed_boots(state, t0),
    }


#: The events of an instance that failed to boot or to run its job (all of them are shown).
FAILED_KINDS = (EventKind.BOOT_FAILED, EventKind.JOB_ERROR, EventKind.JOIN_DEADLINE)


def failed_boots(state: State, t0: float, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` instances that failed to boot, to import their job, or to join
    in time: what it was (the event's first line: the exit code and its docs line) and the
    last error line the instance shipped."""
    from provisioner.drivers.shiplog import last_error

    out = []
    for e in state.events(limit=limit, kinds=list(FAILED_KINDS)):
        first, _, rest = (e.detail or "").partition("\n")
        lines = [ln for ln in rest.splitlines() if ln.strip()]
        out.append({"hours": round((e.t - t0) / 3600.0, 4), "kind": e.kind,
                    "instance": e.instance_id, "what": first.rstrip(":; "),
                    "last_error": last_error(lines), "lines": lines})
    return out


def short_offering(key: str | None) -> str:
    """``local/local-1/local-1b/p3.2xlarge/spot`` as ``p3.2xlarge local-1b`` (on-demand
    marked ``od``)."""
    if not key:
        return ""
    try:
        o = Offering.from_key(key)
    except (ValueError, TypeError):
        return key
    return f"{o.instance_type} {o.zone}" + (" od" if o.market == "on-demand" else "")


def _reason(detail: str) -> str:
    """A revocation's source in words."""
    import re

    m = re.match(r"trace: (\S+) availability (-?\d+) < held (\d+)", detail)
    if m:
        return f"the market took back capacity in {short_offering(m.group(1))} " \
               f"({m.group(3)} held, {m.group(2)} left)"
    m = re.match(r"market: job-time outage at (\d+%) of the job", detail)
    if m:
        return f"job-time outage at {m.group(1)} of the job"
    if detail.startswith("provision revoke"):
        return "revoked by hand (provision revoke)"
    return detail


def describe(e: Event) -> str:
    """One event in words (no raw JSON), without its time."""
    import json

    who = e.instance_id or ""
    d = (e.detail or "").strip()
    if d.startswith("{"):
        try:
            d = ", ".join(f"{k} {v}" for k, v in json.loads(d).items())
        except (ValueError, AttributeError):
            pass
    kind = str(e.kind)
    where = short_offering(e.offering)
    if kind == EventKind.LAUNCH:
        return f"{who} launched in {where}"
    if kind == EventKind.NOTICE:
        return f"{who} got a notice: {_reason(d)}; it finishes its step and leaves"
    if kind == EventKind.KILLED:
        return f"{who} killed without notice: {_reason(d)}"
    if kind in (EventKind.LEFT, EventKind.EXITED):
        return f"{who} ended (its process exited)"
    if kind == EventKind.TERMINATED:
        return f"{who} terminated" + (f": {d}" if d else "")
    if kind == EventKind.DRAIN:
        return f"{who} asked to leave" + (f": {d}" if d else "")
    if kind == EventKind.STARTED:
        return "daemon started" + (f" ({d})" if d else "")
    if kind == EventKind.STOPPED:
        return "daemon stopped" + (f" ({d})" if d else "")
    if kind == EventKind.MODE:
        mode, _, why = d.partition(": ")
        return f"the job trains in the {mode} mode" + (f" ({why})" if why else "")
    if kind == EventKind.NO_CAPACITY:
        return f"no capacity in {where or d}"
    if kind == EventKind.JOIN_DEADLINE:  # its first line; the boot's lines: failed_boots
        return f"{who} terminated: {d.splitlines()[0] if d else 'join deadline'}"
    if kind == EventKind.BOOT_FAILED:
        return f"{who} failed: {d.splitlines()[0] if d else 'an exit report'}; terminated"
    if kind == EventKind.JOB_ERROR:
        return d.splitlines()[0] if d else "the job failed on a worker"
    names = [n for n in who.split(",") if n]
    if kind.startswith("ring-") and not names and kind not in ("ring-generation",
                                                               "ring-formed",
                                                               "ring-finished"):
        return f"the ring: {d}" if d else f"ring {kind[5:]}"  # about the ring, no member
    if kind == "ring-join":
        return f"{who} joined the ring"
    if kind == "ring-generation":
        return f"new ring generation of {len(names)} ({d.removeprefix('published: ')})"
    if kind == "ring-formed":
        return f"the ring trains with {len(names)} member{'' if len(names) == 1 else 's'} ({d})"
    if kind == "ring-leave":
        if "drained" in d:
            return f"{who} left the ring at a step boundary (drained)"
        return f"{who} left the ring: {d}"
    if kind == "ring-drain":
        return f"{who} finishing its step before leaving ({d or 'drain'})"
    if kind == "ring-lost":
        return f"{who} lost by the ring ({d.split(': ', 1)[-1]}); the ring goes on without it"
    if kind == "ring-finished":
        return "the job finished: " + (d or "every member done")
    if kind.startswith("ring-"):
        return f"ring {kind[5:]}: {who} {d}".rstrip()
    return f"{kind}: {who} {d}".strip()
