"""The coordinator's decision: one tick of the membership protocol, as a pure function.

Design (after torch elastic's ``_RendezvousJoinOp``, which only reads state and returns an
action): the coordinator thread reads the keys :func:`reads` names from its store into a
:class:`TickReads`, calls :func:`decide`, and applies the returned actions (:class:`Put`,
:class:`Add`, :class:`Delete`, :class:`DeletePrefix`, :class:`Emit`, all in
:mod:`trainer.control.state`). :func:`decide` never blocks, sleeps, mutates its inputs or touches
the store, so every rule below is tested with plain data.

One tick, in order:

1. **Time.** Liveness is judged on the coordinator's own *active* time: a gap between two
   ticks longer than ``MAX_TICK_GAP_S`` (the coordinator itself was paused: a stalled host,
   a stopped process) advances it by ``MAX_TICK_GAP_S`` only, so a pause of the coordinator
   is never taken for the death of every member.
2. **Joins.** A joiner's :class:`~trainer.protocol.messages.Hello` is validated; a malformed one,
   or one of a different job (its fingerprint differs from the ring's), is refused with a
   verdict that says why; the others are admitted and wait for a generation.
3. **Heartbeats, drains, reports.** A member whose heartbeat has not moved for
   ``heartbeat_timeout_s`` of active time is dead. Reports are parsed; a malformed one is
   ignored and counted (never fatal). A member's :class:`~trainer.protocol.messages.JobFailure`
   (the user's code raised) ends the job as failed: it is not a revocation.
4. **Generations.** A failure (``broken/<n>`` bumped, or a dead member) starts a roll call:
   members whose heartbeat does not move within ``rollcall_s`` are dropped (when nobody
   answers, that looks like a stall of this machine: the roll call waits up to the
   heartbeat timeout before dropping everyone). A roll call that every member answers
   re-forms the same set, bounded by :func:`~trainer.control.plans.reform_or_drop`. Otherwise
   a new plan is published only after every member reported the previous one formed.

Rule for callers: call :func:`decide` under the coordinator's lock with a snapshot read
after :func:`reads` of the same state; apply every action, in order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from trainer.control import plans, resume
from trainer.control.plans import Joiner
from trainer.control.state import (  # noqa: F401 - the state and actions, re-exported for callers
    SPEED_POLL_S, Action, Add, Delete, DeletePrefix, Dropped, Emit, Put, ControlState, RollCall,
    ControlSettings, TickReads, Tracked, as_dict, members, stats)
from trainer.errors import Malformed
from trainer.state.training import differing, divergence_message
from trainer.protocol import messages as mb
from trainer.protocol.messages import EventKind, MemberState, JobOutcome, Plan

HANDSHAKE_TIMEOUT_S = 20.0  # a joiner that takes an id and never says hello is forgotten
REFUSED_WATCH_S = 600.0  # how long a dropped member's heartbeat is watched for a wake-up
MAX_TICK_GAP_S = 0.5  # a longer gap between ticks is the coordinator's own pause
KEEP_GENERATIONS = 16  # keys of older generations are deleted from the store
ADOPT_WAIT_S = 3.0  # a restarted coordinator waits this long for every member to report
MAX_NEW_IDS = 1024  # ids taken since the last tick that one tick looks at (a token holder
# bumping the counter by a billion must not make a tick scan a billion ids)


# -- reads --------------------------------------------------------------------------------------


def reads(ring: ControlState, ids: int) -> list[str]:
    """The keys one tick reads, given the current value of the ``ids`` counter."""
    keys = [mb.DRAINS, mb.DONES, mb.ERRORS, mb.STATS, mb.SNAPSHOT, mb.SNAPSHOTS]
    if ring.plan is None:
        keys.append(mb.REPORTS)  # a restarted coordinator: the members' accounts
    keys += [mb.k_hello(i) for i in sorted(set(ring.unseen) | set(
        range(max(ring.scan_from, ids + 1 - MAX_NEW_IDS), ids + 1)))]
    for m in ring.tracked:
        keys += [mb.k_heartbeat(m), mb.k_speed(m), mb.k_drain(m), mb.k_done(m), mb.k_error(m)]
    keys += [mb.k_heartbeat(m) for m in ring.dropped]
    plan = ring.plan
    if plan is not None and plan.members:
        g = plan.generation
        keys += [mb.k_broken(g), mb.k_formed_count(g)]
        keys += [mb.k_formed(g, m) for m in plan.members]
        keys += [mb.k_forming(g, m) for m in plan.members]
        if ring.formed_gen > 0:
            keys.append(mb.k_broken(ring.formed_gen))
        name = resume.resume_name(plan)
        if name:
            keys.append(mb.k_resume_failed(name))
    return keys


# -- the decision ---------------------------------------------------------------------------------


class _Tick:
    """One decision in progress: the evolving state and the actions so far."""

    def __init__(self, ring: ControlState, snap: TickReads, settings: ControlSettings,
                 ids: int) -> None:
        self.r = ring
        self.s = snap
        self.cfg = settings
        self.ids = ids
        self.actions: list[Action] = []

    def set(self, **changes: Any) -> None:
        self.r = replace(self.r, **changes)

    def emit(self, kind: EventKind, name: str, detail: str = "", generation: int | None = None,
             data: Mapping[str, Any] | None = None) -> None:
        self.actions.append(Emit(kind, name, detail, generation, data))

    def malformed(self, what: str, err: Exception) -> None:
        self.set(malformed=self.r.malformed + 1)
        self.emit(EventKind.MALFORMED, what, detail=f"ignored: {err}")

    def put_tracked(self, t: Tracked) -> None:
        self.set(tracked={**self.r.tracked, t.member_id: t})

    def drop_tracked(self, member_id: int) -> Tracked | None:
        t = self.r.tracked.get(member_id)
        if t is not None:
            self.set(tracked={k: v for k, v in self.r.tracked.items() if k != member_id})
        return t


def decide(ring: ControlState, snap: TickReads, settings: ControlSettings, ids: int
           ) -> tuple[ControlState, list[Action]]:
    """One tick (see the module docstring). Returns the new state and the actions to apply."""
    t = _Tick(ring, snap, settings, ids)
    _advance_clock(t)
    _joins(t)
    _heartbeats(t)
    _reports(t)
    if t.r.plan is None and t.r.outcome is JobOutcome.RUNNING:
        _adopt(t)
    if t.r.outcome is JobOutcome.RUNNING:
        _generations(t)
    return t.r, t.actions


def _advance_clock(t: _Tick) -> None:
    last = t.r.last_now
    gap = 0.0 if last is None else max(0.0, t.s.now - last)
    t.set(clock=t.r.clock + min(gap, MAX_TICK_GAP_S), last_now=t.s.now)


def _joins(t: _Tick) -> None:
    r, now = t.r, t.r.clock
    unseen = dict(r.unseen)
    for i in range(max(r.scan_from, t.ids + 1 - MAX_NEW_IDS), t.ids + 1):
        unseen.setdefault(i, now)
    t.set(scan_from=max(r.scan_from, t.ids + 1))
    for i, since in sorted(unseen.items()):
        raw = t.s.get(mb.k_hello(i))
        if raw is None:
            if now - since > HANDSHAKE_TIMEOUT_S:
                del unseen[i]
            continue
        del unseen[i]
        try:
            hello = mb.Hello.parse(raw)
        except Malformed as e:
            t.malformed(f"member {i}", e)
            t.actions.append(Put(mb.k_verdict(i), f"refused: malformed hello ({e})".encode()))
            continue
        if t.r.outcome is not JobOutcome.RUNNING:
            t.actions.append(Put(mb.k_verdict(i), mb.finished_verdict(t.r.outcome)))
            continue
        if t.r.job and hello.job and hello.job != t.r.job:
            t.actions.append(Put(mb.k_verdict(i), b"refused: a different job (its model, "
                                 b"optimiser or batch differ from the ring's); start it with "
                                 b"the ring's --job and --seed"))
            t.emit(EventKind.REFUSED, hello.name, detail=f"member {i}: a different job")
            continue
        if not t.r.job and hello.job:
            t.set(job=hello.job)
        t.actions.append(Put(mb.k_verdict(i), b"ok"))
        t.put_tracked(Tracked(i, hello.name, t.s.wall, samples_per_s=hello.prior, hb=-1,
                              hb_seen=now, device=hello.device, zone=hello.zone))
        t.set(ready=(*t.r.ready, i))
        t.emit(EventKind.JOIN, hello.name, detail=f"admitted as member {i}")
    t.set(unseen=unseen)


def _heartbeats(t: _Tick) -> None:
    now = t.r.clock
    for m, tr in list(t.r.tracked.items()):
        v = t.s.count(mb.k_heartbeat(m))
        if v != tr.hb:
            t.put_tracked(replace(tr, hb=v, hb_seen=now))
    dropped = dict(t.r.dropped)
    for m, d in list(dropped.items()):
        if now - d.when > REFUSED_WATCH_S:
            del dropped[m]
        elif t.s.count(mb.k_heartbeat(m)) != d.hb:
            del dropped[m]
            t.emit(EventKind.REFUSED, d.name, detail=f"member {m} woke up after being dropped; "
                   "it must join again as a new member")
    t.set(dropped=dropped)


def _counter_moved(t: _Tick, key: str) -> bool:
    v = t.s.count(key)
    if v == t.r.seen_counts.get(key, 0):
        return False
    t.set(seen_counts={**t.r.seen_counts, key: v})
    return True


def _new_reports(t: _Tick, counter: str, key: Any, skip: Any, parse: Any,
                 *, keep_malformed: Any = None) -> list[tuple[int, Tracked, Any]]:
    """The reports under ``key(member)`` that are new since ``counter`` last moved: one
    ``(member, tracked, parsed)`` per tracked member not in ``skip``; a malformed one is
    counted and dropped (or replaced by ``keep_malformed``, when given)."""
    if not _counter_moved(t, counter):
        return []
    out = []
    for m, tr in sorted(t.r.tracked.items()):
        raw = t.s.get(key(m))
        if m in skip or raw is None:
            continue
        try:
            out.append((m, tr, parse(raw)))
        except Malformed as e:
            t.malformed(tr.name, e)
            if keep_malformed is not None:
                out.append((m, tr, keep_malformed))
    return out


def _reports(t: _Tick) -> None:
    for m, tr, reason in _new_reports(t, mb.DRAINS, mb.k_drain, t.r.draining, mb.parse_drain,
                                      keep_malformed="drain requested"):
        t.r, emits = _mark_draining(t.r, m, reason)
        t.actions += emits
    for m, tr, done in _new_reports(t, mb.DONES, mb.k_done, t.r.done, mb.Done.parse):
        t.set(done=t.r.done | {m}, done_sums={**t.r.done_sums, m: (done.step, done.checksum)})
        t.emit(EventKind.LEAVE, tr.name, detail=f"finished at step {done.step}",
               data={"finished": True, "step": done.step, "checksum": done.checksum})
        for step, other in t.r.done_sums.values():  # the end: every finished member alike
            if step == done.step and other != done.checksum:
                _diverged(t, divergence_message(differing(other, done.checksum) or ["state"],
                                                f"at the end (step {done.step})"),
                          done.step, t.r.formed_gen)
                break
    for _, tr, err in _new_reports(t, mb.ERRORS, mb.k_error, (), mb.JobFailure.parse):
        if t.r.outcome is not JobOutcome.RUNNING:
            break
        t.set(outcome=JobOutcome.FAILED, failure=err.message)
        t.actions.append(Put(mb.FINISHED, f"failed: {err.message}".encode()))
        t.emit(EventKind.JOB_ERROR, tr.name, detail=err.message, data={"step": err.step})
    raw = t.s.get(mb.STATS)
    if raw is not None and raw not in (b"", b"{}"):
        try:
            t.set(progress=mb.ProgressReport.parse(raw))
        except Malformed as e:
            if t.r.malformed == 0 or t.r.progress.step == 0:
                t.malformed("stats", e)
            else:
                t.set(malformed=t.r.malformed + 1)
    if t.r.clock - t.r.last_speed_poll >= SPEED_POLL_S:
        t.set(last_speed_poll=t.r.clock)
        for m, tr in sorted(t.r.tracked.items()):
            raw = t.s.get(mb.k_speed(m))
            if raw is None:
                continue
            try:
                sp = mb.Speed.parse(raw)
            except Malformed:
                t.set(malformed=t.r.malformed + 1)
                continue
            t.put_tracked(replace(tr, samples_per_s=sp.samples_per_s or tr.samples_per_s,
                                  batch=sp.batch))
    plan = t.r.plan
    if t.r.outcome is JobOutcome.RUNNING and plan is not None and plan.members and (
            all(m in t.r.done for m in plan.members) or _holders_finished(t, plan)):
        t.set(outcome=JobOutcome.DONE)
        t.actions.append(Put(mb.FINISHED, b"done"))
        t.emit(EventKind.FINISHED, ",".join(plan.names), detail="every member finished",
               generation=plan.generation)


def _holders_finished(t: _Tick, plan: Plan) -> bool:
    """Did the state reach the job's end? Every member of ``plan`` that holds the state
    finished (or, having finished some, the others died): joiners that never received the
    state do not count. (A holder finishes at the step boundary where the job ends, before
    it would form a generation published for joiners meanwhile; that generation never forms,
    and its joiners alone are no reason to call the job lost.)"""
    holding = [m for m in plan.members if m in t.r.holders]
    finished = [m for m in holding if m in t.r.done]
    return bool(finished) and all(m in t.r.done or m in _hb_dead(t) for m in holding)


def _drains(t: _Tick, plan: Plan | None, dead: Collection[int] = ()) -> list[int]:
    """The drains of ``plan``'s members to apply now (:func:`plans.drains_now`); the draining
    holders kept because no other member holds the state are recorded, and the first time a
    drain is kept so, rank 0 is asked for a snapshot at once (the final one, should their
    notice window end before a joiner holds the state)."""
    draining = [m for m in t.r.draining if plan is None or m in plan.members]
    if plan is None:
        return draining
    apply, defer = plans.drains_now(plan.members, t.r.holders, draining, dead)
    if defer and not set(defer) <= t.r.deferred:
        t.actions.append(Add(mb.SNAPSHOT_NOW, 1))
        names = [t.r.tracked[m].name if m in t.r.tracked else str(m) for m in defer]
        t.emit(EventKind.DRAIN, "", generation=plan.generation,  # the ring's, no member's
               detail=f"{', '.join(names)} kept until a joiner holds the state or the notice "
               "window ends: no other member holds it; a snapshot is asked for now")
    t.set(deferred=frozenset(defer))
    return apply


def _adopt(t: _Tick) -> None:
    """A restarted coordinator takes over the running ring from its members' reports.

    It waits until every member of the newest plan reported, or ``ADOPT_WAIT_S``; the plan
    is taken as formed (its members hold the state, 0 steps lost); a member that does not
    report is found dead by its heartbeat as usual; one that reports it is not in a formed
    group (its generation broke while the coordinator was away) makes the generation broken,
    so it re-forms. Reported joiners wait for the next generation.
    """
    reports, bad = mb.parse_reports(t.s.get(mb.REPORTS))
    if bad:
        t.set(malformed=t.r.malformed + bad)
    if not reports:
        return
    first = t.r.first_report
    if first is None:
        first = t.r.clock
        t.set(first_report=first)
    by_gen = {}
    for r in reports:
        if r.plan:
            p = Plan.from_json(r.plan)
            by_gen[p.generation] = p
    by_id = {r.member_id: r for r in reports}
    best = by_gen[max(by_gen)] if by_gen else None
    waited = t.r.clock - first  # (never `first or clock`: a first report at 0.0 is one)
    if best is not None and not set(best.members) <= set(by_id) and waited < ADOPT_WAIT_S:
        return
    if best is None and waited < ADOPT_WAIT_S:
        return
    now = t.r.clock
    for r in reports:
        if best is not None and r.member_id in best.members:
            t.put_tracked(Tracked(r.member_id, r.name, t.s.wall, r.prior, hb=-1, hb_seen=now,
                                  state=MemberState.DRAINING if r.draining
                                  else MemberState.ACTIVE, device=r.device, zone=r.zone))
            if r.draining:
                t.set(draining={**t.r.draining, r.member_id: r.draining})
        elif not r.plan:  # an admitted joiner: it waits for the next generation
            t.put_tracked(Tracked(r.member_id, r.name, t.s.wall, r.prior, hb=-1, hb_seen=now,
                                  device=r.device, zone=r.zone))
            t.set(ready=(*t.r.ready, r.member_id))
        if r.job and not t.r.job:
            t.set(job=r.job)
    t.set(first_report=None)
    if best is None:
        return  # only joiners: the next generation is planned as usual
    for m, name in zip(best.members, best.names, strict=True):
        if m not in t.r.tracked:  # never reported: its heartbeat decides
            t.put_tracked(Tracked(m, name, t.s.wall, hb=-1, hb_seen=now,
                                  state=MemberState.ACTIVE))
    g = best.generation
    holders = plans.proven_holders([by_id[m] for m in best.members if m in by_id])
    t.actions += [Add(mb.k_broken(g), 0), Add(mb.k_formed_count(g), 0),
                  Put(mb.k_plan(g), best.to_json().encode()), Put(mb.LATEST, str(g).encode())]
    t.set(plan=best, formed=True, formed_gen=g, holders=holders, adopted=True,
          progress=replace(t.r.progress, step=max(r.step for r in reports)))
    for m in best.members:  # a member that proves nothing is not counted as holding it
        tr = t.r.tracked.get(m)
        if tr is not None and m not in holders and tr.state is MemberState.ACTIVE:
            t.put_tracked(replace(tr, state=MemberState.JOINING))
    t.emit(EventKind.ADOPTED, ",".join(best.names), generation=g,
           detail=f"took over generation {g} from its members' reports", data={
               "reported": sorted(by_id), "members": list(best.members)})
    if holders:  # rank 0's snapshots failed while nobody coordinated: one now
        t.actions.append(Add(mb.SNAPSHOT_NOW, 1))
    # a member whose digest of its step disagrees with the others' (forged, or diverged)
    # never trains on beside them: dropped at once (it joins again as a new member, fresh)
    forged = [m for m in best.members if m in by_id and by_id[m].holds and by_id[m].digest
              and m not in holders and holders]
    if forged:
        _start_rollcall(t, best, forged, "its digest of the state disagrees with the "
                        "other members'")
    elif not holders or any(m in by_id and not by_id[m].formed for m in best.members):
        # it broke while nobody coordinated, or no member proves the state: re-form (a
        # generation of unproven members only resumes from a snapshot, never re-forms them)
        t.actions.append(Add(mb.k_broken(g), 1))



def _hb_dead(t: _Tick) -> set[int]:
    now, limit = t.r.clock, t.cfg.heartbeat_timeout_s
    return {m for m, tr in t.r.tracked.items()
            if m not in t.r.done and now - tr.hb_seen > limit}


def _resume_failures(t: _Tick) -> None:
    """A member that could not load the snapshot its plan resumes from said why: that
    snapshot is never named again (the next older one is)."""
    plan = t.r.plan
    name = resume.resume_name(plan) if plan is not None else ""
    raw = t.s.get(mb.k_resume_failed(name)) if name else None
    if raw is None or name in t.r.failed_snapshots:
        return
    why = raw[:300].decode(errors="replace") or "it could not be loaded"
    t.set(failed_snapshots={**t.r.failed_snapshots, name: why})
    t.emit(EventKind.LOST, "", generation=plan.generation if plan else None,  # no member's
           detail=f"snapshot {name} refused: {why}; the next older one is tried")


def _generations(t: _Tick) -> None:
    _resume_failures(t)
    dead_now = _hb_dead(t)
    for i in [j for j in t.r.ready if j in dead_now]:
        t.set(ready=tuple(j for j in t.r.ready if j != i))
        tr = t.drop_tracked(i)
        t.emit(EventKind.LOST, tr.name if tr else str(i),
               detail=f"joiner {i}: heartbeat stopped before joining")
    for i in [j for j in t.r.ready if j in t.r.draining]:
        t.set(ready=tuple(j for j in t.r.ready if j != i))
        tr = t.drop_tracked(i)
        reason = t.r.draining[i]
        t.set(draining={k: v for k, v in t.r.draining.items() if k != i})
        t.emit(EventKind.LEAVE, tr.name if tr else str(i),
               detail=f"joiner {i} left before joining: {reason}")
    plan = t.r.plan
    if plan is None and t.r.first_report is not None:
        return  # a restarted coordinator gathering the members' reports: no fresh start
    if t.r.rollcall is not None:
        _continue_rollcall(t)
        return
    if plan is not None and plan.members:
        broken = t.s.count(mb.k_broken(plan.generation)) > 0 or (
            # the running generation broke while the next one was forming: its members
            # would wait for a dead peer in the new group, so recover now
            not t.r.formed and t.r.formed_gen > 0
            and t.s.count(mb.k_broken(t.r.formed_gen)) > 0)
        dead = [m for m in plan.members if m in dead_now]
        if broken or dead:
            _start_rollcall(t, plan, dead, "collective failed" if broken else "heartbeat stopped")
            return
        if not t.r.formed:
            if t.s.count(mb.k_formed_count(plan.generation)) >= len(plan.members):
                _on_formed(t, plan)
            else:
                return
    elif plan is not None:
        if plan.resume and t.r.ready:  # every holder was lost: joiners resume the snapshot
            ready = _joiners(t, ())
            _publish(t, Plan(generation=plan.generation + 1,
                             members=tuple(j.member_id for j in ready),
                             names=tuple(j.name for j in ready),
                             joined=tuple(j.member_id for j in ready),
                             priors={mb.member_key(j.name, j.member_id): j.samples_per_s
                                     for j in ready},
                             reason="members to resume from the snapshot", job=plan.job))
            # (no resume named here: _publish names the newest snapshot that has not failed)
        return  # the ring is gone (no member held the state), or waits for members
    draining = _drains(t, plan)
    new = plans.next_plan(plan, _joiners(t, ()), draining, [],
                       initial_world=t.cfg.initial_world, job=t.r.job)
    if new is not None:
        _publish(t, new)


def _joiners(t: _Tick, exclude: tuple[int, ...] | list[int]) -> list[Joiner]:
    return [Joiner(i, t.r.tracked[i].name, t.r.tracked[i].samples_per_s)
            for i in t.r.ready if i not in exclude and i in t.r.tracked]


def _start_rollcall(t: _Tick, plan: Plan, dead: list[int], why: str) -> None:
    if t.s.count(mb.k_broken(plan.generation)) == 0:
        t.actions.append(Add(mb.k_broken(plan.generation), 1))  # everyone abandons it
    base = {m: t.s.count(mb.k_heartbeat(m)) for m in plan.members if m not in dead}
    t.set(formed_gen=0,  # whatever ran before is being replaced: stop watching it
          rollcall=RollCall(plan.generation, why, tuple(dead), base, t.r.clock))
    _continue_rollcall(t)


def _continue_rollcall(t: _Tick) -> None:
    rc, plan = t.r.rollcall, t.r.plan
    assert rc is not None and plan is not None
    pending = {m for m, hb in rc.base.items() if t.s.count(mb.k_heartbeat(m)) == hb}
    waited = t.r.clock - rc.started
    nobody = bool(rc.base) and pending == set(rc.base)
    # nobody answering at all looks like a stall of this machine, not a storm that killed
    # everyone: give them up to the heartbeat timeout before dropping every member
    if pending and (waited < t.cfg.rollcall_s
                    or (nobody and waited < t.cfg.heartbeat_timeout_s)):
        return
    if waited < plans.backoff_s(t.r.failures):
        return  # generations keep failing to form: wait longer before the next one
    t.set(rollcall=None, failures=t.r.failures + 1)
    _recover(t, plan, sorted(set(rc.dead) | pending), rc.why)



def _recover(t: _Tick, plan: Plan, dead: list[int], why: str) -> None:
    ready = _joiners(t, dead)
    draining = _drains(t, plan, dead)
    reason = f"{why}; dropped {dead}" if dead else f"{why}; every member answered"
    if dead or plans.next_plan(plan, ready, draining, []) is not None:
        t.set(reforms=plans.Reforms())
    else:  # the same set again: members that answer but never form must not loop it
        g = plan.generation
        started = [m for m in plan.members if t.s.get(mb.k_forming(g, m)) is not None]
        formed = [m for m in plan.members if t.s.get(mb.k_formed(g, m)) is not None]
        reforms, stuck = plans.reform_or_drop(t.r.reforms, plan, started, formed,
                                           t.r.progress.step)
        t.set(reforms=reforms)
        if stuck:
            dead = sorted(stuck)
            why = (f"answered the roll call but never completed forming generation {g} "
                   f"({plans.MAX_SAME_REFORMS} re-forms of the same set)")
            reason = f"{reason}; dropped {dead}: {why}"
    new = plans.next_plan(plan, ready, draining, dead, reason=reason)
    if new is None:  # everyone answered and nothing else changed: re-form the same set
        new = Plan(generation=plan.generation + 1, members=plan.members, names=plan.names,
                   reason=reason, job=plan.job, fresh_start=plan.fresh_start)
    for m in dead:
        tr = t.r.tracked.get(m)
        name = tr.name if tr else str(m)
        t.set(dropped={**t.r.dropped, m: Dropped(name, t.r.clock,
                                                 t.s.count(mb.k_heartbeat(m)))})
        t.emit(EventKind.LOST, name, detail=f"member {m}: {why}", generation=plan.generation)
    _publish(t, new)


def _snapshots(t: _Tick) -> list[tuple[str, str, int]]:
    """This job's complete snapshots, newest first (:func:`resume.listed`)."""
    return resume.listed(t.s.get(mb.SNAPSHOTS), t.s.get(mb.SNAPSHOT), t.r.job)




