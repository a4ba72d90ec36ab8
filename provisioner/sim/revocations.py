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
- **drawn lifetimes**: an offering with no availability series (prices with lifetimes, e.g.
  the GCP preemptible lifetimes) revokes each instance after an exponential lifetime whose
  hazard is :func:`pricing.risk.hazard_rates` over all the lifetimes in the traces, the
  estimate the daemon and the policy use (same bases: own, pooled, default).
- what a policy learns by time ``t`` is :func:`learned_hazards`: the same estimate over
  the lifetimes observable by then (ended ones as recorded, running ones censored at ``t``).

Rule: draws take the caller's seeded ``random.Random``; nothing here keeps state.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from pricing.model import Lifetime, Offering
from pricing.risk import hazard_rates


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


def lifetime_s(rng: random.Random, hazard_per_hour: float) -> float:
    """An exponential lifetime in seconds (inf for a zero hazard)."""
    return rng.expovariate(hazard_per_hour) * 3600.0 if hazard_per_hour > 0 else math.inf


def learned_hazards(lifetimes: Sequence[Lifetime], offerings: Iterable[Offering],
                    t: float) -> dict[Offering, float]:
    """The hazard per offering :func:`pricing.risk.hazard_rates` gives over the lifetimes
    observable at ``t`` (started by then; running ones censored at ``t``): what the daemon
    would estimate from the same records had it watched them."""
    seen: list[Lifetime] = []
    for lt in lifetimes:
        s = lt.start.timestamp()
        if s >= t:
            continue
        if s + lt.seconds <= t:
            seen.append(lt)
        else:
            seen.append(Lifetime(lt.offering, lt.start, t - s, False))
    return hazard_rates(offerings, seen)
