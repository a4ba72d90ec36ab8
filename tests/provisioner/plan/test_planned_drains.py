"""Issue 33.1: a planned drain (surplus, a move to a cheaper offering, a zone avoided) never
empties the ring. The reconciler launches first and drains the old holder; while its
replacement boots, or has joined but not yet received the state, the daemon's actuator keeps
the holder (:func:`holds_the_ring_alone`, over the coordinator's member view), and the
coordinator itself never applies a drain that leaves no holder: the holder leaves in the
generation after the one where its replacement received the state, 0 steps lost, no resume
from a snapshot. The coordinator is its pure decision (``tests/trainer/control``'s World)."""

from __future__ import annotations

import pytest

from pricing.model import Offering
from provisioner.drivers.identity import holds_the_ring_alone
from provisioner.plan.reconcile import Held, reconcile, zone_of
from tests.trainer.control.test_decide import World
from trainer.control import decide as dc
from trainer.protocol import messages as mb
from trainer.protocol.messages import JobOutcome

A = Offering("local", "r1", "r1-a", "local.v100")
A2 = Offering("local", "r1", "r1-b", "local.v100")
B = Offering("local", "r1", "r1-a", "local.k80")

# path -> (target, held, avoided zones, alternatives): each drains "i-old", the only holder
PATHS = {
    "surplus": ({A: 1}, [Held("i-new", A, 1.0), Held("i-old", A, 5.0)], frozenset(), ()),
    "move": ({B: 1}, [Held("i-old", A, 1.0)], frozenset(), ()),
    "avoid": ({A2: 1}, [Held("i-old", A, 1.0)], frozenset({zone_of(A)}), (A, A2)),
}


def _holder_alone(w: World) -> bool:
    return holds_the_ring_alone("i-old", dc.members(w.ring), [])


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_planned_drain_waits_for_the_replacement_to_hold_the_state(path: str) -> None:
    target, held, avoid, alts = PATHS[path]
    acts = reconcile(target, held, avoid_zones=avoid, alternatives=alts)
    assert [d.instance_id for d in acts.drains] == ["i-old"]
    w = World()
    w.cfg = dc.ControlSettings(heartbeat_timeout_s=5.0, rollcall_s=0.5, initial_world=1)
    old = w.hello(mb.Hello("i-old", 10.0, "job1").to_json())
    for _ in range(2):
        w.tick()
    w.form_all()
    w.beat(old)
    w.tick()
    assert w.ring.holders == {old}
    # the replacement boots: the actuator keeps the holder; the drain sent anyway (a race, a
    # notice) is deferred by the coordinator, which asks for a snapshot once
    assert _holder_alone(w)
    w.ring, _, found = dc.command_drain(w.ring, "i-old", acts.drains[0].reason)
    assert found
    for _ in range(20):
        w.beat(old)
        w.tick()
    assert w.ring.plan.members == (old,) and w.ring.deferred == {old}
    # the replacement joins: a generation with both, in which it receives the state
    new = w.hello(mb.Hello("i-new/0", 10.0, "job1").to_json())
    w.beat(old)
    w.tick()
    assert w.ring.plan.members == (old, new) and w.ring.plan.joined == (new,)
    assert [m.state for m in dc.members(w.ring)] == ["draining", "joining"]
    w.form_all()
    for _ in range(3):
        w.beat(old, new)
        w.tick()
    assert w.ring.plan.members == (new,) and w.ring.plan.drained == (old,)
    assert not w.ring.plan.resume and w.ring.steps_lost == 0
    assert w.ring.outcome is JobOutcome.RUNNING and "resumed" not in w.kinds()



def test_the_actuator_keeps_the_holder_while_its_replacement_has_joined_but_not_formed(
        ) -> None:
    w = World()
    w.cfg = dc.ControlSettings(heartbeat_timeout_s=5.0, rollcall_s=0.5, initial_world=1)
    old = w.hello(mb.Hello("i-old", 10.0, "job1").to_json())
    w.tick()
    w.form_all()
    w.beat(old)
    w.tick()
    new = w.hello(mb.Hello("i-new/0", 10.0, "job1").to_json())
    w.beat(old)
    w.tick()
    assert w.ring.plan.members == (old, new)
    assert _holder_alone(w)  # published with it, but it has not received the state
    w.form_all()
    w.beat(old, new)
    w.tick()
    assert not _holder_alone(w)  # now it holds it: the drain may go
