"""Revocations as the data says: removals hit held instances with the group's probability,
capacity caps still hold, spans are not extended, and the hazard a policy learns is the one
the simulator draws from."""

from __future__ import annotations

import random

import pytest

from pricing.model import Availability, Lifetime, Offering, PriceQuote, Snapshot, Span
from pricing.risk import hazard_rates
from pricing.sources.trace_io import availability_to_records
from provisioner.errors import UserError
from provisioner.sim.engine import simulate_policy
from provisioner.sim.revocations import hits, learned, reclaims_of
from provisioner.sim.world import build_world
from tests.provisioner.sim.test_simulate import A, B, SPEED, at, params

def group_trace(off: Offering, counts: list[int], hours: float, capacity=None) -> Snapshot:
    """A count series of ``off`` sampled every ``hours`` through the loader's own records."""
    samples = [(at(i * hours), n) for i, n in enumerate(counts)]
    end = at(len(counts) * hours)
    recs, lts = availability_to_records(off, samples, end, capacity, "g.csv")
    return Snapshot(quotes=(PriceQuote(off, at(0), 1.0, 4.0),), availability=tuple(recs),
                    lifetimes=tuple(lts), spans=(Span(off, at(0), end, "g.csv"),))


def test_a_removal_hits_a_held_instance_with_the_probability_the_group_size_implies():
    rng = random.Random(7)
    draws = [hits(rng, 1, 16, 4) for _ in range(40_000)]
    assert sum(draws) / len(draws) == pytest.approx(4 / 16, abs=0.01)
    assert max(draws) == 1
    assert all(hits(rng, 3, 5, 5) == 3 for _ in range(100))  # we are the whole group
    assert all(hits(rng, 2, 8, 0) == 0 for _ in range(100))
    rc = reclaims_of([3600.0, 3600.0, 7200.0], [(0.0, 8), (3600.0, 6), (7200.0, 5)])
    assert rc.at(3600.0) == (2, 8) and rc.at(7200.0) == (1, 6) and rc.next_after(3600.0) == 7200.0


def test_removals_revoke_held_instances_while_the_count_stays_above_what_is_held():
    # A group of 10 loses one instance every hour and regains it at once (10, 9, 10, 9, ...):
    # the count never falls below the 1 instance held, so as a cap it revokes nothing; as
    # removals each fall hits the held one with probability 1/10. Over 40 falls, about 4
    # revocations per run on average (seeded runs: same seed, same result).
    counts = [10, 9] * 20
    world = build_world(group_trace(A, counts, 0.5), SPEED, max_size=4)
    assert len(world.reclaims[A].times) == 20
    runs = [simulate_policy(world, "static-spot", params(), work=1e12, seed=s) for s in range(40)]
    mean = sum(r.revocations for r in runs) / len(runs)
    assert 20 * 0.1 * 0.6 < mean < 20 * 0.1 * 1.4
    again = simulate_policy(world, "static-spot", params(), work=1e12, seed=3)
    assert again.revocations == runs[3].revocations


def test_the_hazard_learned_is_the_one_drawn_from():
    # lifetimes only (no availability): every policy's instances die at the hazard
    # risk.hazard_rates estimates from the lifetimes, 2 revocations in 4 instance-hours =
    # 0.5/h; a policy learns the same figure once the lifetimes are observable.
    lts = (Lifetime(A, at(-10), 3600.0, True), Lifetime(A, at(-10), 7200.0, True),
           Lifetime(A, at(-10), 3600.0, False))
    snap = Snapshot(quotes=(PriceQuote(A, at(0), 1.0, 4.0),), lifetimes=lts)
    world = build_world(snap, SPEED, max_size=4, hours=10)
    assert world.hazard[A] == pytest.approx(0.5) == hazard_rates([A], lts)[A]
    assert learned(lts, [A], at(0).timestamp()).hazards[A] == pytest.approx(0.5)
    # before the lifetimes end only their exposure so far is seen: 3 x 30 minutes, none revoked
    early = learned(lts, [A], at(-9.5).timestamp()).hazards
    assert early[A] == hazard_rates([A], ())[A]  # nothing seen yet: the default, as the daemon


