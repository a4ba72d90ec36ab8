"""Settings, checked quotes and risk estimates in; a :class:`~provisioner.plan.model.Problem` out.

Design: pure. :func:`build_problem` picks the latest quote per offering, prices on-demand
offerings from spot quotes that carry it, and turns each offering into a
:class:`~provisioner.plan.model.Candidate` (throughput prior, hazard, loss per revocation,
GPUs, caps). :func:`deadline_floor` is Uniform Progress' on-demand safety net.

Rule for callers: never build a Problem from unchecked quotes: pass them through
``pricing.sanity.check`` first.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Collection, Mapping, Sequence

from pricing.model import GpuSpec, Offering, PriceQuote, RiskEstimate, utc
from provisioner.errors import InfeasibleError
from provisioner.plan.model import Candidate, Problem
from provisioner.plan.throughput import ThroughputModel

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.config import Settings


def build_problem(settings: "Settings", quotes: Sequence[PriceQuote],
                  risks: Mapping[Offering, RiskEstimate], *,
                  current: Mapping[Offering, int] = MappingProxyType({}),
                  throughput: ThroughputModel | None = None, now: datetime | None = None,
                  avoid: Collection[str] = (), available: Mapping[Offering, int] =
                  MappingProxyType({}), work_done: float = 0.0,
                  elapsed_hours: float = 0.0) -> Problem:
    """Turn settings, checked quotes and risk estimates into a :class:`Problem`.

    The latest quote per offering at ``now`` (default: the newest quote) no older than
    ``optimizer.max_quote_age_hours`` is used; a spot quote that carries its on-demand price
    also yields the on-demand offering. ``avoid`` names zones (``zone`` or ``region/zone``)
    that just revoked: their spot offerings may keep what they hold but not grow, unless
    every spot zone is avoided. ``available`` caps counts (availability traces).
    ``work_done``/``elapsed_hours`` give progress for the deadline objective.
    Raises InfeasibleError when the deadline has passed.
    """
    job, obj, fleet, opt = settings.job, settings.objective, settings.fleet, settings.optimizer
    model = throughput or ThroughputModel(priors=job.throughput_priors,
                                          unit=job.samples_per_s_per_unit)
    if now is None:
        now = max((q.time for q in quotes), default=None)
    now = utc(now) if now is not None else None
    max_age = timedelta(hours=opt.max_quote_age_hours)
    latest: dict[Offering, PriceQuote] = {}
    for q in quotes:
        if now is not None and (q.time > now or now - q.time > max_age):
            continue
        if q.offering not in latest or q.time > latest[q.offering].time:
            latest[q.offering] = q
    prices: dict[Offering, float] = {o: q.price_per_hour for o, q in latest.items()}
    for o, q in latest.items():
        od = o.with_market("on-demand")
        if o.market == "spot" and q.on_demand_per_hour and od not in prices:
            prices[od] = q.on_demand_per_hour
    regions = set(settings.source.regions)
    gpus = {g.lower() for g in settings.source.gpus}
    notes: list[str] = []
    unknown: set[str] = set()
    n_ref = max(1, sum(current.values()), fleet.min_size)
    loss_h = (fleet.boot_s + (fleet.step_s + fleet.reform_s) * n_ref) / 3600.0
    avoid_set = set(avoid)
    spot_zones = {(o.zone, f"{o.region}/{o.zone}") for o in prices if o.market == "spot"}
    if spot_zones and all(z in avoid_set or rz in avoid_set for z, rz in spot_zones):
        notes.append("every spot zone was to be avoided; avoiding none")
        avoid_set = set()
    cands = []
    for o in sorted(prices):
        if o.market not in fleet.markets or (regions and o.region not in regions):
            continue
        spec = gpu_spec(o.instance_type)
        if gpus and (spec is None or spec.model.lower() not in gpus):
            continue
        try:
            s = model.samples_per_s(o.instance_type)
        except KeyError:
            unknown.add(o.instance_type)
            continue
        r = risks.get(o)
        if r is not None:
            hz = r.hazard_per_hour
        else:
            hz = 0.0 if o.market == "on-demand" else opt.default_spot_hazard_per_hour
        cap = available.get(o)
        held = int(current.get(o, 0))
        if o.market == "spot" and (o.zone in avoid_set or f"{o.region}/{o.zone}" in avoid_set):
            cap = held if cap is None else min(cap, held)
        cands.append(Candidate(o, prices[o], s, hz, loss_h, spec.count if spec else 1,
                               cap, held))
    if unknown:
        notes.append(f"skipped {len(unknown)} instance types with no throughput prior: "
                     + ", ".join(sorted(unknown)[:8]))
    target = obj.target_samples_per_s
    floor = 0.0
    if obj.kind == "deadline":
        left = max(0.0, (obj.work_samples or 0.0) - work_done)
        hours = (obj.deadline_hours or 0.0) - elapsed_hours
        if left > 0 and hours <= 0:
            raise InfeasibleError(f"objective.deadline_hours = {obj.deadline_hours}: the deadline "
                                  f"has passed with {left:.0f} samples left")
        target = max(left / (hours * 3600.0), 1e-9) if left > 0 else 1e-9
        od_rate = max((c.useful for c in cands if c.offering.market == "on-demand"),
                      default=0.0) * fleet.max_size
        floor = deadline_floor(target, left, hours, od_rate, obj.safety_hours)
    return Problem(
        candidates=tuple(cands), objective=obj.kind, target_samples_per_s=target,
        budget_per_hour=obj.budget_per_hour, ondemand_floor_samples_per_s=floor,
        min_size=fleet.min_size, max_size=fleet.max_size, max_zone_share=fleet.max_zone_share,
        zone_allowance=fleet.zone_allowance, region_quota_gpus=dict(fleet.region_quota_gpus),
        family_quota_gpus=dict(fleet.family_quota_gpus), max_regions=fleet.max_regions,
        model_mb=job.model_mb, global_batch=job.global_batch,
        intra_zone_gbps=fleet.intra_zone_gbps, inter_zone_gbps=fleet.inter_zone_gbps,
        inter_region_gbps=fleet.inter_region_gbps, boot_s=fleet.boot_s,
        reform_s=fleet.reform_s, churn_horizon_hours=fleet.churn_horizon_hours,
        notes=tuple(notes))


def deadline_floor(rate: float, work_left: float, hours_left: float, od_rate: float,
                   safety_hours: float) -> float:
    """On-demand samples/s to keep for a deadline (Uniform Progress' safety net).

    slack = hours left - hours the largest on-demand fleet (``od_rate``) would need; the
    floor is ``rate * (1 - slack / safety_hours)`` clipped to [0, rate] (all on-demand when
    the slack is gone; none while it exceeds ``safety_hours``).
    """
    if work_left <= 0:
        return 0.0
    if od_rate <= 0:
        return 0.0
    slack = hours_left - work_left / (od_rate * 3600.0)
    if safety_hours <= 0:
        return rate if slack <= 0 else 0.0
    return rate * min(1.0, max(0.0, 1.0 - slack / safety_hours))


def gpu_spec(instance_type: str) -> GpuSpec | None:
    """The GPUs of an instance type from :mod:`pricing.catalog`, or None when unknown."""
    try:
        from pricing import catalog
        return catalog.gpu_for(instance_type)
    except (ImportError, KeyError, ValueError, LookupError):
        return None
