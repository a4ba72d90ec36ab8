"""Hybrid rings of real worker processes (gloo on CPU), zones given by ``--zone``.

Two scenarios, each a module fixture shared by the tests below (the suite stays fast):

* ``clean``: two zones of two workers train a BatchNorm model (its buffers travel in the
  updates) for two epochs with clipped gradients (``Job.grad_clip``), nothing happens;
* ``elastic``: two zones; the leader of zone b, which serves a parameter-server shard, is
  SIGKILLed at a step; a worker of zone a leaves with notice (SIGTERM); then a joiner
  arrives hot in zone b; a worker of zone b hangs (SIGSTOP: found by its heartbeat,
  dropped, woken, refused, joins again as a new member). The job goes slowly (a pace
  file) until the hung worker is back, so every fault lands before it ends. Every "device"
  holds 40 samples per forward pass (more raises ``torch.OutOfMemoryError``, as CUDA does):
  zone a's survivor of the drain, given the zone's whole 64, runs out of memory; the zone
  discards that update, the member's cap halves, and the same samples are computed again.

And two runs of their own: staleness 0 (the synchronous ring), and both zones killed at
once (their replacements resume from the durable snapshot).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.ringutil import Ring, exported, finish_checksums, per_epoch_counts

pytestmark = pytest.mark.slow

JOB = "tests/trainer/hybrid/job.py"
DIGITS_TRAIN = 1437
ELASTIC_EPOCHS = 8
CLIP = 0.5  # the clean run's Job.grad_clip
TIGHT = 40  # the elastic run's samples per forward pass (a zone of two: 32 each; alone: 64)


def start_in_order(ring: Ring, workers: list[tuple[str, str, tuple[str, ...]]]) -> None:
    """Start ``(name, zone, extra flags)`` one after the other, each admitted before the next
    starts, so the first generation's ranks follow this order."""
    for name, zone, extra in workers:
        ring.worker(name, "--zone", zone, *extra)
        ring.wait_for(f"{name} admitted",
                      lambda name=name: any(m.name == name for m in ring.coord.members()), 60)


def assert_exactly_once(samples: list[dict[str, Any]], epochs: int) -> None:
    counts = per_epoch_counts(samples)
    assert sorted(counts) == list(range(epochs))
    for epoch, c in counts.items():
        dup = sorted(i for i, n in c.items() if n != 1)
        missing = sorted(set(range(DIGITS_TRAIN)) - set(c))
        assert not dup and not missing, (epoch, dup[:10], missing[:10])


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("hybrid-clean")
    ring = Ring(tmp, job=JOB, env={"DIGITS_EPOCHS": "2", "HYBRID_BN": "1",
                                   "HYBRID_CLIP": str(CLIP)}, initial_world=4)
    try:
        out = ("--output", str(tmp / "model.pt"))
        start_in_order(ring, [("a0", "a", out), ("b0", "b", out), ("a1", "a", out),
                              ("b1", "b", out)])
        ring.wait_for("step 2", lambda: ring.coord.stats()["step"] >= 2, 120)
        ring.coord.request_export()  # the trained model, now
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 180)
        codes = {n: p.wait(20) for n, p in ring.procs.items()}
        yield {"codes": codes, "stats": ring.coord.stats(), "events": ring.coord.events(),
               "samples": ring.samples(), "metrics": ring.metrics(),
               "exported": exported(tmp), "logs": ring.logs()}
    finally:
        ring.close()


def test_two_zones_train_to_the_end_with_identical_replicas(clean: dict[str, Any]) -> None:
    assert clean["stats"]["outcome"] == "done" and clean["stats"]["epoch"] == 2
    assert set(clean["codes"].values()) == {0}
    sums = dict(finish_checksums(clean["events"]))
    assert sorted(sums) == ["a0", "a1", "b0", "b1"]
    assert len(set(sums.values())) == 1, sums  # parameters, BatchNorm buffers, Adam state
    assert_exactly_once(clean["samples"], 2)


def test_an_export_request_writes_the_model_while_the_zones_train(clean: dict[str, Any]
                                                                  ) -> None:
    """The hybrid mode honours ``Coordinator.request_export`` through the member skeleton:
    rank 0 (a whole replica) writes the model at its next applied update, once."""
    got = clean["exported"]
    assert len(got) == 1 and got[0][0] == "a0", (got, clean["logs"])
    assert 2 <= got[0][1] < clean["stats"]["step"], got


def test_every_replica_applies_the_same_updates_in_the_same_order(clean: dict[str, Any]
                                                                   ) -> None:
    by_member: dict[str, list[tuple[int, float, int]]] = defaultdict(list)
    for r in clean["metrics"]:
        by_member[r["member"].split("/")[0]].append((r["step"], r["loss"], r["zone"]))
    seqs = [[(s, loss) for s, loss, _ in sorted(v)] for v in by_member.values()]
    assert len(seqs) == 4 and all(s == seqs[0] for s in seqs)
    assert [s for s, _ in seqs[0]] == list(range(1, len(seqs[0]) + 1))


