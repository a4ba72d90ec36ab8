"""The coordinator's tick as a pure function: plain data in, state and actions out."""

from __future__ import annotations

import json

from trainer.control import decide as dc
from trainer.control import plans
from trainer.protocol import messages as mb
from trainer.protocol.messages import EventKind, MemberState, JobOutcome

CFG = dc.ControlSettings(heartbeat_timeout_s=5.0, rollcall_s=0.5, initial_world=2)


class World:
    """The store as the coordinator sees it, and a clock, driven tick by tick."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {mb.IDS: b"0"}
        self.now = 100.0
        self.ring = dc.ControlState()
        self.events: list[dc.Emit] = []
        self.cfg = CFG

    def tick(self, dt: float = 0.05) -> list[dc.Action]:
        self.now += dt
        ids = int(self.kv.get(mb.IDS, b"0"))
        snap = dc.TickReads(self.now, 1e9 + self.now,
                           {k: self.kv.get(k) for k in dc.reads(self.ring, ids)})
        self.ring, actions = dc.decide(self.ring, snap, self.cfg, ids)
        for a in actions:
            if isinstance(a, dc.Put):
                self.kv[a.key] = a.value
            elif isinstance(a, dc.Add):
                self.kv[a.key] = str(int(self.kv.get(a.key, b"0")) + a.delta).encode()
            elif isinstance(a, dc.Emit):
                self.events.append(a)
        return actions

    def add(self, key: str, n: int = 1) -> None:
        self.kv[key] = str(int(self.kv.get(key, b"0")) + n).encode()

    def hello(self, raw: bytes | str) -> int:
        self.add(mb.IDS)
        i = int(self.kv[mb.IDS])
        self.kv[mb.k_hello(i)] = raw.encode() if isinstance(raw, str) else raw
        return i

    def beat(self, *ids: int) -> None:
        for i in ids:
            self.add(mb.k_heartbeat(i))

    def form_all(self) -> None:
        plan = self.ring.plan
        assert plan is not None
        for m in plan.members:
            self.kv[mb.k_formed(plan.generation, m)] = mb.Formed("c", 3).to_json().encode()
            self.add(mb.k_formed_count(plan.generation))

    def kinds(self) -> list[str]:
        return [e.kind.value for e in self.events]


def _two_members(w: World) -> tuple[int, int]:
    a = w.hello(mb.Hello("a", 10.0, "job1").to_json())
    b = w.hello(mb.Hello("b", 20.0, "job1").to_json())
    w.tick()
    assert w.kv[mb.k_verdict(a)] == b"ok" and w.ring.plan is not None
    w.form_all()
    w.beat(a, b)
    w.tick()
    assert w.ring.formed
    return a, b


def test_the_first_generation_forms_from_two_valid_hellos() -> None:
    w = World()
    a, b = _two_members(w)
    plan = w.ring.plan
    assert plan.members == (a, b) and plan.job == "job1"
    assert {m.state for m in dc.members(w.ring)} == {MemberState.ACTIVE.value}
    assert "formed" in w.kinds()


def test_a_malformed_hello_is_refused_counted_and_never_wedges_the_coordinator() -> None:
    w = World()
    bad = w.hello(b"\xff not json")
    w.tick()
    assert w.kv[mb.k_verdict(bad)].startswith(b"refused: malformed")
    assert w.ring.malformed == 1 and bad not in w.ring.tracked and not w.ring.unseen
    a, b = _two_members(w)  # the coordinator goes on serving honest joiners
    assert w.ring.plan.members == (a, b)


def test_a_joiner_of_another_job_is_refused_and_says_why() -> None:
    w = World()
    _two_members(w)
    other = w.hello(mb.Hello("x", 5.0, "job2").to_json())
    w.tick()
    assert b"different job" in w.kv[mb.k_verdict(other)]
    assert other not in w.ring.tracked


def test_stats_cannot_end_the_job_and_malformed_stats_are_ignored() -> None:
    w = World()
    a, b = _two_members(w)
    w.kv[mb.STATS] = b'{"finished": true, "step": 7}'
    w.tick()
    assert w.ring.outcome is JobOutcome.RUNNING and w.ring.progress.step == 7
    w.kv[mb.STATS] = b'{"step": "lots"}'
    w.tick()
    assert w.ring.outcome is JobOutcome.RUNNING and w.ring.progress.step == 7
    assert w.ring.malformed >= 1 and not dc.stats(w.ring)["finished"]


def test_a_pause_of_the_coordinator_itself_drops_nobody() -> None:
    w = World()
    a, b = _two_members(w)
    w.tick(dt=30.0)  # the host stalled 30 s: no heartbeat moved, and no tick ran either
    w.tick()
    assert w.ring.rollcall is None and not [e for e in w.events if e.kind is EventKind.LOST]
    w.beat(a, b)
    w.tick()
    assert w.ring.plan.members == (a, b) and w.ring.plan.generation == 1


def test_a_hung_member_is_still_found_while_the_coordinator_runs() -> None:
    w = World()
    a, b = _two_members(w)
    for _ in range(120):  # 6 s of ticks; only a beats
        w.beat(a)
        w.tick()
    lost = [e for e in w.events if e.kind is EventKind.LOST]
    assert [e.name for e in lost] == ["b"] and "heartbeat" in lost[0].detail
    assert w.ring.plan.members == (a,) and w.ring.plan.lost == (b,)


def test_when_every_member_falls_silent_the_roll_call_waits_the_heartbeat_timeout() -> None:
    w = World()
    a, b = _two_members(w)
    w.add(mb.k_broken(1))  # a collective failed and nobody beats any more (a stall?)
    for _ in range(40):  # 2 s: past the roll call, inside the heartbeat timeout
        w.tick()
    assert w.ring.rollcall is not None and w.ring.plan.generation == 1
    w.beat(a, b)  # they were only slow: both answer
    w.tick()
    assert w.ring.rollcall is None and w.ring.plan.members == (a, b)
    assert w.ring.plan.generation == 2 and "every member answered" in w.ring.plan.reason


def test_a_job_error_ends_the_job_as_failed_not_as_a_revocation() -> None:
    w = World()
    a, b = _two_members(w)
    w.kv[mb.k_error(b)] = mb.JobFailure(12, "job x: forward raised ValueError: ...").to_json(
    ).encode()
    w.add(mb.ERRORS)
    w.tick()
    assert w.ring.outcome is JobOutcome.FAILED and w.kv[mb.FINISHED].startswith(b"failed")
    assert "job-error" in w.kinds() and "lost" not in w.kinds()
    assert dc.stats(w.ring)["failure"].startswith("job x")


def test_every_member_done_finishes_the_job() -> None:
    w = World()
    a, b = _two_members(w)
    for m in (a, b):
        w.kv[mb.k_done(m)] = mb.Done("c", 40, {"accuracy": 0.9}).to_json().encode()
        w.add(mb.DONES)
        w.tick()
    assert w.ring.outcome is JobOutcome.DONE and w.kv[mb.FINISHED] == b"done"
    late = w.hello(mb.Hello("late", 1.0, "job1").to_json())
    w.tick()
    assert w.kv[mb.k_verdict(late)].startswith(b"finished")


def test_drain_by_name_publishes_a_generation_without_it() -> None:
    w = World()
    a, b = _two_members(w)
    w.ring, actions, found = dc.command_drain(w.ring, "b", "spot notice")
    assert found and not dc.command_drain(w.ring, "nobody", "x")[2]
    w.tick()
    assert w.ring.plan.members == (a,) and w.ring.plan.drained == (b,)


def test_old_generations_are_deleted_from_the_store() -> None:
    w = World()
    a, b = _two_members(w)
    deletes: list[str] = []
    for _ in range(dc.KEEP_GENERATIONS + 2):
        w.add(mb.k_broken(w.ring.plan.generation))
        w.beat(a, b)
        for _ in range(12):
            w.beat(a, b)
            for act in w.tick():
                if isinstance(act, (dc.Delete, dc.DeletePrefix)):
                    deletes.append(getattr(act, "key", getattr(act, "prefix", "")))
        w.form_all()
        w.tick()
    assert mb.k_plan(1) in deletes and "g1/" in deletes
    assert not any(d in (mb.k_plan(10), mb.k_broken(10)) for d in deletes)


def test_when_no_holder_of_the_state_is_left_the_job_is_lost_at_once_not_reformed() -> None:
    """The only member holding the state hangs while joiners wait: the joiners never received
    it, so forming them would fail forever (it did: 1,171 generations in one run)."""
    w = World()
    a, b = _two_members(w)
    j = w.hello(mb.Hello("j", 1.0, "job1").to_json())
    w.tick()
    assert w.ring.plan.generation == 2 and w.ring.plan.joined == (j,)
    for _ in range(140):  # 7 s: only the joiner beats; a and b hang before gen 2 forms
        w.beat(j)
        w.tick()
    assert w.ring.outcome is JobOutcome.LOST and w.kv[mb.FINISHED] == b"lost"
    assert "never received it" in w.ring.failure
    assert w.ring.plan.members == () and w.ring.plan.generation <= 4
    # the members read the plan that says so: it must parse (it had one zone per joiner)
    assert mb.Plan.from_json(w.kv[mb.k_plan(w.ring.plan.generation)]) == w.ring.plan


def test_until_a_generation_forms_every_plan_is_a_fresh_start() -> None:
    w = World()
    a = w.hello(mb.Hello("a", 10.0, "job1").to_json())
    b = w.hello(mb.Hello("b", 20.0, "job1").to_json())
    w.tick()
    assert w.ring.plan.fresh_start
    w.add(mb.k_broken(1))  # the first generation breaks before it formed
    for _ in range(12):
        w.beat(a, b)
        w.tick()
    assert w.ring.plan.generation == 2 and w.ring.plan.fresh_start  # rank 0 builds it again
    w.form_all()
    w.tick()
    w.add(mb.k_broken(2))
    for _ in range(12):
        w.beat(a, b)
        w.tick()
    assert w.ring.plan.generation == 3 and not w.ring.plan.fresh_start


def _done(w: World, *ids: int, step: int = 40) -> None:
    for m in ids:
        w.kv[mb.k_done(m)] = mb.Done("c", step, {"accuracy": 0.9}).to_json().encode()
        w.add(mb.DONES)


def test_holders_that_finish_while_joiners_wait_end_the_job_done_not_lost() -> None:
    """CI (e2e ctrl-c test, third run): the holders reached ``--until-epochs`` at the step
    boundary where a generation with two joiners was published; they finished without forming
    it, the joiners' forming broke, and the roll call dropped the finished holders: "the job
    was lost ... never received it". The state reached its end: the job is done."""
    w = World()
    a, b = _two_members(w)
    j = w.hello(mb.Hello("j", 1.0, "job1").to_json())
    w.tick()
    assert w.ring.plan.generation == 2 and w.ring.plan.joined == (j,)
    _done(w, a)  # b's report comes later; a and b never form generation 2
    w.tick()
    assert w.ring.outcome is JobOutcome.RUNNING
    _done(w, b)
    for _ in range(160):  # past the heartbeat timeout: only the joiner beats
        w.beat(j)
        w.tick()
    assert w.ring.outcome is JobOutcome.DONE and w.kv[mb.FINISHED] == b"done"
    assert "lost" not in w.kinds()


