"""What the run's spend is worth: set against on-demand and a checkpoint-restart system; ETA.

Design: pure arithmetic (:func:`checkpoint_restart`, :func:`on_demand`, :func:`saved`,
:func:`eta_s`) over plain data, and one reader (:func:`from_state`) that takes that data
from the state file, so the dashboard, ``provision status`` and the report show the same
figures. The baselines run the SAME job on the SAME fleet over the same time; they differ
only in what a revocation costs.

- **On-demand** (``on_demand_usd``): every instance-second of the run priced at its type's
  on-demand price, ``Σ_i ∫ od_i dt``, less the instance-seconds an on-demand fleet would
  never have paid, measured in this run (:func:`spared_seconds`): for a revoked member, its
  replacement's boot (launch to join); for an instance revoked while still booting, its own
  life until then (its replacement's boot stands in for the rest of its own).
- **Checkpoint-restart** (``checkpoint_restart_usd``): the same spot fleet running a
  trainer that, like most spot training systems, stops the whole job on a revocation and
  restarts it from its last checkpoint once a replacement has booted. Per revocation it
  pays, beyond this run's spend:

  - the survivors standing idle while the replacement boots:
    ``boot_s × (fleet $/h − revoked $/h) / 3600``;
  - on a kill without notice, the work since the last checkpoint done again by the whole
    fleet, on average half the checkpoint interval: ``(every_s / 2) × fleet $/h / 3600``
    (with a notice it checkpoints in the notice window and redoes nothing).

  ``boot_s`` is measured in this run (the median time from an instance's launch to its
  joining the ring); ``every_s`` is this run's snapshot interval, so both systems
  checkpoint equally often. The baseline leaves out the restart itself (reloading the
  checkpoint, re-forming the group): it is a lower bound, favourable to checkpoint-restart.
  Its extra time is ``lost_s = Σ boot_s + redo``; the elastic ring's own losses (a step per
  kill, the drains) are already in the spend.

- **Savings**: ``1 − spend / baseline`` (None when the baseline is 0).
- **ETA**: remaining samples over the ring's recent rate, in the run's (simulated) seconds:
  ``(total_epochs × samples_per_epoch − samples_done) / rate``; samples per epoch are read
  where the epoch counter last moved (:func:`samples_per_epoch`).

Rule for callers: all times are the run's (simulated) seconds; prices are USD per hour.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from pricing.series import Step

#: The checkpoint interval of the checkpoint-restart baseline when the run recorded none
#: (the default ``[snapshot] every_s``).
DEFAULT_CHECKPOINT_S = 300.0

#: Recent window (simulated seconds) over which the ETA's rate is measured.
ETA_WINDOW_S = 600.0


@dataclass(frozen=True)
class Revocation:
    """One instance taken back: when, with or without notice, and the prices then."""

    t: float
    notice: bool
    fleet_per_hour: float  # spot $/h of the whole fleet just before it (the revoked included)
    revoked_per_hour: float  # spot $/h of the revoked instance
    member: bool = True  # the instance was in the ring (False: revoked while booting)


@dataclass(frozen=True)
class Savings:
    """The spend set against the two baselines (see the module docstring)."""

    spend_usd: float
    on_demand_usd: float
    checkpoint_restart_usd: float
    checkpoint_restart_lost_s: float
    boot_s: float
    revocations: int

    @property
    def vs_on_demand(self) -> float | None:
        return saved(self.spend_usd, self.on_demand_usd)

    @property
    def vs_checkpoint_restart(self) -> float | None:
        return saved(self.spend_usd, self.checkpoint_restart_usd)

    def as_figures(self) -> dict[str, Any]:
        """The report's figures (rounded; fractions as fractions, not percent)."""
        def frac(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {"on_demand_usd": round(self.on_demand_usd, 6),
                "saved_vs_on_demand": frac(self.vs_on_demand),
                "checkpoint_restart_usd": round(self.checkpoint_restart_usd, 6),
                "saved_vs_checkpoint_restart": frac(self.vs_checkpoint_restart),
                "checkpoint_restart_hours_lost": round(self.checkpoint_restart_lost_s / 3600, 4),
                "boot_s": round(self.boot_s, 1)}


def saved(spend: float, baseline: float) -> float | None:
    """The fraction of ``baseline`` not spent: ``1 − spend / baseline`` (None if 0)."""
    return None if baseline <= 0 else 1.0 - spend / baseline


def pct(share: float | None) -> str:
    """A share saved as the dashboard, the report and the run's last lines print it
    (``66%``; ``-`` when there is no baseline)."""
    return "-" if share is None else f"{share:.0%}"


def checkpoint_restart(spend: float, revocations: Sequence[Revocation], boot_s: float,
                       every_s: float) -> tuple[float, float]:
    """``(usd, lost_s)`` of the checkpoint-restart baseline (see the module docstring)."""
    usd, lost = spend, 0.0
    for r in revocations:
        if not r.member:
            continue
        survivors = max(0.0, r.fleet_per_hour - r.revoked_per_hour)
        redo = 0.0 if r.notice else every_s / 2.0
        usd += (boot_s * survivors + redo * r.fleet_per_hour) / 3600.0
        lost += boot_s + redo
    return usd, lost


@dataclass(frozen=True)
class Life:
    """One instance's life as the savings read it (the run's seconds)."""

    id: str
    launched: float
    ended: float  # or now, while it lives
    joined: float | None  # its first join of the ring; None: never joined


def spared_seconds(lives: Sequence[Life], revoked: Sequence[tuple[float, str]]
                   ) -> dict[str, float]:
    """Instance-seconds an on-demand fleet would not have paid, per instance, for the
    revocations ``(t, instance id)``: a revoked member's replacement (the first instance
    launched at or after it, not already one) counts its boot; an instance revoked while
    booting counts its life until then. Each instance counts once."""
    by_id = {x.id: x for x in lives}
    order = sorted(lives, key=lambda x: (x.launched, x.id))
    taken: set[str] = set()
    out: dict[str, float] = {}
    for t, iid in sorted(revoked):
        v = by_id.get(iid)
        if v is None:
            continue
        taken.add(iid)
        if v.joined is None or v.joined > t:
            out[iid] = max(0.0, t - v.launched)
            continue
        rep = next((x for x in order if x.launched >= t and x.id not in taken), None)
        if rep is None:
            continue
        taken.add(rep.id)
        end = rep.joined if rep.joined is not None and rep.joined <= rep.ended else rep.ended
        out.setdefault(rep.id, max(0.0, end - rep.launched))
    return out


def on_demand(instance_usd: float, spared_usd: float) -> float:
    """The on-demand baseline: the run's instance-time at on-demand prices
    (``instance_usd``) less what :func:`spared_seconds` spares, priced the same way."""
    return max(0.0, instance_usd - spared_usd)


def samples_per_epoch(points: Sequence[tuple[float, float, float]]) -> float | None:
    """Samples per epoch from ``(t, epoch, samples_done)`` points: at the first point of the
    newest epoch e >= 1, ``samples / e`` (None before the first epoch ends)."""
    first: tuple[float, float] | None = None
    for _t, epoch, samples in points:
        if epoch >= 1 and (first is None or epoch > first[0]):
            first = (epoch, samples)
    if first is None or first[1] <= 0:
        return None
    return first[1] / first[0]


def eta_s(points: Sequence[tuple[float, float, float]], total_epochs: int | None,
          window_s: float = ETA_WINDOW_S) -> float | None:
    """Seconds (the run's clock) until ``total_epochs`` are done, from ``(t, epoch,
    samples_done)`` points in time order; None when it cannot be told yet (no length, no
    epoch done, no progress in the window)."""
    if not total_epochs or not points:
        return None
    spe = samples_per_epoch(points)
    if spe is None:
        return None
    t_end, _e, s_end = points[-1]
    recent = [p for p in points if p[0] >= t_end - window_s]
    t0, _e0, s0 = recent[0]
    if t_end <= t0 or s_end <= s0:
        return None
    rate = (s_end - s0) / (t_end - t0)
    return max(0.0, total_epochs * spe - s_end) / rate


# -- the one reader ------------------------------------------------------------------------


def boot_seconds(launches: dict[str, float], joins: dict[str, float]) -> float:
    """Median seconds from launch to first ring join over the instances that joined (0 when
    none has: nothing measured, nothing charged)."""
    waits = [joins[i] - t for i, t in launches.items() if i in joins and joins[i] >= t]
    return statistics.median(waits) if waits else 0.0


def from_state(state: Any, now: float, every_s: float) -> Savings:
    """The :class:`Savings` of the run in ``state`` at ``now`` (reads only)."""
    from pricing.model import Offering
    from provisioner.daemon.state import EventKind, ring_kind

    rows = [r for r in state.instances() if r.launched_at <= now]
    series: dict[Offering, Step | None] = {}

    def step(o: Offering) -> Step | None:
        if o not in series:
            pts = state.price_series(o)
            series[o] = Step.of(pts) if pts else None
        return series[o]

    def price(o: Offering, t: float) -> float:
        s = step(o)
        return float(s.at(t)) if s is not None else 0.0

    def od_usd(o: Offering, a: float, b: float) -> float:
        s = step(o.with_market("on-demand"))
        return s.between(a, b) / 3600.0 if s is not None and b > a else 0.0

    joins: dict[str, float] = {}
    for e in state.events(kinds=[ring_kind("join")]):
        if e.instance_id and e.t <= now:
            joins.setdefault(e.instance_id, e.t)
    lives = [Life(r.id, r.launched_at, min(now, r.ended_at if r.ended_at is not None else now),
                  joins.get(r.id)) for r in rows]
    by_id = {r.id: r for r in rows}
    revs, revoked = [], []
    for e in state.events(kinds=[EventKind.NOTICE, EventKind.KILLED]):
        row = by_id.get(e.instance_id or "")
        if row is None or e.t > now:
            continue
        fleet = sum(price(r.offering, e.t) for r in rows if r.launched_at <= e.t
                    and (r.ended_at is None or r.ended_at >= e.t))
        joined = joins.get(row.id)
        revs.append(Revocation(e.t, e.kind == EventKind.NOTICE, fleet, price(row.offering, e.t),
                               member=joined is not None and joined <= e.t))
        revoked.append((e.t, row.id))
    boot = boot_seconds({x.id: x.launched for x in lives}, joins)
    instance_usd = sum(od_usd(by_id[x.id].offering, x.launched, x.ended) for x in lives)
    spared = spared_seconds(lives, revoked)
    spared_usd = sum(od_usd(by_id[i].offering, by_id[i].launched_at, by_id[i].launched_at + s)
                     for i, s in spared.items())
    spend = 0.0  # the spend up to ``now`` (State.spend counts an ended instance to its end)
    for x in lives:
        st = step(by_id[x.id].offering)
        if st is not None and x.ended > x.launched:
            spend += st.between(x.launched, x.ended) / 3600.0
    cr_usd, lost = checkpoint_restart(spend, revs, boot, every_s)
    return Savings(spend, on_demand(instance_usd, spared_usd), cr_usd, lost, boot, len(revs))


def eta_from_state(state: Any, total_epochs: int | None) -> float | None:
    """:func:`eta_s` over the progress the state recorded (reads only)."""
    if not total_epochs:
        return None
    epochs = {t: v for t, _, v in state.metric_series("epoch")}
    points = [(t, epochs[t], v) for t, _, v in state.metric_series("samples_done") if t in epochs]
    return eta_s(points, total_epochs)


def checkpoint_every_s(state: Any) -> float:
    """The checkpoint interval of the checkpoint-restart baseline: the run's snapshot
    interval as it recorded it, else :data:`DEFAULT_CHECKPOINT_S`."""
    return float((state.get_meta("baseline") or {}).get("checkpoint_every_s")
                 or DEFAULT_CHECKPOINT_S)
