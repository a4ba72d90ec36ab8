"""The cross-zone exchange of one generation: parameter-server shards on gloo point-to-point.

Design. The leaders of a generation's zones form a process group of their own (rank =
zone index) and speak only point-to-point on it (gloo send/recv: 100 MB in 205 ms here,
against 804 ms for the deprecated ``torch.distributed.rpc``). Each leader runs an
:class:`Exchange`: one receiving and one sending thread per other leader, so a slow link to
one zone never holds up another, and the training loop never blocks on the network.

* **Shards.** The update vector (:mod:`trainer.hybrid.update`) is cut into shards by size
  (:func:`trainer.hybrid.placement.place`); shard ``k`` is served by the leader of zone
  ``k mod Z``. A zone that computed update ``v`` *pushes* each host the slice its shards
  carry (its own host's slice stays local); the host hands the slice to its own zone and
  *relays* it to every other zone. A zone applies update ``v`` once it holds every host's
  slice, in version order. Over the links each update costs one crossing of the vector per
  other zone, where the flat ring's all-reduce crosses the zone boundary with ``2(N-1)/N``
  vectors in each direction for *every* step, and the hosts' loads are the shards' sizes.
* **Tickets.** Zone 0's leader keeps the :class:`trainer.hybrid.staleness.Sequencer`; a
  leader asks it for its next ticket (``REQ``, carrying the newest generation it has seen)
  and gets ``TICKET`` back, a version or a stop with ``final``.
* **Wire format.** Every message is a header of six int64 ``[kind, version, zone, n, a, b]``
  and, when ``n > 0``, a body of ``n`` float32: tensors only, nothing unpickled. A header is
  checked against what the generation allows (kind, version below the job's end, zone, the
  exact slice length that sender may send) before its body is received; anything else ends
  the generation (:attr:`Exchange.failed`).
* **Leaving.** :meth:`Exchange.close` is the clean end, once every update below ``final``
  was applied and served: a ``BYE`` to every leader, then wait for theirs, so no thread is
  left blocked. On a broken generation the threads are abandoned (a peer's death ends them
  within milliseconds: gloo reports the closed connection; a hung peer's, at the long
  point-to-point timeout).

Rule for callers: one :class:`Exchange` per leader per generation, used from the leader's
training thread (the methods are thread-safe); check :attr:`Exchange.failed` while waiting;
:meth:`close` only at the clean end, :meth:`abandon` otherwise.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from trainer.errors import ExchangeError
from trainer.hybrid.placement import Placement, host_ranges, host_shard_sizes
from trainer.hybrid.staleness import Sequencer, Ticket

log = logging.getLogger(__name__)

HEAD = 6
REQ, TICKET, PUSH, RELAY, BYE = 1, 2, 3, 4, 5
_KINDS = {REQ: "REQ", TICKET: "TICKET", PUSH: "PUSH", RELAY: "RELAY", BYE: "BYE"}
TAG_HEAD, TAG_BODY = 1, 2


class Exchange:
    """One leader's end of the cross-zone exchange (module docstring)."""

    def __init__(self, pg: Any, zone: int, zones: int, numel: int, placement: Placement,
                 offsets: Sequence[int], hosts: Sequence[int], *, start: int, end: int,
                 sequencer: Sequencer | None, p2p_timeout_s: float = 600.0) -> None:
        self.pg, self.zone, self.zones, self.numel = pg, zone, zones, numel
        self.first, self.end = start, end  # the versions this generation may apply
        self.placement, self.hosts = placement, tuple(hosts)
        self.host_zones = sorted(set(self.hosts))
        self.ranges = {h: host_ranges(placement, offsets, self.hosts, h)
                       for h in self.host_zones}
        self.length = {h: sum(b - a for a, b in r) for h, r in self.ranges.items()}
        self.my_shards = host_shard_sizes(placement, self.hosts, zone)
        self.timeout = datetime.timedelta(seconds=p2p_timeout_s)
        self.peers = [q for q in range(zones) if q != zone]
        self._cond = threading.Condition()
        self._seq = sequencer
        self._told: set[int] = set()  # zones the sequencer has sent its stop to
        self._tickets: deque[Ticket] = deque()
        self._inbox: dict[int, dict[int, torch.Tensor]] = {}
        self._served: set[int] = set()  # versions this host has handed on
        self._byes: set[int] = set()
        self._out: dict[int, queue.Queue[Any]] = {q: queue.Queue() for q in self.peers}
        self._threads: list[threading.Thread] = []
        self.failed: BaseException | None = None
        self.shard_bytes = {k: 0 for k, _ in self.my_shards}  # network bytes per shard

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Exchange:
        for q in self.peers:
            for target, what in ((self._recv_loop, "in"), (self._send_loop, "out")):
                t = threading.Thread(target=target, args=(q,), daemon=True,
                                     name=f"spotring-ps-{what}-{q}")
                t.start()
                self._threads.append(t)
        return self

    def close_ready(self, final: int) -> bool:
        """Has this leader done its part of every update below ``final``? (as a host: each
        served; as the sequencer: every zone told to stop)."""
        with self._cond:
            if self.zone in self.host_zones and any(v not in self._served
                                                    for v in range(self.first, final)):
                return False
            return self._seq is None or self._told >= set(self.peers)

    def close(self, wait: Any) -> None:
        """The clean end: ``BYE`` to every leader, then wait (``wait(predicate)``, the
        caller's abortable wait) for theirs and for the threads."""
        for q in self.peers:
            self._out[q].put((self._head(BYE, 0), None))
            self._out[q].put(None)
        wait(lambda: self._byes >= set(self.peers) or self.failed is not None)
        if self.failed is not None:
            raise ExchangeError(str(self.failed))
        for t in self._threads:
            t.join(timeout=5)

    def abandon(self) -> None:
        """A broken generation: stop sending; blocked threads end with their connections."""
        for q in self.peers:
            self._out[q].put(None)

    # -- the training thread's side ------------------------------------------------------------

    def request(self, newest_seen: int) -> None:
        """Ask the sequencer for a ticket (the answer arrives in :meth:`ticket`)."""
        if self._seq is not None:
            self._issue(self.zone, newest_seen)
        else:
            self._out[0].put((self._head(REQ, 0, a=newest_seen), None))

    def ticket(self) -> Ticket | None:
        """The oldest answer of the sequencer not taken yet, or None."""
        with self._cond:
            return self._tickets.popleft() if self._tickets else None

    def push(self, version: int, update: torch.Tensor) -> None:
        """Hand update ``version`` (computed by this zone) to every shard host."""
        for h in self.host_zones:
            body = self._slice(update, h)
            if h == self.zone:
                with self._cond:
                    self._serve(version, self.zone, body)
                    self._cond.notify_all()
            else:
                self._out[h].put((self._head(PUSH, version, n=body.numel()), body))

    def available(self) -> frozenset[int]:
        """Versions whose every slice has arrived (other zones' updates)."""
        with self._cond:
            return frozenset(v for v, parts in self._inbox.items()
                             if len(parts) == len(self.host_zones))

    def take(self, version: int) -> torch.Tensor:
        """Update ``version``, whole (it must be :meth:`available`)."""
        with self._cond:
            parts = self._inbox.pop(version)
        update = torch.empty(self.numel, dtype=torch.float32)
        for h, body in parts.items():
            o = 0
            for a, b in self.ranges[h]:
                update[a:b] = body[o:o + b - a]
                o += b - a
        return update

    def wait(self, timeout_s: float) -> None:
        """Block until something arrives or ``timeout_s`` passes."""
        with self._cond:
            self._cond.wait(timeout_s)

    # -- the sequencer and the shards (under the lock, from any thread) ------------------------

    def _issue(self, q: int, newest_seen: int) -> None:
        with self._cond:
            assert self._seq is not None
            self._seq, t = self._seq.issue(newest_seen)
            if t.version is None:
                self._told.add(q)
            if q == self.zone:
                self._tickets.append(t)
                self._cond.notify_all()
                return
        self._out[q].put((self._head(TICKET, -1 if t.version is None else t.version,
                                     a=-1 if t.final is None else t.final, b=t.newest), None))

    def _serve(self, version: int, src: int, body: torch.Tensor) -> None:
        """As a shard host: update ``version`` of zone ``src`` to this zone and the others."""
        if version in self._served:
            raise ExchangeError(f"zone {src} pushed update {version} twice")
        self._served.add(version)
        if src != self.zone:
            self._inbox.setdefault(version, {})[self.zone] = body
        relays = [z for z in self.peers if z != src]
        for z in relays:
            self._out[z].put((self._head(RELAY, version, zone=src, n=body.numel(),
                                         a=self.zone), body))
        crossings = len(relays) + (1 if src != self.zone else 0)
        for k, n in self.my_shards:
            self.shard_bytes[k] += 4 * n * crossings

    def _slice(self, update: torch.Tensor, host: int) -> torch.Tensor:
        return torch.cat([update[a:b] for a, b in self.ranges[host]])

    def _head(self, kind: int, version: int, *, zone: int | None = None, n: int = 0,
              a: int = 0, b: int = 0) -> torch.Tensor:
        return torch.tensor([kind, version, self.zone if zone is None else zone, n, a, b],
                            dtype=torch.int64)

    # -- the threads -----------------------------------------------------------------------------

    def _check(self, q: int, kind: int, version: int, zone: int, n: int, a: int) -> int:
        """The body length a header from leader ``q`` announces, after checking it."""
        what = f"{_KINDS.get(kind, kind)} from zone {q}"
        if kind not in _KINDS:
            raise ExchangeError(f"unknown message kind {kind} from zone {q}")
        if kind in (PUSH, RELAY) and not self.first <= version < self.end:
            raise ExchangeError(f"{what}: version {version} outside {self.first}.."
                                f"{self.end - 1}")
        if kind == PUSH:
            if zone != q or self.zone not in self.host_zones or n != self.length[self.zone]:
                raise ExchangeError(f"{what}: not a push this host takes (zone {zone}, {n})")
            return n
        if kind == RELAY:
            if a != q or q not in self.host_zones or zone == self.zone or not (
                    0 <= zone < self.zones) or n != self.length[q]:
                raise ExchangeError(f"{what}: not a relay of that host (zone {zone}, {n})")
            return n
        if kind == REQ and self._seq is None:
            raise ExchangeError(f"{what}: this leader keeps no tickets")
        if kind == TICKET and q != 0:
            raise ExchangeError(f"{what}: only zone 0 hands out tickets")
        if n:
            raise ExchangeError(f"{what}: a body where none belongs")
        return 0

    def _recv_loop(self, q: int) -> None:
        try:
            while True:
                head = torch.zeros(HEAD, dtype=torch.int64)
                self.pg.recv([head], q, TAG_HEAD).wait(self.timeout)
                kind, version, zone, n, a, b = (int(x) for x in head.tolist())
                n = self._check(q, kind, version, zone, n, a)
                body = None
                if n:
                    body = torch.empty(n, dtype=torch.float32)
                    self.pg.recv([body], q, TAG_BODY).wait(self.timeout)
                if kind == REQ:
                    self._issue(q, a)
                    continue
                with self._cond:
                    if kind == TICKET:
                        self._tickets.append(Ticket(None if version < 0 else version,
                                                    None if a < 0 else a, b))
                    elif kind == PUSH:
                        assert body is not None
                        self._serve(version, q, body)
                    elif kind == RELAY:
                        assert body is not None
                        parts = self._inbox.setdefault(version, {})
                        if q in parts:
                            raise ExchangeError(f"zone {q} relayed update {version} twice")
                        parts[q] = body
                    elif kind == BYE:
                        self._byes.add(q)
                    self._cond.notify_all()
                if kind == BYE:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            self._fail(q, e)

    def _send_loop(self, q: int) -> None:
        try:
            while True:
                item = self._out[q].get()
                if item is None:
                    return
                head, body = item
                works = [self.pg.send([head], q, TAG_HEAD)]
                if body is not None:
                    works.append(self.pg.send([body], q, TAG_BODY))
                for w in works:
                    w.wait(self.timeout)
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            self._fail(q, e)

    def _fail(self, q: int, e: BaseException) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = e if isinstance(e, ExchangeError) else ExchangeError(
                    f"link to zone {q}: {str(e).splitlines()[0] if str(e) else e!r}")
                log.warning("cross-zone exchange: %s", self.failed)
            self._cond.notify_all()