def test_a_holder_that_finished_and_one_that_died_still_end_the_job_done() -> None:
    w = World()
    a, b = _two_members(w)
    j = w.hello(mb.Hello("j", 1.0, "job1").to_json())
    w.tick()
    _done(w, a)
    for _ in range(160):  # b died at its last step: only the joiner beats
        w.beat(j)
        w.tick()
    assert w.ring.outcome is JobOutcome.DONE


def test_a_drain_of_the_last_holders_waits_for_a_joiner_to_hold_the_state() -> None:
    """30.1 / 33.1: both holders drain (a notice, or the planner's surplus) while a joiner is
    admitted. They stay, the joiner forms a generation with them (it receives the state),
    and only then do they leave: no generation without a holder, a snapshot asked for once."""
    w = World()
    a, b = _two_members(w)
    for m in (a, b):
        w.ring, _, _ = dc.command_drain(w.ring, ["a", "b"][m - a], "spot notice")
    for _ in range(10):  # no joiner yet: they keep training, nothing is published
        w.beat(a, b)
        w.tick()
    assert w.ring.plan.generation == 1 and w.ring.outcome is JobOutcome.RUNNING
    assert w.kv[mb.SNAPSHOT_NOW] == b"1" and w.ring.deferred == {a, b}
    j = w.hello(mb.Hello("j", 1.0, "job1").to_json())
    w.beat(a, b)
    w.tick()
    assert w.ring.plan.members == (a, b, j) and w.ring.plan.joined == (j,)
    assert w.ring.plan.drained == ()
    w.form_all()
    w.beat(a, b, j)
    w.tick()
    w.beat(a, b, j)
    w.tick()
    assert w.ring.plan.members == (j,) and set(w.ring.plan.drained) == {a, b}
    assert not w.ring.plan.resume and w.ring.outcome is JobOutcome.RUNNING
    assert w.kv[mb.SNAPSHOT_NOW] == b"1"  # asked once


