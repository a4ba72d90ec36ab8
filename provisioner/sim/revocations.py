"""Revocations as the data says: removals from count series, lifetimes drawn from hazards.

Design: the simulator revokes a held spot instance in three ways, each read from a trace,
and a policy learns its hazards from the same records (so it never plans for preemptions
the simulator does not apply, nor the reverse):

- **removals** (:class:`Reclaims`): an availability series (a Can't-Be-Late trace, an event
  log, a count series) is the count of a group of instances. Each fall of ``k`` is ``k``
  instances of a group of ``n`` removed; an instance we hold is one of the ``n``, so a
  removal hits ``h`` of our ``m`` with the hypergeometric probability of drawing ``h`` of
  ``m`` marked among ``n`` in ``k`` draws (:func:`hits`). The loader turned the same falls
  into the revoked lifetimes the hazard is learned from (:func:`pricing.sources.trace_io.
  availability_to_records`): ``k`` revocations over ``n`` instance-hours here and there.
  The count is also a capacity cap: what a fall leaves below what we hold is revoked too.
- **drawn events** (:class:`PoolEvents`): an offering with no availability series (prices
  with lifetimes, e.g. the GCP preemptible lifetimes) revokes each instance at the hazard
  :func:`pricing.risk.hazard_rates` gives over all the lifetimes in the traces, the estimate
  the daemon and the policy use (same bases: own, pooled, default), but not one by one:
  its pool's interruption events each take the share :func:`pricing.risk.co_fractions`
  measures of the instances held there, within minutes.
- what a policy learns by time ``t`` is :func:`learned`: the same estimates over
  the lifetimes observable by then (ended ones as recorded, running ones censored at ``t``).

Rule: draws take the caller's seeded ``random.Random``; a :class:`PoolEvents` holds the drawn
events of one run (make one per run); nothing else here keeps state.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from pricing.model import Lifetime, Offering
from pricing.risk import AgeShape, age_shape, co_fractions, hazard_rates


@dataclass(frozen=True)
class Reclaims:
    """The removals of one offering's group: at ``times[i]``, ``removed[i]`` instances of a
    group of ``group[i]`` (its count just before) went (in the world's units: a 1-node
    trace's group is ``max_size`` instances, all removed at once)."""

    times: tuple[float, ...]
    removed: tuple[int, ...]
    group: tuple[int, ...]

    def next_after(self, t: float) -> float | None:
        i = bisect.bisect_right(self.times, t)
        return self.times[i] if i < len(self.times) else None

    def before(self, t: float) -> "Reclaims":
        """The removals strictly before ``t``."""
        i = bisect.bisect_left(self.times, t)
        return Reclaims(self.times[:i], self.removed[:i], self.group[:i])

    def at(self, t: float) -> tuple[int, int] | None:
        """(removed, group) of the removal at exactly ``t``, else None."""
        i = bisect.bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            return self.removed[i], self.group[i]
        return None


def reclaims_of(ends: Iterable[float], before: Sequence[tuple[float, int]],
                scale: int = 1) -> Reclaims:
    """Removals from the end times of revoked lifetimes (one per instance removed) and the
    count series ``before`` (sorted (time, count) records) giving the group's size just
    before each; ``scale`` multiplies both (a 1-node trace read as ``max_size``)."""
    per_time = Counter(ends)
    times = sorted(per_time)
    rec_t = [t for t, _ in before]
    removed, group = [], []
    for t in times:
        i = bisect.bisect_left(rec_t, t) - 1  # the record in force just before t
        n = before[i][1] if i >= 0 else 0
        k = per_time[t]
        removed.append(k * scale)
        group.append(max(n, k) * scale)
    return Reclaims(tuple(times), tuple(removed), tuple(group))


def hits(rng: random.Random, removed: int, group: int, held: int) -> int:
    """How many of the ``held`` instances (part of a group of ``group``) are among
    ``removed`` drawn at random from the group: a hypergeometric draw."""
    held = min(held, group)
    hit = 0
    n, mine = group, held
    for _ in range(min(removed, group)):
        if mine <= 0:
            break
        if rng.random() * n < mine:
            hit += 1
            mine -= 1
        n -= 1
    return hit


def seen_by(lifetimes: Sequence[Lifetime], t: float) -> list[Lifetime]:
    """The lifetimes observable at ``t``: started by then; running ones censored at ``t``."""
    seen: list[Lifetime] = []
    for lt in lifetimes:
        s = lt.start.timestamp()
        if s >= t:
            continue
        if s + lt.seconds <= t:
            seen.append(lt)
        else:
            seen.append(Lifetime(lt.offering, lt.start, t - s, False))
    return seen


@dataclass(frozen=True)
class Learned:
    """What a policy learns from the lifetimes observable at one time (:func:`learned`)."""

    hazards: dict[Offering, float]  # pricing.risk.hazard_rates
    co_fraction: dict[Offering, float]  # pricing.risk.co_fractions
    age_shape: AgeShape  # pricing.risk.age_shape


def learned(lifetimes: Sequence[Lifetime], offerings: Iterable[Offering], t: float) -> Learned:
    """The hazard per offering (:func:`pricing.risk.hazard_rates`), the share of a pool one
    event takes (:func:`pricing.risk.co_fractions`) and the hazard by age
    (:func:`pricing.risk.age_shape`) over the lifetimes observable at ``t`` (started by
    then; running ones censored at ``t``, taken once for the three): what the daemon would
    estimate from the same records had it watched them."""
    seen = seen_by(lifetimes, t)
    offerings = list(offerings)
    return Learned(hazard_rates(offerings, seen), co_fractions(offerings, seen),
                   age_shape(seen))


class PoolEvents:
    """Drawn revocations that come together, as the data says they do: each pool (an
    offering without an availability series) has interruption events at rate
    ``hazard / share`` (a seeded Poisson process, the same for every instance of the pool),
    and each event takes each instance held there with probability ``share``, within
    ``window_s`` of it (:data:`pricing.risk.CO_WINDOW_S`: interruptions of one type in one
    zone come within minutes of each other). Each instance is so revoked at its hazard, and
    instances of one pool are revoked together: half a ring in one zone goes at once.

    ``share`` is :func:`pricing.risk.co_fractions` over the traces' lifetimes (the pool's
    own events, else its type's, else the cloud's default); 1.0 takes the whole pool."""

    def __init__(self, hazards: dict[Offering, float], shares: dict[Offering, float],
                 seed: int, window_s: float, start: float) -> None:
        self.hazards, self.shares, self.seed, self.window_s = hazards, shares, seed, window_s
        self.start = start
        self._times: dict[Offering, list[float]] = {}
        self._rngs: dict[Offering, random.Random] = {}

    def _events_after(self, o: Offering, t: float) -> Iterator[float]:
        """The pool's event times after ``t``, drawn from the world's start as far as they
        are asked for (one seeded stream per pool: the same events for every instance)."""
        h, q = self.hazards.get(o, 0.0), self.shares.get(o, 1.0)
        if h <= 0 or q <= 0:
            return
        times = self._times.setdefault(o, [])
        rng = self._rngs.setdefault(o, random.Random(f"{self.seed}/{o.key}"))

        def extend() -> None:
            times.append((times[-1] if times else self.start) + rng.expovariate(h / q) * 3600.0)

        while not times or times[-1] <= t:
            extend()
        i = bisect.bisect_right(times, t)
        while True:
            while i >= len(times):
                extend()
            yield times[i]
            i += 1

    def death(self, rng: random.Random, o: Offering, launched: float,
              horizon: float) -> float:
        """When an instance of ``o`` launched at ``launched`` is revoked (inf if not before
        ``horizon``): at the first event of its pool that takes it, within the window."""
        q = self.shares.get(o, 1.0)
        for e in self._events_after(o, launched):
            if e > horizon:
                return math.inf
            if rng.random() < q:
                return e + rng.random() * self.window_s
        return math.inf