def _publish(t: _Tick, new: Plan) -> None:
    g = new.generation
    new = replace(new, backend=plans.choose_backend(
        [t.r.tracked[m].device for m in new.members if m in t.r.tracked]),
        fresh_start=not t.r.holders and not new.resume,
        zones=tuple(t.r.tracked[m].zone if m in t.r.tracked else "" for m in new.members))
    holderless = not set(new.members) & t.r.holders
    listed = _snapshots(t)
    usable = [x for x in listed if x[1] not in t.r.failed_snapshots]
    # the state exists (a holder had it, or a snapshot of it was ever listed): a plan
    # whose members hold none of it resumes the newest snapshot that has not failed; it
    # never starts over from step 1 (issue 30.2: it did, after a failed resume)
    exists = bool(t.r.holders or listed or t.r.failed_snapshots or t.r.progress.step > 0)
    if holderless and not new.resume and (exists or not new.members or t.r.plan is None):
        if usable:  # no member holds the state: the newest snapshot that loads does
            new = replace(new, resume=usable[0][0], fresh_start=False,
                          reason=(new.reason + "; " if new.reason else "")
                          + f"resuming from the snapshot of step {usable[0][2]}")
        elif new.members and exists:
            # the state existed and nobody left holds it (only joiners that never received
            # it): forming them would fail forever (it did, 1,171 times); the job is lost
            lost = sorted(t.r.holders)
            held = (f"it was held by {lost}; the members left, {list(new.members)}, never "
                    "received it" if lost else f"the members, {list(new.members)}, never "
                    "received it")
            new = replace(new, members=(), names=(), joined=(), zones=(), resume="",
                          fresh_start=False, reason=f"no member holding the state is left ({held}), "
                          + resume.no_snapshot_loads(t.r.failed_snapshots))
        elif not new.members and t.r.failed_snapshots:
            new = replace(new, resume="", reason=f"{new.reason}, " + resume.no_snapshot_loads(t.r.failed_snapshots))
    # broken/<n> exists before gen/latest moves: members multi_get it with gen/latest
    t.actions += [Add(mb.k_broken(g), 0), Add(mb.k_formed_count(g), 0),
                  Put(mb.k_plan(g), new.to_json().encode()), Put(mb.LATEST, str(g).encode())]
    old = g - KEEP_GENERATIONS
    if old >= 1:
        t.actions += [DeletePrefix(f"forming/{old}/"), DeletePrefix(f"formed/{old}/"),
                      DeletePrefix(mb.group_prefix(old)), Delete(mb.k_plan(old)),
                      Delete(mb.k_broken(old)), Delete(mb.k_formed_count(old))]
    t.set(plan=new, formed=not new.members,
          ready=tuple(i for i in t.r.ready if i not in new.joined))
    t.set(holders=t.r.holders - set(new.drained) - set(new.lost))
    for i in (*new.drained, *new.lost):
        tr = t.drop_tracked(i)
        t.set(draining={k: v for k, v in t.r.draining.items() if k != i})
        if tr is not None and i in new.drained:
            t.emit(EventKind.LEAVE, tr.name, detail=f"member {i} drained", generation=g)
    for i in new.members:  # a member that does not hold the state yet is still joining
        tr = t.r.tracked[i]  # (the daemon never counts it as the state's holder)
        t.put_tracked(replace(tr, state=MemberState.DRAINING if i in t.r.draining
                              else MemberState.ACTIVE if i in t.r.holders
                              else MemberState.JOINING))
    t.emit(EventKind.GENERATION, ",".join(new.names),
           detail=f"published: {new.reason or 'membership change'}", generation=g,
           data={"members": list(new.members), "joined": list(new.joined),
                 "drained": list(new.drained), "lost": list(new.lost)})
    if not new.members and new.resume:
        t.emit(EventKind.LOST, "", detail=f"every member holding the state is gone; waiting "
               f"for members to resume from the snapshot ({new.reason})", generation=g)
    elif not new.members:
        t.set(outcome=JobOutcome.LOST, failure=new.reason)
        t.actions.append(Put(mb.FINISHED, b"lost"))
        t.emit(EventKind.FINISHED, "", detail=f"the job is lost: {new.reason}", generation=g)