def test_a_holder_kept_past_its_notice_dies_and_the_ring_resumes_the_snapshot() -> None:
    w = World()
    a, b = _two_members(w)
    w.kv[mb.SNAPSHOT] = b'{"name": "step-0000000003-00000000", "step": 3, "job": "job1"}'
    for name in ("a", "b"):
        w.ring, _, _ = dc.command_drain(w.ring, name, "spot notice")
    for _ in range(160):  # the notice window ends: both are killed
        w.tick()
    assert w.ring.outcome is JobOutcome.RUNNING and w.ring.plan.members == ()
    assert w.ring.plan.resume  # lost only when every holder and every snapshot is gone


def test_members_of_one_instance_leave_in_one_generation() -> None:
    """One worker per GPU: ``i-1/0`` and ``i-1/1``. A drain of one (its own notice, a tick
    before the other's) drains both, so the instance leaves in one generation."""
    w = World()
    ids = [w.hello(mb.Hello(n, 10.0, "job1").to_json()) for n in ("i-1/0", "i-1/1", "i-2/0")]
    w.tick()
    w.form_all()
    w.beat(*ids)
    w.tick()
    assert w.ring.plan.members == tuple(ids)
    w.kv[mb.k_drain(ids[0])] = b"spot notice"
    w.add(mb.DRAINS)
    w.beat(*ids)
    w.tick()
    assert w.ring.plan.generation == 2 and w.ring.plan.members == (ids[2],)
    assert set(w.ring.plan.drained) == {ids[0], ids[1]}