def test_every_replica_clips_every_update_by_the_same_norm(clean: dict[str, Any]) -> None:
    """Job.grad_clip: each replica clips an update as it applies it; the norm (over the
    update's gradients) is the same on all four at every step, and the clipping bit."""
    norms: dict[int, set[float]] = defaultdict(set)
    for r in clean["metrics"]:
        norms[r["step"]].add(r["grad_norm"])
    assert len(norms) >= 20 and all(len(v) == 1 for v in norms.values()), norms
    assert any(v > CLIP for (v,) in norms.values())


def test_both_zones_compute_and_no_update_is_staler_than_the_bound(clean: dict[str, Any]
                                                                   ) -> None:
    own = [r for r in clean["metrics"] if r["own"]]
    computed_by = Counter((r["step"], r["zone"]) for r in own)
    assert {z for _, z in computed_by} == {0, 1}  # both zones took tickets
    assert len({s for s, _ in computed_by}) == len(computed_by)  # each update by one zone
    assert max(r["staleness"] for r in clean["metrics"]) <= 1  # the default bound


def test_shards_carry_equal_loads(clean: dict[str, Any]) -> None:
    last: dict[str, int] = {}
    for r in sorted(clean["metrics"], key=lambda r: r["step"]):
        last.update(r.get("ps_bytes", {}))
    assert sorted(last) == ["0", "1"]
    loads = list(last.values())
    assert min(loads) > 0 and max(loads) * len(loads) / sum(loads) <= 1.10


def test_staleness_zero_runs_the_synchronous_ring(tmp_path: Path) -> None:
    ring = Ring(tmp_path, job=JOB, env={"DIGITS_EPOCHS": "1", "HYBRID_STALENESS": "0"},
                initial_world=2)
    try:
        start_in_order(ring, [("a0", "a", ()), ("b0", "b", ())])
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 120)
        assert ring.coord.stats()["outcome"] == "done"
        metrics = ring.metrics()
        assert metrics and all("staleness" not in r and "zone" not in r for r in metrics)
        assert len({c for _, c in finish_checksums(ring.coord.events())}) == 1
    finally:
        ring.close()


@pytest.fixture(scope="module")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("hybrid-elastic")
    pace = tmp / "pace"  # the job goes slowly until the hung worker is back
    pace.write_text("")
    ring = Ring(tmp, job=JOB, env={"DIGITS_EPOCHS": str(ELASTIC_EPOCHS),
                                   "HYBRID_PACE_FILE": str(pace),
                                   "HYBRID_TIGHT": str(TIGHT)},
                initial_world=4, heartbeat_timeout_s=3.0, rollcall_s=0.5)
    out: dict[str, Any] = {}
    try:
        slow = ("--slowdown", "3")
        start_in_order(ring, [
            ("a0", "a", slow),
            ("b0", "b", (*slow, "--fault", "kill@12")),  # zone b's leader, a shard host
            ("a1", "a", (*slow, "--fault", "term@30")),  # leaves with notice
            ("b1", "b", slow)])  # hangs later
        ring.wait_for("generation 1", lambda: len(ring.formed()) >= 1, 120)
        # the join after the drain: each then forms a generation of its own (started at
        # once, a busy machine's join came with the kill or the drain)
        ring.wait_for("a1 drained", lambda: any(
            e["kind"] == "leave" and e["name"] == "a1" for e in ring.coord.events()), 120)
        ring.worker("b2", "--zone", "b", *slow)  # joins hot
        ring.wait_for("b2 in a formed generation",
                      lambda: any("b2" in e["name"].split(",") for e in ring.events("formed")),
                      120)
        ring.wait_for("b0 lost", lambda: any(e["name"] == "b0" for e in ring.events("lost")),
                      120)
        os.kill(ring.procs["b1"].pid, signal.SIGSTOP)  # a hang
        ring.wait_for("b1 dropped", lambda: sum(e["name"] == "b1"
                                                 for e in ring.events("lost")) >= 1, 120)
        formed_before = len(ring.events("formed"))
        time.sleep(0.5)
        os.kill(ring.procs["b1"].pid, signal.SIGCONT)
        ring.wait_for("b1 back in a formed generation", lambda: any(
            "b1" in e["name"].split(",") for e in ring.events("formed")[formed_before:]), 120)
        pace.unlink()
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 240)
        out["codes"] = {n: p.wait(30) for n, p in ring.procs.items()}
        out.update(stats=ring.coord.stats(), events=ring.coord.events(),
                   formed=ring.formed(), samples=ring.samples(), metrics=ring.metrics(),
                   log=(tmp / "a0.log").read_text(), logs=ring.logs())
        yield out
    finally:
        ring.close()


