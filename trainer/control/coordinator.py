"""The coordinator: the membership protocol of :mod:`trainer.protocol.messages`, served to
token holders.

Design: the coordinator owns the control store (:class:`trainer.protocol.store.StoreServer`:
only processes that prove the job token can connect) and one thread that executes
:func:`trainer.control.decide.decide`: every tick (every ``poll_s`` while something is in flight,
every ``STEADY_POLL_S`` otherwise) it reads the keys :func:`trainer.control.decide.reads` names
straight from the store's table (same process: no round trip), calls the pure decision and
applies its actions (store writes, events). Commands from the embedding daemon
(:meth:`Coordinator.drain`) are pure functions too, applied under the same lock.

It keeps the ring's durable snapshots (:class:`trainer.state.snapshot.Vault`: workers upload them
over the same authenticated store; a directory, S3 or GCS) and serves them back when every
holder of the state was lost at once. It tells rank 0 where the store is when rank 0 may
write there itself while the coordinator is away (:func:`trainer.state.direct.direct_entry`);
a restarted coordinator lists those snapshots, verified by their HMAC, like its own. A coordinator restarted on the same address with the
same token takes over the running ring from its members' reports (0 steps lost).

It is embeddable (the provisioner daemon calls :meth:`Coordinator.start` / :meth:`stop`,
:meth:`drain` by worker name and reads :meth:`stats`, :meth:`members`, :meth:`events`) and
runs standalone as ``python -m trainer coordinator``.

Rule for callers: the coordinator never trains and holds no model state; it listens only
on the host it is given (``127.0.0.1`` is loopback only).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from trainer.control import decide as dc
from trainer.control.state import counter_value
from trainer.protocol import messages as mb
from trainer.protocol.messages import MemberInfo, JobOutcome, Plan
from trainer.protocol.admission import derive_key
from trainer.protocol.store import StoreServer, raise_fd_limit, stats_of
from trainer.state.direct import direct_entry
from trainer.state.snapshot import Manifest, SnapshotSettings, Vault, open_store

log = logging.getLogger(__name__)

STEADY_POLL_S = 0.05  # tick period while nothing is in flight: a kill is seen 50 ms later at
# worst (members abandon a broken collective on their own); the ticks' CPU is the workers'
MAX_EVENTS = 10_000  # the oldest events are forgotten beyond this many


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
        snapshot: SnapshotSettings | None = None,
    ) -> None:
        if not token:
            raise ValueError("token: empty; pass the job token (bytes) read from the token file")
        if heartbeat_timeout_s <= 0 or rollcall_s <= 0 or poll_s <= 0:
            raise ValueError("heartbeat_timeout_s, rollcall_s and poll_s must be positive")
        if initial_world < 1:
            raise ValueError(f"initial_world={initial_world}: must be at least 1")
        self._host, self._port, self._token = host, port, token
        self._settings = dc.ControlSettings(heartbeat_timeout_s, rollcall_s, initial_world)
        self._clock = clock
        self._poll_s = poll_s
        self._snapshot = snapshot
        self._vault: Vault | None = None
        self._server: StoreServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._ring = dc.ControlState()
        self._events: list[dict[str, Any]] = []

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the control store and start the protocol thread. Returns once bound.

        Raises ``OSError`` when the address is busy or not this machine's.
        """
        raise_fd_limit()
        if self._snapshot is not None:
            self._vault = Vault(open_store(self._snapshot), keep=self._snapshot.keep,
                                on_commit=self._snapshot_committed,
                                key=derive_key(self._token, b"snapshot manifest"))
        self._server = StoreServer(self._host, self._port, self._token, blobs=self._vault)
        self._server.start()
        for key in (mb.LATEST, mb.DRAINS, mb.DONES, mb.ERRORS, mb.EXPORT, mb.SNAPSHOT_NOW):
            self._server.local_add(key, 0)
        # member ids of this incarnation start above any an earlier one handed out (a
        # restarted coordinator adopts members that keep their ids)
        base = int(time.time() * 1000)
        self._server.local_set(mb.IDS, str(base).encode())
        with self._lock:
            self._ring = dc.ControlState(scan_from=base + 1)
        self._server.local_set(mb.INCARNATION, secrets.token_hex(8).encode())
        if self._vault is not None:
            latest = self._vault.latest()  # a snapshot of an earlier incarnation counts
            if latest is not None:
                self._snapshot_committed(latest.to_json().encode())
            cfg = self._snapshot
            assert cfg is not None
            published: dict[str, Any] = {"every_s": cfg.every_s, "every_steps": cfg.every_steps}
            direct = direct_entry(cfg, self._host)  # rank 0 writes there while we are away
            if direct is not None:
                published["direct"] = direct
            self._server.local_set(mb.SNAPSHOT_CONFIG, json.dumps(published).encode())
        self._thread = threading.Thread(target=self._run, name="spotring-coordinator",
                                        daemon=True)
        self._thread.start()
        log.info("coordinator listening on %s:%d", *self.address)

    def _snapshot_committed(self, manifest: bytes) -> None:
        """Publish the newest manifest and the list of every usable one (newest first: the
        decision tries them in turn when a resume fails)."""
        if self._server is not None and self._vault is not None:
            self._server.local_set(mb.SNAPSHOTS, self._vault.published())
            self._server.local_set(mb.SNAPSHOT, manifest)

    def stop(self) -> None:
        """Stop the protocol thread and close the store (workers then lose the coordinator)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._server is not None:
            self._server.stop()
        if self._vault is not None:
            self._vault.close()

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the store listens on (the real port when started with port 0)."""
        if self._server is None:
            raise RuntimeError("coordinator not started")
        return self._server.address

    # -- queries and commands ----------------------------------------------------------------

    def drain(self, member_name: str, reason: str) -> bool:
        """Ask the member called ``member_name`` to leave at the next step boundary.

        Returns True when such a member (or admitted joiner) exists; False otherwise.
        """
        with self._lock:
            self._ring, actions, found = dc.command_drain(self._ring, member_name, reason)
            self._apply(actions)
        return found

    def request_export(self) -> None:
        """Ask rank 0 to write the trained model (its ``--output``) at the next step
        boundary; the job's ``on_finish`` hook is not called for it."""
        assert self._server is not None, "coordinator not started"
        self._server.local_add(mb.EXPORT, 1)

    def members(self) -> list[MemberInfo]:
        """Members of the newest generation and admitted joiners, by id."""
        with self._lock:
            return dc.members(self._ring)

    def stats(self) -> dict[str, Any]:
        """Progress: generation, step, epoch, samples_done, world, loss, metrics (accuracy),
        steps_lost, finished, outcome (running|done|lost|failed), failure, ``snapshot`` (the
        newest durable one: step, time, bytes; or None), ``resumed_from`` (the step of the
        snapshot the ring last resumed from), ``adopted`` (a restarted coordinator took the
        ring over), and ``rejected``: what the control port refused (connections without the
        token, bad frames)."""
        with self._lock:
            out = dc.stats(self._ring)
        if self._server is not None:
            out["rejected"] = stats_of(self._server.counters)
            # a member's end counts from its report, before the next tick reads it: its
            # process may exit first, and the daemon must not replace an instance that
            # finished (on a loaded machine `provision run` launched one after the end)
            out["completing"] = out["completing"] or counter_value(
                self._server.local_get(mb.DONES)) > 0
            raw = self._server.local_get(mb.SNAPSHOT)
            try:
                m = Manifest.parse(raw) if raw else None
                out["snapshot"] = ({"step": m.step, "time": m.time, "bytes": m.bytes}
                                   if m else None)
            except ValueError:
                out["snapshot"] = None
        return out

    def events(self) -> list[dict[str, Any]]:
        """Membership events so far (at most ``MAX_EVENTS``, oldest forgotten first):
        ``{time, kind, name, generation, detail, data}``; ``kind`` is an
        :class:`~trainer.protocol.messages.EventKind` value."""
        with self._lock:
            return [dict(e) for e in self._events]

    def plan(self) -> Plan | None:
        """The newest published generation (None before the first)."""
        with self._lock:
            return self._ring.plan

    def outcome(self) -> JobOutcome:
        with self._lock:
            return self._ring.outcome

    # -- the protocol thread -----------------------------------------------------------------

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
        """Is anything in flight (a generation forming, a join, a drain, a roll call)?"""
        r = self._ring
        return bool(not r.formed or r.unseen or r.ready or r.draining or r.rollcall)

    def _tick(self) -> None:
        server = self._server
        assert server is not None
        ids = int(server.local_get(mb.IDS) or b"0")
        keys = dc.reads(self._ring, ids)
        snap = dc.TickReads(self._clock(), time.time(), {k: server.local_get(k) for k in keys})
        before = self._ring.outcome
        self._ring, actions = dc.decide(self._ring, snap, self._settings, ids)
        self._apply(actions)
        if before is JobOutcome.RUNNING and self._ring.outcome is not JobOutcome.RUNNING:
            self._record_end()

    def _record_end(self) -> None:
        """The job ended: record it beside its snapshots (a daemon killed before its next
        metrics period reads it there, and does not take the run for unfinished)."""
        if self._vault is None:
            return
        s = dc.stats(self._ring)
        end = {k: s[k] for k in ("outcome", "step", "epoch", "samples_done", "steps_lost",
                                 "finished", "lost") if k in s}
        end.update(failure=str(s.get("failure", ""))[:2000], time=time.time())
        if "accuracy" in s:
            end["accuracy"] = s["accuracy"]
        try:
            self._vault.record_end(end)
        except Exception as e:  # noqa: BLE001 - the store: the daemon's metrics record it too
            log.warning("the job's end was not recorded beside its snapshots: %s", e)

    def _apply(self, actions: list[dc.Action]) -> None:
        server = self._server
        for a in actions:
            if isinstance(a, dc.Emit):
                self._event(a)
                continue
            assert server is not None
            if isinstance(a, dc.Put):
                server.local_set(a.key, a.value)
            elif isinstance(a, dc.Add):
                server.local_add(a.key, a.delta)
            elif isinstance(a, dc.Delete):
                server.local_delete(a.key)
            elif isinstance(a, dc.DeletePrefix):
                for k in server.local_items(a.prefix):
                    server.local_delete(k)

    def _event(self, e: dc.Emit) -> None:
        gen = e.generation if e.generation is not None else (
            self._ring.plan.generation if self._ring.plan else 0)
        self._events.append({"time": time.time(), "kind": e.kind.value, "name": e.name,
                             "generation": gen, "detail": e.detail,
                             "data": dict(e.data) if e.data else {}})
        if len(self._events) > MAX_EVENTS:
            del self._events[: len(self._events) - MAX_EVENTS]
        level = logging.WARNING if e.kind in (mb.EventKind.LOST, mb.EventKind.REFUSED,
                                              mb.EventKind.MALFORMED, mb.EventKind.JOB_ERROR
                                              ) else logging.INFO
        log.log(level, "%s %s: %s", e.kind.value, e.name, e.detail,
                extra={"kind": e.kind.value, "member": e.name, "generation": gen})