def _manifest(step: int) -> dict[str, object]:
    return {"name": f"step-{step:010d}-0000000{step % 10}", "step": step, "epoch": 0,
            "samples_done": 0, "bytes": 1, "sha256": "a" * 64, "job": "job1", "time": 1.0}


def test_a_failed_resume_tries_the_older_snapshots_then_stops_naming_each() -> None:
    """30.2: after a coordinator restart (nobody holds the state), a snapshot that does not
    load is reported; the next generation resumes the older one; when none loads the job is
    lost with each snapshot and why, never started over from step 1."""
    w = World()
    w.kv[mb.SNAPSHOTS] = json.dumps([_manifest(30), _manifest(20)]).encode()
    a = w.hello(mb.Hello("a", 10.0, "job1").to_json())
    b = w.hello(mb.Hello("b", 10.0, "job1").to_json())
    w.tick()
    tried = []
    for _ in range(2):
        plan = w.ring.plan
        assert plan.resume and not plan.fresh_start and plan.members == (a, b)
        name = json.loads(plan.resume)["name"]
        tried.append(json.loads(plan.resume)["step"])
        w.kv[mb.k_resume_failed(name)] = b"snapshot: size or digest differs from its manifest"
        w.add(mb.k_broken(plan.generation))
        for _ in range(12):
            w.beat(a, b)
            w.tick()
    assert tried == [30, 20]
    assert w.ring.outcome is JobOutcome.LOST and w.kv[mb.FINISHED] == b"lost"
    assert "step-0000000030-00000000: snapshot: size or digest" in w.ring.failure
    assert "step-0000000020-00000000" in w.ring.failure
    published = [mb.Plan.from_json(w.kv[mb.k_plan(g)])
                 for g in range(1, w.ring.plan.generation + 1)]
    assert not any(p.fresh_start for p in published)  # never from step 1


def test_a_resume_that_breaks_for_another_reason_tries_the_same_snapshot_again() -> None:
    w = World()
    w.kv[mb.SNAPSHOTS] = json.dumps([_manifest(30), _manifest(20)]).encode()
    a = w.hello(mb.Hello("a", 10.0, "job1").to_json())
    b = w.hello(mb.Hello("b", 10.0, "job1").to_json())
    w.tick()
    w.add(mb.k_broken(w.ring.plan.generation))  # a collective failed; nothing about the file
    for _ in range(12):
        w.beat(a, b)
        w.tick()
    assert w.ring.plan.generation == 2 and json.loads(w.ring.plan.resume)["step"] == 30


def _reports(w: World, plan: mb.Plan, *, holds: bool, step: int, formed: bool = True) -> None:
    w.kv[mb.REPORTS] = b"\n".join(
        mb.Report(m, n, plan.to_json(), step, holds=holds, formed=formed).to_json().encode()
        for m, n in zip(plan.members, plan.names))


def test_a_restarted_coordinator_adopts_members_that_prove_the_state() -> None:
    w = World()
    plan = mb.Plan(7, (11, 12), ("a", "b"), job="job1")
    _reports(w, plan, holds=True, step=40)
    w.tick()
    assert w.ring.adopted and w.ring.holders == {11, 12}
    assert w.kv.get(mb.k_broken(7), b"0") == b"0"  # no step lost for the restart
    assert w.kv[mb.SNAPSHOT_NOW] == b"1"  # those missed while it was away: one at once