def _on_formed(t: _Tick, plan: Plan) -> None:
    reports: dict[int, mb.Formed] = {}
    for m in plan.members:
        raw = t.s.get(mb.k_formed(plan.generation, m))
        try:
            if raw is None:
                raise Malformed("missing")
            reports[m] = mb.Formed.parse(raw)
        except Malformed as e:
            t.malformed(t.r.tracked[m].name if m in t.r.tracked else str(m), e)
    if len(reports) < len(plan.members):
        return  # a report was malformed: the ring will break or report again; keep waiting
    sums = sorted({r.checksum for r in reports.values()})
    lost = max(r.discarded for r in reports.values())
    step = max(r.step for r in reports.values())
    if plan.resume:  # the steps between the snapshot and the last committed one are lost
        lost = max(0, t.r.progress.step - step)
        t.set(resumed_from=step)
        t.emit(EventKind.RESUMED, ",".join(plan.names),
               detail=f"resumed from the snapshot of step {step}; {lost} steps lost",
               generation=plan.generation, data={"step": step, "steps_lost": lost})
    t.set(failures=0)
    t.set(steps_lost=t.r.steps_lost + lost, formed=True, formed_gen=plan.generation,
          holders=frozenset(plan.members))  # every member of a formed generation holds it
    for m in plan.members:
        tr = t.r.tracked.get(m)
        if tr is not None and tr.state is MemberState.JOINING:
            t.put_tracked(replace(tr, state=MemberState.ACTIVE))
    data = {"checksums": sums, "identical": len(sums) == 1, "steps_lost": lost,
            "step": max(r.step for r in reports.values()),
            "switch_ms": max(r.switch_ms for r in reports.values()),
            "bytes": max(r.bytes for r in reports.values())}  # the source's: all it sent
    t.emit(EventKind.FORMED, ",".join(plan.names),
           detail=f"formed at step {data['step']}" + ("" if data["identical"] else
                                                      "; MEMBERS DIFFER"),
           generation=plan.generation, data=data)
    if not data["identical"]:
        first = reports[plan.members[0]].checksum
        parts = sorted({p for r in reports.values() for p in differing(first, r.checksum)})
        _diverged(t, divergence_message(parts, f"at generation {plan.generation}"),
                  data["step"], plan.generation)


