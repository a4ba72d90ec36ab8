"""The pricing data model: frozen dataclasses shared by every package.

Design: pure data, input apart from output (SkyPilot ``sky/provision/common.py``). An
:class:`Offering` names *where* capacity can be bought (cloud, region, zone, instance type,
market); quotes, availability samples, lifetimes and risk estimates all refer to one.
Times are timezone-aware UTC ``datetime`` objects; prices are USD per hour.

Rule for callers: never mutate these objects (they are frozen) and never build an
``Offering`` with a naive or empty field; ``__post_init__`` raises ``ValueError`` naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Mapping

CLOUDS = ("aws", "gcp", "local")
MARKETS = ("spot", "on-demand")


def utc(dt: datetime) -> datetime:
    """Return ``dt`` as an aware UTC datetime (naive values are taken as UTC)."""
    if dt.tzinfo is None:
        return dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


@dataclass(frozen=True, order=True)
class Offering:
    """Where capacity is bought: (cloud, region, zone, instance type, market).

    ``zone`` may be ``"*"`` when a source only knows the region (e.g. GCP weekly prices,
    which hold for every zone of the region).
    """

    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str = "spot"

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise ValueError(f"Offering.cloud={self.cloud!r}: must be one of {', '.join(CLOUDS)}")
        if self.market not in MARKETS:
            raise ValueError(f"Offering.market={self.market!r}: must be one of {', '.join(MARKETS)}")
        for name in ("region", "zone", "instance_type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "/" in value:
                raise ValueError(f"Offering.{name}={value!r}: must be a non-empty string without '/'")

    @property
    def key(self) -> str:
        """A stable string key, ``cloud/region/zone/instance_type/market``."""
        return "/".join((self.cloud, self.region, self.zone, self.instance_type, self.market))

    @classmethod
    def from_key(cls, key: str) -> "Offering":
        """Parse :attr:`key` back. Raises ``ValueError`` on a malformed key."""
        parts = key.split("/")
        if len(parts) != 5:
            raise ValueError(f"offering key {key!r}: expected cloud/region/zone/instance_type/market")
        return cls(*parts)

    def with_market(self, market: str) -> "Offering":
        return Offering(self.cloud, self.region, self.zone, self.instance_type, market)

    def __str__(self) -> str:  # readable in logs and tables
        return self.key


@dataclass(frozen=True)
class GpuSpec:
    """The accelerators of one instance type."""

    model: str  # canonical name, e.g. "V100", "A100-40GB", "H100", "L4", "K80"
    count: int
    memory_gib: float | None = None

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"GpuSpec.count={self.count}: must be >= 0")


@dataclass(frozen=True)
class PriceQuote:
    """One observed price of an offering at a time.

    ``price_per_hour`` is the price in the offering's market; ``on_demand_per_hour`` is the
    on-demand price of the same instance type in the same region when known (None if not).
    """

    offering: Offering
    time: datetime
    price_per_hour: float
    on_demand_per_hour: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "time", utc(self.time))

    def age(self, now: datetime) -> timedelta:
        """How old this quote is at ``now``."""
        return utc(now) - self.time

    @property
    def discount(self) -> float | None:
        """1 - spot/on-demand, or None when on-demand is unknown."""
        od = self.on_demand_per_hour
        if od is None or not od or math.isnan(od) or math.isnan(self.price_per_hour):
            return None
        return 1.0 - self.price_per_hour / od


@dataclass(frozen=True)
class Availability:
    """How many instances of an offering could be held at a time.

    For a 1-node trace ``available`` is 0 or 1; for an N-node trace it is the count held out
    of ``capacity`` (N). ``capacity`` is None when unknown.
    """

    offering: Offering
    time: datetime
    available: int
    capacity: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "time", utc(self.time))


@dataclass(frozen=True)
class Lifetime:
    """How long one instance lived. ``revoked`` False means censored (it was still alive
    when observation ended, e.g. GCP's 24 h cap or the end of a trace)."""

    offering: Offering
    start: datetime
    seconds: float
    revoked: bool
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", utc(self.start))


@dataclass(frozen=True)
class Span:
    """The period over which a file observed an offering's availability: outside it the
    count is unknown (not zero, not the last value), so a consumer must not hold a value
    past ``end``."""

    offering: Offering
    start: datetime
    end: datetime
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", utc(self.start))
        object.__setattr__(self, "end", utc(self.end))


@dataclass(frozen=True)
class RiskEstimate:
    """Revocation hazard of an offering, with how it was obtained.

    ``basis`` is one of ``"mle"`` (maximum likelihood from observed lifetimes/preemptions),
    ``"spot-advisor"`` (AWS Spot Advisor interruption band as a prior), ``"pooled"``
    (same GPU/cloud, other zones) or ``"default"`` (no data: a documented default).
    ``samples`` is the number of lifetimes or intervals observed, ``events`` the number of
    revocations among them; ``low``/``high`` bound a 95% interval on the hazard when known.
    """

    offering: Offering
    hazard_per_hour: float
    basis: str
    samples: int = 0
    events: int = 0
    low: float | None = None
    high: float | None = None
    co_fraction: float | None = None  # share of its pool one interruption event takes

    @property
    def mean_lifetime_hours(self) -> float:
        return math.inf if self.hazard_per_hour <= 0 else 1.0 / self.hazard_per_hour


@dataclass(frozen=True)
class Rejection:
    """A record a sanity check or a parser refused, with where it came from and why."""

    reason: str
    location: str  # "file:line", or a source name
    offering: Offering | None = None
    value: float | None = None


@dataclass(frozen=True)
class Signals:
    """What a cloud says about revocation risk beside the revocations observed.

    ``placement``: AWS spot placement scores, (region, zone, instance type) -> 1..10 (the
    zone as the source names it: an AZ name, or an AZ ID); ``preemption_rate``: GCP ``capacityHistory``
    preemption rates, (region, zone or ``*``, machine type) -> the share (0..1) of the spot
    VMs that stopped which were preempted; ``rebalance``: spot offerings -> the time of the
    latest AWS rebalance recommendation on an instance there."""

    placement: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    preemption_rate: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    rebalance: Mapping[Offering, datetime] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.placement or self.preemption_rate or self.rebalance)


@dataclass(frozen=True)
class Snapshot:
    """What a source returns from one fetch: the believable records and the refused ones."""

    quotes: tuple[PriceQuote, ...] = ()
    availability: tuple[Availability, ...] = ()
    lifetimes: tuple[Lifetime, ...] = ()
    gpus: dict[str, GpuSpec] = field(default_factory=dict)  # instance type -> GpuSpec
    rejected: tuple[Rejection, ...] = ()
    notes: tuple[str, ...] = ()  # human-readable remarks (e.g. "prices combined with ...")
    spans: tuple[Span, ...] = ()  # where each availability series was observed
    signals: Signals = field(default_factory=Signals)  # the clouds' risk signals
