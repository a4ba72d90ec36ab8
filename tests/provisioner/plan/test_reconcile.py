"""Reconciler: pure target-vs-actual decisions with churn limits and zone avoidance."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pricing.model import Offering
from provisioner.plan.reconcile import ChurnLimits, Held, reconcile, zone_of
from provisioner.timing import Intervals, TtlCache

A = Offering("local", "r1", "r1-a", "local.v100")
A2 = Offering("local", "r1", "r1-b", "local.v100")
B = Offering("local", "r1", "r1-a", "local.k80")


def test_deficit_launches_and_surplus_drains_newest_first():
    held = [Held("i-1", A, 1.0), Held("i-2", A, 5.0), Held("i-3", B, 2.0)]
    acts = reconcile({A: 1, B: 3}, held)
    assert [(d.instance_id, d.offering) for d in acts.drains] == [("i-2", A)]
    assert [(l.offering, l.count) for l in acts.launches] == [(B, 2)]
    assert acts.terminations == ()


def test_pending_surplus_is_terminated_not_drained():
    acts = reconcile({}, [Held("i-1", A, 1.0, running=False), Held("i-2", A, 0.0)])
    assert [t.instance_id for t in acts.terminations] == ["i-1"]
    assert [d.instance_id for d in acts.drains] == ["i-2"]


def test_draining_instance_gets_a_replacement_in_parallel():
    held = [Held("i-1", A, 1.0, draining=True), Held("i-2", A, 2.0)]
    acts = reconcile({A: 2}, held)
    assert [(l.offering, l.count) for l in acts.launches] == [(A, 1)]
    assert not acts.drains


def test_in_flight_launches_count_as_held():
    assert reconcile({A: 2}, [], in_flight={A: 2}).empty


def test_churn_limits_cap_each_round():
    acts = reconcile({A: 10}, [], limits=ChurnLimits(max_launches=3, max_removals=1))
    assert sum(l.count for l in acts.launches) == 3 and "deferred" in acts.notes[0]
    held = [Held(f"i-{k}", B, k) for k in range(4)]
    acts = reconcile({}, held, limits=ChurnLimits(max_launches=3, max_removals=1))
    assert [d.instance_id for d in acts.drains] == ["i-3"]


def test_revoked_zone_avoided_while_another_exists():
    acts = reconcile({A: 1}, [], avoid_zones=frozenset({zone_of(A)}), alternatives=[A, A2])
    assert acts.launches[0].offering == A2 and "revoked" in acts.launches[0].reason
    # no other zone offers the type: the avoided zone is still used
    acts = reconcile({B: 1}, [], avoid_zones=frozenset({zone_of(B)}), alternatives=[A, A2, B])
    assert acts.launches[0].offering == B


def test_out_of_capacity_fails_over_or_skips():
    acts = reconcile({A: 1}, [], unavailable=frozenset({A}), alternatives=[A2])
    assert acts.launches[0].offering == A2
    acts = reconcile({B: 1}, [], unavailable=frozenset({B}), alternatives=[A2])
    assert acts.launches == () and "no capacity" in acts.notes[0]


def test_ttl_cache_expires_with_injected_clock():
    now = [0.0]
    c = TtlCache(10, lambda: now[0])
    c.add("z")
    assert "z" in c and c.expiry("z") == 10.0 and c.expiry("y") is None
    now[0] = 9.9
    assert c.members() == {"z"}
    c.add("z", 5.0)  # extended: it expires 5 s from now
    assert c.expiry("z") == pytest.approx(14.9)
    now[0] = 14.9
    assert "z" not in c and c.members() == frozenset() and c.expiry("z") is None
    assert Intervals(plan_s=30).real(30, speed=60) == 0.5 and Intervals().real(1, 1000) == 0.1


offs = st.sampled_from([A, A2, B])


@settings(max_examples=150, deadline=None)
@given(target=st.dictionaries(offs, st.integers(0, 5)),
       held=st.lists(st.tuples(offs, st.booleans()), max_size=10))
def test_unlimited_reconcile_reaches_target(target, held):
    hs = [Held(f"i-{k}", o, float(k), draining=d) for k, (o, d) in enumerate(held)]
    acts = reconcile(target, hs, limits=ChurnLimits(100, 100))
    removed = {r.instance_id for r in acts.drains + acts.terminations}
    after = {o: 0 for o in (A, A2, B)}
    for h in hs:
        if not h.draining and h.id not in removed:
            after[h.offering] += 1
    for l in acts.launches:
        after[l.offering] += l.count
    assert all(after[o] == target.get(o, 0) for o in after)
    assert not any(h.draining and h.id in removed for h in hs)
