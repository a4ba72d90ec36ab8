"""What a believable price is, and the reason for refusing one.

Design: a pure filter over quotes (Karpenter keeps the last good data when a refresh is bad;
we go further and refuse each bad quote with a reason). Every source's quotes pass through
:func:`check` before they are stored or optimised over. The rules, in the order applied:

- ``not-finite``: NaN or infinite price (or on-demand price);
- ``non-positive``: price <= 0 (or an on-demand price <= 0);
- ``placeholder``: a value that feeds use to mean "no price" (:data:`PLACEHOLDER_PRICES`);
- ``below-gpu-floor``: an on-demand price per GPU below :data:`MIN_ON_DEMAND_PER_GPU` (or a
  spot price below a tenth of it): the price lacks its GPU component. The real GCP history
  has such rows: ``northamerica-northeast2`` a2 prices of $0.81/h per A100 (2022-2024) and
  the first ``a3-megagpu-8g`` snapshot (2024-08-17) at $10.12/h for 8 H100s, both the
  machine's CPU and memory only;
- ``spot-above-on-demand``: a spot price above the on-demand price of the same type and
  region (AWS spot events do this: p2.16xlarge at $21.22/h against $14.40/h on-demand);
- ``stale``: older than ``max_age`` at ``now``; ``in-future``: more than
  :data:`FUTURE_TOLERANCE` after ``now``.

Rule for callers: never store or use a rejected quote; report ``summarize(rejections)``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from datetime import datetime, timedelta
from typing import Iterable

from pricing.catalog import canonical_gpu, gpu_for
from pricing.model import PriceQuote, Rejection, utc

log = logging.getLogger(__name__)

#: Values price feeds use for "no price": 700.0 is the placeholder the pricing issue reports
#: in GCP pricing.yml exports; 999/9999/99999 are the usual sentinel spellings. Not one of
#: them is a real hourly price of any instance type in the shared data.
PLACEHOLDER_PRICES = frozenset({700.0, 999.0, 9999.0, 99999.0, 999999.0})

#: Lowest believable on-demand price per GPU (USD/h): about half the lowest clean on-demand
#: price per GPU in ../shared/data (GCP weekly history 2022-2026; AWS on-demand list prices:
#: p2.xlarge $0.90, p3.2xlarge $3.06, g4dn.xlarge $0.526, g5.xlarge $1.006, g6.xlarge $0.805,
#: g3s.xlarge $0.75). Clean minima in the GCP file: A100-40GB $3.48, A100-80GB $4.03,
#: H100 $10.98, L4 $0.70, RTX PRO 6000 $4.50 per GPU-hour.
MIN_ON_DEMAND_PER_GPU = {
    "A100-40GB": 1.5, "A100-80GB": 2.0, "H100": 5.0, "H200": 5.0, "L4": 0.35,
    "RTX-PRO-6000": 2.0, "V100": 1.2, "V100-32GB": 1.2, "K80": 0.35, "T4": 0.25, "A10G": 0.5,
    "M60": 0.35, "L40S": 0.9,
}
#: A spot price per GPU below this fraction of the on-demand floor is refused as well.
SPOT_FLOOR_FRACTION = 0.1
#: Clock skew allowed between a source and us before a quote counts as "in the future".
FUTURE_TOLERANCE = timedelta(minutes=5)


def _floor(quote: PriceQuote) -> tuple[float, int] | None:
    spec = gpu_for(quote.offering.instance_type)
    if spec is None or spec.count <= 0:
        return None
    floor = MIN_ON_DEMAND_PER_GPU.get(canonical_gpu(spec.model))
    return None if floor is None else (floor, spec.count)


def reason_for(quote: PriceQuote, *, now: datetime | None = None,
               max_age: timedelta | None = None) -> str | None:
    """The reason ``quote`` is not believable, or None when it is (see the module docstring)."""
    price, od = quote.price_per_hour, quote.on_demand_per_hour
    values = [price] + ([od] if od is not None else [])
    if any(not math.isfinite(v) for v in values):
        return "not-finite"
    if any(v <= 0 for v in values):
        return "non-positive"
    if any(v in PLACEHOLDER_PRICES for v in values):
        return "placeholder"
    floor = _floor(quote)
    if floor is not None:
        per_gpu, count = floor
        od_price = price if quote.offering.market == "on-demand" else od
        if od_price is not None and od_price / count < per_gpu:
            return "below-gpu-floor"
        if quote.offering.market == "spot" and price / count < per_gpu * SPOT_FLOOR_FRACTION:
            return "below-gpu-floor"
    if quote.offering.market == "spot" and od is not None and price > od:
        return "spot-above-on-demand"
    if now is not None:
        age = quote.age(now)
        if max_age is not None and age > max_age:
            return "stale"
        if age < -FUTURE_TOLERANCE:
            return "in-future"
    return None


def check(quotes: Iterable[PriceQuote], *, now: datetime | None = None,
          max_age: timedelta | None = None) -> tuple[list[PriceQuote], list[Rejection]]:
    """Split quotes into ``(accepted, rejections)``; order is kept.

    Each rejection names the reason, where the quote came from (its ``source``, e.g.
    ``file.csv.gz:1234``), the offering and the value. The counts per reason are logged at
    INFO (one line; callers report them to users), every rejection at DEBUG.
    """
    now = utc(now) if now is not None else None
    accepted: list[PriceQuote] = []
    rejections: list[Rejection] = []
    for q in quotes:
        reason = reason_for(q, now=now, max_age=max_age)
        if reason is None:
            accepted.append(q)
            continue
        rejections.append(Rejection(reason, q.source or q.offering.key, q.offering, q.price_per_hour))
        log.debug("rejected quote %s at %s: %s (price %r, on-demand %r)", q.offering, q.source,
                  reason, q.price_per_hour, q.on_demand_per_hour)
    if rejections:
        log.info("rejected %d of %d quotes: %s", len(rejections), len(accepted) + len(rejections),
                    ", ".join(f"{k} {v}" for k, v in summarize(rejections).items()))
    return accepted, rejections


def summarize(rejections: Iterable[Rejection]) -> dict[str, int]:
    """Count rejections per reason, most frequent first."""
    return dict(Counter(r.reason for r in rejections).most_common())