def test_a_killed_shard_host_a_drain_a_join_and_a_hang_cost_no_run(elastic: dict[str, Any]
                                                                    ) -> None:
    assert elastic["stats"]["outcome"] == "done" and elastic["stats"]["epoch"] == ELASTIC_EPOCHS
    codes = elastic["codes"]
    assert codes["b0"] == -signal.SIGKILL
    assert codes["a1"] == 0 and codes["a0"] == 0 and codes["b2"] == 0 and codes["b1"] == 0
    sums = dict(finish_checksums(elastic["events"]))
    assert {"a0", "b2", "b1"} <= set(sums) and len(set(sums.values())) == 1, sums
    assert all(f["identical"] for f in elastic["formed"]), elastic["formed"]
    leaves = [e for e in elastic["events"] if e["kind"] == "leave" and e["name"] == "a1"]
    assert leaves and "drained" in leaves[0]["detail"]


def test_the_drain_and_the_join_lose_no_update_and_send_state_only_to_the_joiner(
        elastic: dict[str, Any]) -> None:
    gens = {e["generation"]: e["data"] for e in elastic["events"] if e["kind"] == "generation"}
    formed = {f["generation"]: f for f in elastic["formed"]}
    joined = [g for g in formed if g > 1 and gens[g]["joined"] and not gens[g]["lost"]]
    drained = [g for g in formed if gens[g]["drained"] and not gens[g]["lost"]
               and not gens[g]["joined"]]
    assert joined and drained, gens
    for g in joined + drained:
        assert formed[g]["steps_lost"] == 0, formed[g]
    for g in joined:
        assert formed[g]["bytes"] > 0  # the joiner received the state
    for g in drained:
        assert formed[g]["bytes"] == 0  # every member left the generation at one version


def test_each_sample_exactly_once_per_epoch_through_the_faults(elastic: dict[str, Any]
                                                                ) -> None:
    assert_exactly_once(elastic["samples"], ELASTIC_EPOCHS)


def test_out_of_memory_discards_the_update_halves_the_cap_and_computes_it_again(
        elastic: dict[str, Any]) -> None:
    """Zone a's survivor of the drain, alone with the zone's 64 samples, ran out of memory:
    the zone discarded that computation, its cap halved, the same samples were computed
    again in slices; never a job error (the run's end, its exactly-once data and its
    replicas' agreement are asserted by the tests above)."""
    ooms = [(int(a), int(b)) for a, b in re.findall(
        r"out of memory with (\d+) samples per forward pass at step \d+: the step is "
        r"discarded on every member and computed again with at most (\d+)", elastic["log"])]
    assert ooms and all(n > TIGHT and cap == n // 2 for n, cap in ooms), elastic["logs"]
    assert max(r["batch"] for r in elastic["metrics"]) > TIGHT  # shares above it, in slices


def test_no_update_staler_than_the_bound_through_the_faults(elastic: dict[str, Any]) -> None:
    assert max(r["staleness"] for r in elastic["metrics"]) <= 1


def test_every_member_killed_at_once_resumes_from_the_durable_snapshot(tmp_path: Path
                                                                       ) -> None:
    from trainer.state import snapshot as snap

    pace = tmp_path / "pace"  # slowly until both replacements are in
    pace.write_text("")
    ring = Ring(tmp_path, job=JOB, env={"DIGITS_EPOCHS": "4", "HYBRID_PACE_FILE": str(pace)},
                snapshot=snap.SnapshotSettings(str(tmp_path / "snapshots"), every_s=3600.0,
                                               every_steps=10),
                initial_world=2, heartbeat_timeout_s=2.0, rollcall_s=0.5)
    try:
        start_in_order(ring, [("a0", "a", ()), ("b0", "b", ())])
        ring.wait_for("a snapshot", lambda: (ring.coord.stats()["snapshot"] or {}).get(
            "step", 0) >= 10, 120)
        for name in ("a0", "b0"):  # both zones reclaimed: no replica left
            os.kill(ring.procs[name].pid, signal.SIGKILL)
        last = max(m["step"] for m in ring.metrics())
        ring.wait_for("the loss noticed", lambda: any(
            "waiting for members" in e["detail"] for e in ring.events("lost")), 60)
        ring.worker("a1", "--zone", "a")  # the replacements, one per zone
        ring.worker("b1", "--zone", "b")
        ring.wait_for("both replacements in a formed generation", lambda: any(
            set(e["name"].split(",")) >= {"a1", "b1"} for e in ring.events("formed")), 120)
        pace.unlink()
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 240)
        stats = ring.coord.stats()
        assert stats["outcome"] == "done" and stats["epoch"] == 4
        resumed = ring.events("resumed")
        assert len(resumed) == 1
        s = resumed[0]["data"]["step"]
        assert s % 10 == 0 and 10 <= s <= last
        assert all(f["identical"] for f in ring.formed())
        sums = dict(finish_checksums(ring.coord.events()))
        assert sorted(sums) == ["a1", "b1"] and len(set(sums.values())) == 1
        assert ring.procs["a1"].wait(30) == 0 and ring.procs["b1"].wait(30) == 0
    finally:
        ring.close()