def test_a_trace_that_ends_early_has_no_capacity_after_its_end_and_says_so():
    short = group_trace(A, [2, 2], 1.0)  # 0..2 h
    long = group_trace(B, [2, 2, 2, 2], 1.0)  # 0..4 h
    snap = Snapshot(quotes=short.quotes + long.quotes, availability=short.availability +
                    long.availability, lifetimes=short.lifetimes + long.lifetimes,
                    spans=short.spans + long.spans)
    world = build_world(snap, SPEED, max_size=4)
    assert world.end == at(4).timestamp()
    assert world.available(A, at(1).timestamp()) == 2 and world.available(A, at(3).timestamp()) == 0
    assert any("us-east-1a" in n and "2.0 h before the period's end" in n for n in world.notes)
    assert world.observed[A] == [(at(0).timestamp(), at(2).timestamp())]
    from provisioner.sim.report import _observed_only
    xs, ys = _observed_only([0.0, 2.0], [2.0, 0.0], [(0.0, 2.0)])
    assert ys[1] == 2.0 and ys[-1] != ys[-1]  # observed, then NaN (a gap in the plot, not 0)


def test_a_one_row_availability_is_refused_with_the_fix():
    av = (Availability(A, at(0), 1),)
    snap = Snapshot(quotes=(PriceQuote(A, at(0), 1.0, 4.0),), availability=av,
                    spans=(Span(A, at(0), at(0), "one.csv"),))
    with pytest.raises(UserError, match=r"one.csv: the availability of .* has a single time"):
        build_world(snap, SPEED, max_size=4)


def test_on_demand_override_prices_a_region_whose_spot_zone_is_unknown():
    star = Offering("aws", "us-east-1", "*", "p3.2xlarge", "spot")
    quotes = (PriceQuote(star, at(0), 1.0), PriceQuote(star, at(5), 1.0))
    world = build_world(Snapshot(quotes=quotes), SPEED, max_size=4, hours=5,
                        on_demand={"p3.2xlarge": 3.06})
    assert world.price[star.with_market("on-demand")].at(at(1).timestamp()) == 3.06
    assert not any("no on-demand price" in n for n in world.notes)


def test_drawn_revocations_of_one_pool_come_together_at_the_hazard():
    # a pool at 0.5/h whose events take each instance with probability 0.5 (events at 1/h):
    # every instance is revoked at 0.5/h on its own, and instances of the pool die within
    # 3 minutes of one another when one event takes them
    from provisioner.sim.revocations import PoolEvents
    rng = random.Random(1)
    lives = [PoolEvents({A: 0.5}, {A: 0.5}, seed, 180.0, 0.0).death(rng, A, 0.0, 1e9)
             for seed in range(2000) for _ in range(4)]  # over runs: the mean life is 1/h
    assert sum(lives) / len(lives) / 3600 == pytest.approx(2.0, rel=0.08)
    ev = PoolEvents({A: 0.5}, {A: 0.5}, seed=3, window_s=180.0, start=0.0)
    deaths = [ev.death(rng, A, 0.0, 1e9) for _ in range(4000)]
    first_event = next(ev._events_after(A, 0.0))
    together = [d for d in deaths if first_event <= d <= first_event + 180.0]
    assert len(together) / len(deaths) == pytest.approx(0.5, abs=0.03)
    # the same seed draws the same events for every run; another seed other events
    again = PoolEvents({A: 0.5}, {A: 0.5}, seed=3, window_s=180.0, start=0.0)
    assert next(again._events_after(A, 0.0)) == first_event
    assert next(PoolEvents({A: 0.5}, {A: 0.5}, 4, 180.0, 0.0)._events_after(A, 0.0)) != first_event


def test_spotring_learns_the_hazard_by_age_and_sees_its_instances_age(monkeypatch):
    # The policy is told what the daemon tells the planner: the hazard by age of the
    # lifetimes seen by then (pricing.risk.age_shape) and the age of every instance held.
    from pricing.risk import AgeShape, age_shape
    from provisioner.sim import policies
    lts = tuple(Lifetime(A, at(-10 + i * 0.1), 300.0, True) for i in range(30)) + tuple(
        Lifetime(A, at(-10), 12 * 3600.0, False) for _ in range(4))
    snap = Snapshot(quotes=(PriceQuote(A, at(0), 1.0, 4.0),), lifetimes=lts)
    world = build_world(snap, SPEED, max_size=4, hours=6)
    views = []
    decide = policies.Spotring.decide

    def spy(self, v):
        views.append(v)
        return decide(self, v)

    monkeypatch.setattr(policies.Spotring, "decide", spy)
    simulate_policy(world, "spotring", params(), work=100.0 * 3600 * 4, seed=0)
    first = views[0]
    assert first.age_shape == age_shape(lts[:30] + tuple(
        Lifetime(A, at(-10), 10 * 3600.0, False) for _ in range(4))) != AgeShape()
    later = [v for v in views if v.held]
    assert later and all(sum(len(a) for a in v.ages.values()) == sum(v.held.values())
                         for v in later)
    assert any(a > 3000 for v in later for ages in v.ages.values() for a in ages)
