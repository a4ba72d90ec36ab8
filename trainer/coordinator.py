"""The coordinator: the membership protocol of :mod:`trainer.membership` served over a TCPStore.

Design: the coordinator owns a master ``torch.distributed.TCPStore`` and one background
thread that polls it (every ``poll_s`` while something is in flight, every
``STEADY_POLL_S`` otherwise): it answers join handshakes (HMAC challenge), watches
heartbeat counters with its own clock, collects drain requests and progress reports, and
publishes generations. At most one generation is in flight: a new plan is published only
after every member reported the previous one formed, except after a failure, which always
wins. On a failure (a member bumped ``broken/<n>``, or a heartbeat stopped) it takes a roll
call: members whose heartbeat does not move within ``rollcall_s`` are dropped, the others
form the next generation (when nobody answers, the roll call waits up to the heartbeat
timeout before dropping everyone, which would stop the job). A dropped member that wakes
up is refused (logged as ``refused``) and must join again as a new member. A roll call that
every member answers re-forms the same set; :func:`trainer.membership.reform_or_drop`
bounds that (a member that answers but never forms is dropped after a few re-forms), so no
member can keep the ring re-forming forever.

One tick reads everything it watches (the join counter, every member's heartbeat, the
report counters, ``stats``, the running generation's ``broken`` and ``formedn`` counters) in
ONE ``multi_get`` round trip: every watched counter is created (``add(key, 0)``) the first
time it is watched, because ``multi_get`` waits for missing keys. A counter read outside the
snapshot costs its own round trip. On a 2-core machine the coordinator's polling competes
with the workers for CPU, so its cost per tick matters (it was ~8 round trips).

It is embeddable (the provisioner daemon calls :meth:`Coordinator.start` / :meth:`stop` and
:meth:`drain` by worker name) and runs standalone as ``python -m trainer coordinator``.

Rule for callers: the coordinator never trains and holds no model state; losing it stops
reconfiguration (the ring keeps its current generation until a step needs the store).
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.distributed import TCPStore

from trainer import membership as mb
from trainer.membership import Joiner, MemberInfo, Plan

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 20.0  # a joiner that starts a handshake and never finishes is forgotten
SPEED_POLL_S = 0.5  # how often members' reported samples/s are read
REFUSED_WATCH_S = 600.0  # how long a dropped member's heartbeat is watched for a wake-up
STEADY_POLL_S = 0.05  # tick period while nothing is in flight: a kill is seen 30 ms later at
# worst (members abandon a broken collective on their own); the ticks' CPU is the workers'
DRAINS, DONES = "drains", "dones"  # counters workers bump after a drain request / when done


@dataclass
class _Tracked:
    member_id: int
    name: str
    joined_at: float
    samples_per_s: float = 0.0
    batch: int = 0
    hb: int = -1
    hb_seen: float = 0.0
    state: str = "joining"  # joining | active | draining


class Coordinator:
    """Membership of one training job (see the module docstring)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: bytes = b"",
        *,
        heartbeat_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rollcall_s: float = 0.5,
        initial_world: int = 1,
        poll_s: float = 0.02,
    ) -> None:
        if not token:
            raise ValueError("token: empty; pass the job token (bytes) read from the token file")
        if heartbeat_timeout_s <= 0 or rollcall_s <= 0 or poll_s <= 0:
            raise ValueError("heartbeat_timeout_s, rollcall_s and poll_s must be positive")
        self._host, self._port, self._token = host, port, token
        self._hb_timeout = heartbeat_timeout_s
        self._clock = clock
        self._rollcall_s = rollcall_s
        self._initial_world = initial_world
        self._poll_s = poll_s
        self._store: TCPStore | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # membership state (guarded by _lock for readers in other threads)
        self._plan: Plan | None = None
        self._formed = True
        self._formed_gen = 0  # the newest generation every member reported formed
        self._tracked: dict[int, _Tracked] = {}  # members of the newest plan + admitted joiners
        self._ready: list[int] = []  # admitted joiners, oldest first
        self._draining: dict[int, str] = {}
        self._handshakes: dict[int, tuple[str, float, dict[str, Any]]] = {}
        self._scan_from = 1
        self._unseen: dict[int, float] = {}
        self._dropped: dict[int, tuple[str, float, int]] = {}  # id -> name, when, last hb
        self._events: list[dict[str, Any]] = []
        self._stats: dict[str, Any] = {"generation": 0, "step": 0, "epoch": 0,
                                       "samples_done": 0, "world": 0, "steps_lost": 0,
                                       "finished": False}
        self._drain_count = 0
        self._done_count = 0
        self._done: set[int] = set()
        self._last_speed_poll = 0.0
        self._reforms = mb.Reforms()  # same-set re-forms in a row (see mb.reform_or_drop)
        self._made: set[str] = set()  # counters known to exist (multi_get needs them)
        self._snap: dict[str, bytes] = {}  # this tick's values of the watched keys

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Open the store and start the protocol thread. Returns once the port is bound."""
        self._store = TCPStore(self._host, self._port, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=30))
        self._store.add(mb.LATEST, 0)
        self._store.add(mb.IDS, 0)
        self._store.add(DRAINS, 0)
        self._store.add(DONES, 0)
        self._store.set(mb.STATS, "{}")
        self._thread = threading.Thread(target=self._run, name="spotring-coordinator",
                                        daemon=True)
        self._thread.start()
        log.info("coordinator listening", extra={"address": self.address})

    def stop(self) -> None:
        """Stop the protocol thread and close the store (workers then lose the coordinator)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._store = None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the store listens on (the real port when started with port 0)."""
        if self._store is None:
            raise RuntimeError("coordinator not started")
        return self._host, int(self._store.port)

    # -- queries and commands ----------------------------------------------------------------

    def drain(self, member_name: str, reason: str) -> bool:
        """Ask the member called ``member_name`` to leave at the next step boundary.

        Returns True when such a member (or admitted joiner) exists; False otherwise.
        """
        with self._lock:
            for t in self._tracked.values():
                if t.name == member_name and t.member_id not in self._draining:
                    self._draining[t.member_id] = reason
                    t.state = "draining"
                    self._event("drain", t.name, detail=reason)
                    return True
        return False

    def members(self) -> list[MemberInfo]:
        """Members of the newest generation and admitted joiners, by id."""
        with self._lock:
            gen = self._plan.generation if self._plan else 0
            return [
                MemberInfo(id=t.member_id, name=t.name,
                           generation=gen if t.state != "joining" else 0, batch=t.batch,
                           samples_per_s=t.samples_per_s, state=t.state,
                           joined_at=t.joined_at)
                for t in sorted(self._tracked.values(), key=lambda t: t.member_id)
            ]

    def stats(self) -> dict[str, Any]:
        """Progress: generation, step, epoch, samples_done, world, loss/accuracy, steps_lost."""
        with self._lock:
            return dict(self._stats)

    def events(self) -> list[dict[str, Any]]:
        """Every membership event so far: ``{time, kind, name, generation, detail}``."""
        with self._lock:
            return [dict(e) for e in self._events]

    def plan(self) -> Plan | None:
        """The newest published generation (None before the first)."""
        with self._lock:
            return self._plan

    # -- the protocol thread -----------------------------------------------------------------

    def _event(self, kind: str, name: str, detail: str = "", generation: int | None = None
               ) -> None:
        gen = generation if generation is not None else (
            self._plan.generation if self._plan else 0)
        e = {"time": time.time(), "kind": kind, "name": name, "generation": gen,
             "detail": detail}
        self._events.append(e)
        log.info("ring event %s %s: %s", kind, name, detail,
                 extra={"kind": kind, "member": name, "generation": gen})

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                with self._lock:
                    self._tick()
            except Exception:  # noqa: BLE001 - keep serving; the error is logged
                log.exception("coordinator tick failed")
            self._stopping.wait(self._poll_s if self._busy() else max(self._poll_s,
                                                                       STEADY_POLL_S))

    def _busy(self) -> bool:
        """Is anything in flight (a generation forming, a join, a drain)? Then tick fast."""
        return bool(not self._formed or self._unseen or self._handshakes or self._ready
                    or self._draining)

    def _watched(self) -> list[str]:
        """The counters one tick reads (created here the first time they are watched)."""
        keys = [mb.IDS, DRAINS, DONES]
        keys += [mb.k_heartbeat(m) for m in self._tracked]
        keys += [mb.k_heartbeat(m) for m in self._dropped]
        if self._plan is not None and self._plan.members:
            gen = self._plan.generation
            keys += [mb.k_broken(gen), f"formedn/{gen}"]
            if self._formed_gen > 0:
                keys.append(mb.k_broken(self._formed_gen))
        store = self._store
        assert store is not None
        for k in keys:
            if k not in self._made:
                store.add(k, 0)
                self._made.add(k)
        return keys

    def _count(self, key: str) -> int:
        """A counter's value: from this tick's snapshot, else one round trip."""
        v = self._snap.get(key)
        if v is None:
            assert self._store is not None
            return int(self._store.add(key, 0))
        return int(v)

    def _tick(self) -> None:
        store = self._store
        assert store is not None
        keys = self._watched() + [mb.STATS]
        self._snap = dict(zip(keys, store.multi_get(keys), strict=True))
        try:
            self._tick_on_snapshot()
        finally:
            self._snap = {}

    def _tick_on_snapshot(self) -> None:
        self._poll_joins()
        self._poll_heartbeats()
        self._poll_reports()
        self._advance()

    def _poll_joins(self) -> None:
        store = self._store
        assert store is not None
        now = self._clock()
        top = self._count(mb.IDS)
        for i in range(self._scan_from, top + 1):
            self._unseen.setdefault(i, now)
        self._scan_from = top + 1
        for i, since in list(self._unseen.items()):
            if store.check([mb.k_hello(i)]):
                del self._unseen[i]
                hello = json.loads(store.get(mb.k_hello(i)))
                nonce = secrets.token_hex(16)
                self._handshakes[i] = (nonce, now, hello)
                store.set(mb.k_nonce(i), nonce)
            elif now - since > HANDSHAKE_TIMEOUT_S:
                del self._unseen[i]
        for i, (nonce, since, hello) in list(self._handshakes.items()):
            name = str(hello.get("name", f"worker-{i}"))
            if store.check([mb.k_proof(i)]):
                del self._handshakes[i]
                proof = store.get(mb.k_proof(i)).decode()
                if self._finished():
                    store.set(mb.k_verdict(i), "finished: the job is over")
                elif mb.check_proof(self._token, i, name, nonce, proof):
                    store.set(mb.k_verdict(i), "ok")
                    self._tracked[i] = _Tracked(i, name, time.time(),
                                                samples_per_s=float(hello.get("prior", 0.0)),
                                                hb=-1, hb_seen=now)
                    self._ready.append(i)
                    self._event("join", name, detail=f"admitted as member {i}")
                else:
                    store.set(mb.k_verdict(i), "refused: bad token proof")
                    self._event("refused", name, detail=f"member {i}: wrong token (HMAC proof)")
            elif now - since > HANDSHAKE_TIMEOUT_S:
                del self._handshakes[i]

    def _poll_heartbeats(self) -> None:
        store = self._store
        assert store is not None
        now = self._clock()
        for t in self._tracked.values():
            v = self._count(mb.k_heartbeat(t.member_id))
            if v != t.hb:
                t.hb, t.hb_seen = v, now
        for i, (name, when, last) in list(self._dropped.items()):
            if now - when > REFUSED_WATCH_S:
                del self._dropped[i]
                continue
            v = self._count(mb.k_heartbeat(i))
            if v != last:
                del self._dropped[i]
                self._event("refused", name, detail=f"member {i} woke up after being dropped; "
                            "it must join again as a new member")

    def _poll_reports(self) -> None:
        store = self._store
        assert store is not None
        drains = self._count(DRAINS)
        if drains != self._drain_count:
            self._drain_count = drains
            for t in self._tracked.values():
                if t.member_id not in self._draining and store.check([mb.k_drain(t.member_id)]):
                    self._draining[t.member_id] = store.get(mb.k_drain(t.member_id)).decode()
                    t.state = "draining"
                    self._event("drain", t.name, detail=self._draining[t.member_id])
        done = self._count(DONES)
        if done != self._done_count:
            self._done_count = done
            for t in list(self._tracked.values()):
                if t.member_id not in self._done and store.check([mb.k_done(t.member_id)]):
                    self._done.add(t.member_id)
                    self._event("leave", t.name, detail="finished: "
                                + store.get(mb.k_done(t.member_id)).decode())
        try:
            s = json.loads(self._snap.get(mb.STATS) or store.get(mb.STATS))
        except ValueError:
            s = {}
        for k, v in s.items():
            if k != "steps_lost":
                self._stats[k] = v
        if self._plan and self._done and all(m in self._done for m in self._plan.members):
            if not self._stats.get("finished"):
                self._stats["finished"] = True
                store.set(mb.FINISHED, "done")
        now = self._clock()
        if now - self._last_speed_poll >= SPEED_POLL_S:
            self._last_speed_poll = now
            for t in self._tracked.values():
                if store.check([mb.k_speed(t.member_id)]):
                    sp = json.loads(store.get(mb.k_speed(t.member_id)))
                    t.samples_per_s = float(sp.get("samples_per_s", t.samples_per_s))
                    t.batch = int(sp.get("batch", t.batch))

    def _finished(self) -> bool:
        return bool(self._stats.get("finished"))

    def _hb_dead(self) -> list[int]:
        now = self._clock()
        return [t.member_id for t in self._tracked.values()
                if t.member_id not in self._done and now - t.hb_seen > self._hb_timeout]

    def _advance(self) -> None:
        store = self._store
        assert store is not None
        plan = self._plan
        if self._finished():
            return
        # Admitted joiners that died while waiting are forgotten.
        dead_now = set(self._hb_dead())
        for i in [j for j in self._ready if j in dead_now]:
            self._ready.remove(i)
            t = self._tracked.pop(i)
            self._event("lost", t.name, detail=f"joiner {i}: heartbeat stopped before joining")
        for i in [j for j in self._ready if j in self._draining]:
            self._ready.remove(i)  # a joiner told to leave before it joined: just forget it
            t = self._tracked.pop(i)
            self._event("leave", t.name, detail=f"joiner {i} left before joining: "
                        f"{self._draining.pop(i)}")
        if plan is not None and plan.members:
            broken = self._count(mb.k_broken(plan.generation)) > 0 or (
                # the running generation broke while the next one was forming: its members
                # would wait for a dead peer in the new group, so recover now
                not self._formed and self._formed_gen > 0
                and self._count(mb.k_broken(self._formed_gen)) > 0)
            dead_members = [m for m in plan.members if m in dead_now]
            if broken or dead_members:
                self._recover(plan, dead_members, "collective failed" if broken
                              else "heartbeat stopped")
                return
            if not self._formed:
                if self._count(f"formedn/{plan.generation}") >= len(plan.members):
                    self._on_formed(plan)
                else:
                    return
        elif plan is not None:
            return  # the ring is gone (no member held the state)
        draining = [m for m in self._draining if plan is None or m in plan.members]
        ready = [Joiner(i, self._tracked[i].name, self._tracked[i].samples_per_s)
                 for i in self._ready]
        new = mb.next_plan(plan, ready, draining, [], initial_world=self._initial_world,
                           reason="")
        if new is not None:
            self._publish(new)

    def _recover(self, plan: Plan, dead: list[int], why: str) -> None:
        store = self._store
        assert store is not None
        self._formed_gen = 0  # whatever ran before is being replaced: stop watching it
        if store.add(mb.k_broken(plan.generation), 0) == 0:
            store.add(mb.k_broken(plan.generation), 1)  # everyone abandons the collective
        start = self._clock()
        base = {m: store.add(mb.k_heartbeat(m), 0) for m in plan.members if m not in dead}
        pending = set(base)
        while pending and (self._clock() - start < self._rollcall_s or (
                pending == set(base) and self._clock() - start < self._hb_timeout)):
            # nobody answering at all looks like a stall of this machine, not a storm that
            # killed everyone: give them up to the heartbeat timeout before losing the job
            for m in list(pending):
                if store.add(mb.k_heartbeat(m), 0) != base[m]:
                    pending.discard(m)
            if pending:
                time.sleep(0.01)
        dead = sorted(set(dead) | pending)
        ready = [Joiner(i, self._tracked[i].name, self._tracked[i].samples_per_s)
                 for i in self._ready if i not in dead]
        draining = [m for m in self._draining if m in plan.members]
        reason = f"{why}; dropped {dead}" if dead else f"{why}; every member answered"
        if dead or mb.next_plan(plan, ready, draining, []) is not None:
            self._reforms = mb.Reforms()
        else:  # the same set again: members that answer but never form must not loop it
            started = [m for m in plan.members
                       if store.check([mb.k_forming(plan.generation, m)])]
            formed = [m for m in plan.members
                      if store.check([mb.k_formed(plan.generation, m)])]
            self._reforms, stuck = mb.reform_or_drop(
                self._reforms, plan, started, formed, int(self._stats.get("step", 0) or 0))
            if stuck:
                dead = sorted(stuck)
                why = (f"answered the roll call but never completed forming generation "
                       f"{plan.generation} ({mb.MAX_SAME_REFORMS} re-forms of the same set)")
                reason = f"{reason}; dropped {dead}: {why}"
                log.warning("dropping members %s: %s", dead, why)
            elif self._reforms.count > mb.MAX_SAME_REFORMS:
                log.error("re-forming members %s for the %d-th time in a row: every member "
                          "answers and formed, yet the generation breaks",
                          list(plan.members), self._reforms.count)
        new = mb.next_plan(plan, ready, draining, dead, reason=reason)
        if new is None:  # everyone answered and nothing else changed: re-form the same set
            new = Plan(generation=plan.generation + 1, members=plan.members, names=plan.names,
                       reason=reason)
        for m in dead:
            t = self._tracked.get(m)
            name = t.name if t else str(m)
            self._dropped[m] = (name, self._clock(), store.add(mb.k_heartbeat(m), 0))
            self._event("lost", name, detail=f"member {m}: {why}", generation=plan.generation)
        self._publish(new)

    def _publish(self, new: Plan) -> None:
        store = self._store
        assert store is not None
        for k in (mb.k_broken(new.generation), f"formedn/{new.generation}"):
            store.add(k, 0)  # before gen/latest moves: members multi_get broken/<n>
            self._made.add(k)
        store.set(mb.k_plan(new.generation), new.to_json())
        store.add(mb.LATEST, new.generation - store.add(mb.LATEST, 0))
        self._plan = new
        self._formed = not new.members
        for i in new.joined:
            if i in self._ready:
                self._ready.remove(i)
        for i in list(new.drained) + list(new.lost):
            t = self._tracked.pop(i, None)
            self._draining.pop(i, None)
            if t is not None and i in new.drained:
                self._event("leave", t.name, detail=f"member {i} drained",
                            generation=new.generation)
        for i in new.members:
            self._tracked[i].state = "draining" if i in self._draining else "active"
        self._stats["generation"] = new.generation
        self._stats["world"] = len(new.members)
        self._event("generation", ",".join(new.names),
                    detail=f"published: {new.reason or 'membership change'}",
                    generation=new.generation)
        if not new.members:
            self._stats["finished"] = True
            self._stats["lost"] = True
            store.set(mb.FINISHED, "lost")
            log.error("every member holding the state left; the job stopped")

    def _on_formed(self, plan: Plan) -> None:
        store = self._store
        assert store is not None
        reports = {m: json.loads(store.get(mb.k_formed(plan.generation, m)))
                   for m in plan.members}
        sums = {r["checksum"] for r in reports.values()}
        lost = max(int(r.get("discarded", 0)) for r in reports.values())
        self._stats["steps_lost"] = int(self._stats.get("steps_lost", 0)) + lost
        self._formed = True
        self._formed_gen = plan.generation
        self._event("generation", ",".join(plan.names),
                    detail=json.dumps({"formed": True, "checksums": sorted(sums),
                                       "identical": len(sums) == 1, "steps_lost": lost,
                                       "step": max(int(r["step"]) for r in reports.values())}),
                    generation=plan.generation)