def test_a_plan_member_that_never_reports_is_waited_for_a_while_then_left_to_its_heartbeat(
        ) -> None:
    """The chaos run's livelock: the daemon was killed while generation 13 formed, one of its
    two members died with it; the survivor and an admitted joiner reported to the restarted
    coordinator on its very first tick (its clock at 0.0). The wait for every member's
    report measured from 0.0 read as "no report yet" (a falsy 0.0): the coordinator waited
    for the dead member forever and no generation was ever published (the ring stood still
    for minutes with three live workers)."""
    w = World()
    plan = mb.Plan(13, (11, 12), ("a", "b"), job="job1")
    w.kv[mb.REPORTS] = b"\n".join([
        mb.Report(11, "a", plan.to_json(), 40, holds=True, formed=False).to_json().encode(),
        mb.Report(21, "j", "", 0).to_json().encode()])  # a joiner the old coordinator admitted
    w.tick()
    assert w.ring.first_report == 0.0 and not w.ring.adopted  # waits for member 12's report
    for _ in range(int(dc.ADOPT_WAIT_S / 0.05) + 20):
        w.beat(11, 21)
        w.tick()
    assert w.ring.adopted and w.ring.holders == {11}
    for _ in range(40):  # 12 never beats: the roll call drops it, 11 and the joiner go on
        w.beat(11, 21)
        w.tick()
    assert w.ring.plan.generation > 13 and w.ring.plan.members == (11, 21)
    assert not w.ring.plan.resume  # from the member that holds the state, not a snapshot


def test_a_member_reporting_a_forged_digest_is_not_adopted_as_a_holder() -> None:
    """30.3: the members report the digest of the newest committed step they hold; one whose
    digest disagrees with the others' at that step (forged, or diverged) is not counted as
    holding the state, and the generation re-forms with the others as the source."""
    w = World()
    plan = mb.Plan(7, (11, 12, 13), ("a", "b", "c"), job="job1")
    digests = {11: "model:aaaa opt:bbbb", 12: "model:aaaa opt:bbbb", 13: "model:ffff opt:bbbb"}
    w.kv[mb.REPORTS] = b"\n".join(
        mb.Report(m, n, plan.to_json(), 40, holds=True, digest=digests[m]).to_json().encode()
        for m, n in zip(plan.members, plan.names))
    w.tick()
    assert w.ring.adopted and w.ring.holders == {11, 12}
    assert w.kv[mb.k_broken(7)] == b"1"  # never trains on beside the forger
    for _ in range(12):
        w.beat(11, 12, 13)
        w.tick()
    nxt = w.ring.plan
    assert nxt.generation == 8 and not nxt.resume  # from the proven holders, not a snapshot
    assert nxt.members == (11, 12) and 13 in nxt.lost  # it joins again fresh, if it can
    assert any("digest" in e.detail for e in w.events if e.kind is mb.EventKind.LOST)


def test_unproven_members_are_not_adopted_as_holders_they_resume_the_snapshot() -> None:
    """30.3: the daemon died during the members' snapshot download; the restarted coordinator
    must not adopt them as holders (every later generation broke: 1,092 in 26 minutes)."""
    w = World()
    w.kv[mb.SNAPSHOTS] = json.dumps([_manifest(30)]).encode()
    plan = mb.Plan(7, (11, 12), ("a", "b"), job="job1")
    _reports(w, plan, holds=False, step=0, formed=False)
    w.tick()
    assert w.ring.adopted and w.ring.holders == frozenset()
    assert w.kv[mb.k_broken(7)] == b"1"
    for _ in range(12):
        w.beat(11, 12)
        w.tick()
    assert w.ring.plan.generation == 8 and json.loads(w.ring.plan.resume)["step"] == 30


def test_generations_that_never_form_back_off() -> None:
    """Members that answer every roll call but never form: the re-forms are bounded (the
    same-set limit drops nobody when nothing tells who is at fault) and spaced out."""
    w = World()
    a, b = _two_members(w)
    gens = []
    for _ in range(1200):  # 60 s of active time; every generation breaks before it forms
        plan = w.ring.plan
        if plan.generation not in gens:
            gens.append(plan.generation)
            w.add(mb.k_broken(plan.generation))
        w.beat(a, b)
        w.tick()
    assert plans.backoff_s(0) == 0 and plans.backoff_s(3) == 1.0
    assert plans.backoff_s(50) == plans.MAX_BACKOFF_S
    assert len(gens) < 20, gens  # without backoff: one every roll call, ~100
