"""Zones for real: each zone a network namespace, the zones joined by a bridge whose links
``tc tbf`` slows, the coordinator listening on zone 0's gateway only (tests/fakes/netns.py).

Workers of a zone share its namespace (their all-reduce stays inside it); their gloo
listens on the zone's data address (``--ring-host``). What crosses the slow link is what
the kernel counted leaving each zone: with hybrid aggregation, one update vector per update
(a push to the other zone's shard and a relay of this zone's shard), plus the state sent
once when the first generation forms, and nothing of the zones' own all-reduces.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.fakes.netns import NetnsUnavailable, Zones
from tests.trainer.hybrid.test_hybrid_ring import JOB
from tests.trainer.ringutil import TOKEN, Ring, finish_checksums
from trainer.control.coordinator import Coordinator

pytestmark = pytest.mark.slow


def _vector_bytes() -> int:
    from tests.trainer.hybrid.job import make_job
    from trainer.hybrid.update import UpdateLayout

    return 4 * UpdateLayout(make_job(0).model).numel


def test_two_zones_over_a_slow_link_send_one_vector_per_update_across(tmp_path: Path
                                                                      ) -> None:
    try:
        zones = Zones.create("srhyb", 2, base=70, rate="100mbit")
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    ring = Ring(tmp_path, job=JOB, env={"DIGITS_EPOCHS": "2"})
    try:
        ring.coord.stop()  # the coordinator listens on the gateway the zones reach, only
        ring.coord = Coordinator(zones.gateway, 0, TOKEN, initial_world=4)
        ring.coord.start()
        for name, z in (("a0", 0), ("b0", 1), ("a1", 0), ("b1", 1)):
            ring.worker(name, "--zone", "ab"[z], "--ring-host", zones.data_addr(z),
                        netns=zones.names[z])
            ring.wait_for(f"{name} admitted", lambda name=name: any(
                m.name == name for m in ring.coord.members()), 60)
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 180)
        assert ring.coord.stats()["outcome"] == "done"
        sums = dict(finish_checksums(ring.coord.events()))
        assert len(sums) == 4 and len(set(sums.values())) == 1
        computed = Counter(r["zone"] for r in ring.metrics()
                           if r["own"] and r["member"].startswith(("a0/", "b0/")))
        assert computed[0] > 0 and computed[1] > 0
        state = ring.formed()[0]["bytes"]  # rank 0 (zone a) sent the state to three members
        vec = _vector_bytes()
        for z in (0, 1):
            out = zones.egress_bytes(z)
            carried = computed[z] * vec + (state * 2 // 3 if z == 0 else 0)
            assert 0.95 * carried <= out <= 1.15 * carried + 256 * 1024, (z, out, carried)
    finally:
        ring.close()
        zones.destroy()
