"""The daemon's view of the market: the last good prices, availability and lifetimes.

Design: data kept apart from its refresh and its schedule (Karpenter's pricing provider):
:meth:`Market.poll` fetches the source, drops implausible quotes (:mod:`pricing.sanity`)
and those the driver cannot place, and keeps the result; a failed poll raises and leaves
the last good view in place. :meth:`Market.view` turns it into the
:class:`~provisioner.plan.pipeline.MarketView` the planner reads: the latest quote per
offering at ``now`` no older than ``optimizer.max_quote_age_hours``, on-demand prices from
spot quotes that carry them, speeds from the throughput model, hazards from
:func:`pricing.risk.estimate` refined by the clouds' signals (placement scores, capacity
history, rebalance recommendations: :func:`pricing.risk.with_signals`), capacity from the
availability records.

Rule: every price change between two polls of a replayed history is recorded
(:meth:`Market.changes_since`), so the spend the state integrates is exact.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Mapping

from pricing import sanity
from pricing.model import Offering, PriceQuote, Signals
from pricing.risk import age_shape, estimate, with_signals
from provisioner.drivers.base import CloudDriver
from provisioner.plan.build import latest_prices, market_view
from provisioner.plan.pipeline import MarketView
from provisioner.plan.throughput import ThroughputModel
from provisioner.daemon.ports import PriceFeed, Replayed


class Market:
    """The last good market view of one daemon (thread-safe)."""

    def __init__(self, source: PriceFeed, driver: CloudDriver, max_age: timedelta,
                 horizon_h: float = 1.0) -> None:
        self.source = source
        self.driver = driver
        self.max_age = max_age
        self.horizon_h = horizon_h  # a rebalance recommendation: a revocation within it
        self.signals = Signals()
        self._lock = threading.Lock()
        self.quotes: list[PriceQuote] = []
        self.available: dict[Offering, int] = {}
        self.lifetimes: tuple = ()
        self.rejected: dict[str, int] = {}
        self._hist_i: int | None = None

    def poll(self, now: datetime) -> None:
        """Fetch the source's view at ``now``; keep what is plausible and placeable."""
        snap = self.source.fetch(now=now)
        quotes, rejected = sanity.check(snap.quotes, now=now, max_age=self.max_age)
        quotes = [q for q in quotes if self.driver.can_place(q.offering)]
        with self._lock:
            self.quotes = quotes
            self.available = {a.offering: a.available for a in snap.availability}
            self.lifetimes = snap.lifetimes
            self.signals = snap.signals
            self.rejected = sanity.summarize(rejected) if rejected else {}

    def changes_since(self, now: datetime) -> list[PriceQuote]:
        """Every quote of a replayed history between the last call and ``now`` (none for a
        live source, and none at the first call)."""
        if not isinstance(self.source, Replayed):
            return []
        history = self.source.history.quotes
        if not history:
            return []
        if self._hist_i is None:
            self._hist_i = bisect.bisect_right([q.time for q in history], now)
            return []
        start = self._hist_i
        while self._hist_i < len(history) and history[self._hist_i].time <= now:
            self._hist_i += 1
        return list(history[start:self._hist_i])

    def price_points(self) -> dict[Offering, tuple[float, float]]:
        """Price per offering now, with the time it took effect; a spot quote carrying its
        on-demand price also prices the on-demand offering (as the planner reads it)."""
        with self._lock:
            quotes = list(self.quotes)
        out: dict[Offering, tuple[float, float]] = {}
        for q in quotes:
            out[q.offering] = (q.time.timestamp(), q.price_per_hour)
        for q in quotes:
            od = q.offering.with_market("on-demand")
            if q.offering.market == "spot" and q.on_demand_per_hour and od not in out:
                out[od] = (q.time.timestamp(), q.on_demand_per_hour)
        return out

    def view(self, throughput: ThroughputModel, now: datetime,
             caps: Mapping[Offering, int],
             rebalance: Mapping[Offering, datetime] | None = None) -> MarketView:
        """The :class:`MarketView` at ``now``; ``caps`` adds to the known availability;
        ``rebalance`` (offering -> time of an AWS rebalance recommendation there) and the
        source's signals refine the hazards (:func:`pricing.risk.with_signals`)."""
        with self._lock:
            quotes, lifetimes = list(self.quotes), self.lifetimes
            available = dict(self.available)
            signals = self.signals
        prices = latest_prices(quotes, now, self.max_age)
        if rebalance:
            signals = replace(signals, rebalance={**signals.rebalance, **rebalance})
        risks = with_signals(estimate(set(prices), lifetimes), signals, now=now,
                             horizon_h=self.horizon_h)
        available.update(caps)
        return market_view(prices, throughput, risks, available, age_shape(lifetimes))
