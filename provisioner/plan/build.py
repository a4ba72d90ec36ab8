"""Quotes, risks and settings in; a market view and a :class:`~provisioner.plan.model.Problem` out.

Design: pure. :func:`latest_prices` picks the latest quote per offering at ``now`` no older
than the settings allow (a spot quote carrying its on-demand price also prices the
on-demand offering); :func:`market_view` adds speeds from the throughput model, hazards from
the risk estimates, GPUs from the catalog and known capacity, as the
:class:`~provisioner.plan.pipeline.MarketView` every decision reads. :func:`build_problem`
is the one-shot Problem of those (``provision plan``'s and the tests' view of the solver),
built with the planner's own :func:`~provisioner.plan.pipeline.candidates`.

Rule for callers: never build a Problem from unchecked quotes: pass them through
``pricing.sanity.check`` first.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Collection, Mapping, Sequence

from pricing.model import Offering, PriceQuote, RiskEstimate, utc
from pricing.risk import AgeShape
from provisioner.errors import InfeasibleError
from provisioner.plan.model import Problem, gpu_spec
from provisioner.plan.pacing import od_capacity, pace
from provisioner.plan.pipeline import (FleetView, MarketView, candidates, plan_settings,
                                       problem_of)
from provisioner.plan.throughput import ThroughputModel

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.config import Settings


def latest_prices(quotes: Sequence[PriceQuote], now: datetime | None,
                  max_age: timedelta) -> dict[Offering, float]:
    """The latest quote per offering at ``now`` (default: the newest quote) no older than
    ``max_age``; a spot quote that carries its on-demand price also prices the on-demand
    offering."""
    if now is None:
        now = max((q.time for q in quotes), default=None)
    now = utc(now) if now is not None else None
    latest: dict[Offering, PriceQuote] = {}
    for q in quotes:
        if now is not None and (q.time > now or now - q.time > max_age):
            continue
        if q.offering not in latest or q.time > latest[q.offering].time:
            latest[q.offering] = q
    prices = {o: q.price_per_hour for o, q in latest.items()}
    for o, q in latest.items():
        od = o.with_market("on-demand")
        if o.market == "spot" and q.on_demand_per_hour and od not in prices:
            prices[od] = q.on_demand_per_hour
    return prices


def market_view(prices: Mapping[Offering, float], throughput: ThroughputModel,
                risks: Mapping[Offering, RiskEstimate],
                caps: Mapping[Offering, int] | None = None,
                age_shape: AgeShape = AgeShape()) -> MarketView:
    """A :class:`MarketView` of ``prices``: speeds from ``throughput`` (types without a
    prior are left out, and the planner notes them), hazards from ``risks``, the hazard by
    age ``age_shape`` (:func:`pricing.risk.age_shape` of the lifetimes behind them)."""
    speeds: dict[str, float] = {}
    gpus: dict[str, int] = {}
    for itype in sorted({o.instance_type for o in prices}):
        try:
            speeds[itype] = throughput.samples_per_s(itype)
        except KeyError:
            continue
        spec = gpu_spec(itype)
        gpus[itype] = spec.count if spec else 1
    hazards = {o: r.hazard_per_hour for o, r in risks.items() if o.market == "spot"}
    co = {o: r.co_fraction for o, r in risks.items()
          if o.market == "spot" and r.co_fraction is not None}
    return MarketView(prices=dict(prices), speeds=speeds, hazards=hazards,
                      caps=dict(caps or {}), gpus=gpus, co_fraction=co, age_shape=age_shape)


def build_problem(settings: "Settings", quotes: Sequence[PriceQuote],
                  risks: Mapping[Offering, RiskEstimate], *,
                  current: Mapping[Offering, int] = MappingProxyType({}),
                  throughput: ThroughputModel | None = None, now: datetime | None = None,
                  avoid: Collection[str] = (), available: Mapping[Offering, int] =
                  MappingProxyType({}), work_done: float = 0.0,
                  elapsed_hours: float = 0.0) -> Problem:
    """Turn settings, checked quotes and risk estimates into a :class:`Problem`.

    ``avoid`` names zones (``zone`` or ``region/zone``) that just revoked: their spot
    offerings may keep what they hold but not grow, unless every spot zone is avoided.
    ``available`` caps counts (availability traces). For the deadline objective,
    ``work_done``/``elapsed_hours`` give progress and the rate is the planner's pace (the
    deadline less its safety margin). Raises InfeasibleError when the deadline has passed.
    """
    job, obj, opt = settings.job, settings.objective, settings.optimizer
    model = throughput or ThroughputModel(priors=job.throughput_priors,
                                          unit=job.samples_per_s_per_unit)
    prices = latest_prices(quotes, now, timedelta(hours=opt.max_quote_age_hours))
    market = market_view(prices, model, risks, available)
    avoid_set = set(avoid)
    blocked = frozenset(o for o in prices if o.market == "spot" and (
        o.zone in avoid_set or f"{o.region}/{o.zone}" in avoid_set))
    s = plan_settings(settings)
    cands, notes = candidates(market, FleetView(held=dict(current), blocked=blocked), s,
                              unblock_all=True)
    if obj.kind != "deadline":
        return problem_of(cands, s, notes)
    left = max(0.0, (obj.work_samples or 0.0) - work_done)
    hours = (obj.deadline_hours or 0.0) - elapsed_hours
    if left > 0 and hours <= 0:
        raise InfeasibleError(f"objective.deadline_hours = {obj.deadline_hours}: the deadline "
                              f"has passed with {left:.0f} samples left")
    b = s.bounds
    od_rate = od_capacity(cands, b.max_size, b.model_mb, b.global_batch, b.intra_zone_gbps)
    target, floor, _ = pace(left, hours, obj.deadline_hours or 0.0, od_rate, hard=True,
                            safety_hours=s.safety_hours, overhead_h=s.ramp_h)
    return problem_of(cands, s, notes, objective="deadline", target=target, floor=floor)