def _diverged(t: _Tick, message: str, step: int, generation: int) -> None:
    """The members' digests differ: the run ends as failed (never trained on silently), the
    generation is marked broken so every member stops and reads the end."""
    if t.r.outcome is not JobOutcome.RUNNING:
        return
    t.set(outcome=JobOutcome.FAILED, failure=message)
    t.actions.append(Put(mb.FINISHED, f"failed: {message}".encode()))
    t.actions.append(Add(mb.k_broken(generation), 1))
    t.emit(EventKind.JOB_ERROR, "", detail=message, data={"step": step})


# -- commands and views -----------------------------------------------------------------------


def command_drain(ring: ControlState, name: str, reason: str
                  ) -> tuple[ControlState, list[Action], bool]:
    """Ask the member called ``name`` to leave at the next step boundary (pure).

    Returns ``(state, actions, found)``; ``found`` is False when no such member exists.
    """
    for m, tr in sorted(ring.tracked.items()):
        if tr.name == name and m not in ring.draining:
            ring, emits = _mark_draining(ring, m, reason)
            return ring, list(emits), True
    return ring, [], False


def _mark_draining(ring: ControlState, member_id: int, reason: str
                   ) -> tuple[ControlState, list[Action]]:
    """``member_id`` drains, and with it every other member of its instance (one worker per
    GPU, :func:`plans.instance_of`): an instance leaves whole, so its members leave in one
    generation, whichever of their drains arrives first (pure)."""
    tr = ring.tracked[member_id]
    inst = plans.instance_of(tr.name)
    out: list[Action] = []
    for m, other in sorted(ring.tracked.items()):
        if m in ring.draining or (m != member_id and plans.instance_of(other.name) != inst):
            continue
        ring = replace(ring, draining={**ring.draining, m: reason},
                       tracked={**ring.tracked, m: replace(other, state=MemberState.DRAINING)})
        out.append(Emit(EventKind.DRAIN, other.name, reason if m == member_id else
                        f"{reason} (its instance {inst} leaves with {tr.name})"))
    return ring, out
