"""Backups of a stage's packs at the next virtual worker, so a kill under WSP loses little.

Design. At D > 0 a virtual worker may hold up to D + 1 finished waves that nobody reduced
yet (their shares, (D + 1) / V of a wave, would be computed again besides the passes in
flight, up to two waves in all). So each member also sends every pack it computes to the
same stage of the next virtual worker as it is computed (:meth:`Backups.send`), and posts
the receives of the previous one's (:meth:`Backups.post`). A kill then loses at most the
passes in flight and the dead VW's last finished pack if its backup had not arrived: the
next generation reads which backups arrived (:meth:`Backups.held`) and
:mod:`trainer.pipeline.complete` completes the waves from them. A backup message is the
pack, then one flag per micro-batch it covers, then the loss sum and its samples.

A spoiled pack (a stage of its virtual worker ran out of memory: NaN) is never held.

Rule for callers: one :class:`Backups` per generation and member, built after the member
took its slot; :meth:`Backups.done` each wave once applied or discarded (both ends posted
it), :meth:`Backups.redo` from the first discarded wave; read
:meth:`Backups.held` only when the generation is over.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch

from trainer.collective import groups
from trainer.pipeline import complete, partition
from trainer.pipeline.runner import transport

BACKUP_TAG = (1 << 30) | (3 << 24)  # + wave % 64 (above every wave's tags)
_POLL = datetime.timedelta(milliseconds=1)


def backup_peers(layout: partition.Layout | None, slot: tuple[int, int] | None,
                 staleness: int) -> tuple[int, int] | None:
    """``(from, to)``: the same stage of the previous and the next virtual worker, when a
    member in ``slot`` backs up its packs (D > 0 and more than one VW); else None. Pure."""
    if layout is None or slot is None:
        return None
    n = len(layout.vws)
    if n < 2 or staleness == 0 or staleness + 2 >= 64:
        return None  # (the tags tell 64 waves apart)
    v, j = slot
    return layout.vws[(v - 1) % n][j], layout.vws[(v + 1) % n][j]


def received(work: Any) -> bool:
    """Did a posted receive complete, without error? (A gloo receive tells only when waited
    for: a short wait that runs out leaves it posted.)"""
    if work is None:
        return False
    try:
        work.wait(_POLL)
    except Exception:  # noqa: BLE001 - ran out, or failed (gloo: RuntimeError and kin)
        return False
    return True


class Backups:
    """One generation's backups of this member's packs (see the module docstring)."""

    def __init__(self, pg: Any, peers: tuple[int, int] | None, *, numel: int, max_micro: int,
                 staleness: int, device: torch.device, start: int,
                 abort: Callable[[], bool]) -> None:
        self.pg, self.peers, self.numel, self.max_micro = pg, peers, numel, max_micro
        self.staleness, self.device, self.abort = staleness, device, abort
        self.incoming: dict[int, tuple[torch.Tensor, Any]] = {}  # posted receives
        self.outgoing: dict[int, tuple[torch.Tensor, Any]] = {}  # posted sends
        self._upto = start
        self.post(start + staleness + 2)

    def post(self, upto: int) -> None:
        """Post the receives of the previous VW's backups of the waves up to ``upto`` (a VW
        is at most D + 1 waves beyond what this member applied)."""
        if self.peers is None:
            return
        n = self.numel + self.max_micro + 2
        for wave in range(self._upto, upto):
            if wave in self.incoming:
                continue  # posted before a discard (:meth:`redo`)
            buf = torch.zeros(n, dtype=torch.float32, device=self.device)
            with transport(f"recv from rank {self.peers[0]}"):
                work = self.pg.recv([buf], self.peers[0], BACKUP_TAG + wave % 64)
            self.incoming[wave] = (buf, work)
        self._upto = max(self._upto, upto)

    def send(self, wave: int, flat: torch.Tensor, cover: tuple[int, ...], loss: float,
             loss_n: int) -> None:
        """Send this member's pack of ``wave`` (covering micro-batches ``cover``) on."""
        if self.peers is None:
            return
        micro = self.max_micro
        tail = torch.zeros(micro + 2, dtype=torch.float32, device=flat.device)
        for m in cover:
            tail[m] = 1.0
        tail[micro], tail[micro + 1] = loss, loss_n
        msg = torch.cat([flat, tail])
        with transport(f"send to rank {self.peers[1]}"):
            work = self.pg.send([msg], self.peers[1], BACKUP_TAG + wave % 64)
        self.outgoing[wave] = (msg, work)
        self.post(wave + self.staleness + 2)

    def done(self, wave: int) -> None:
        """Wave ``wave`` is applied: its backups (sent and received) are waited for and
        dropped (both were posted: every member computed the wave)."""
        posted = []
        peers = self.peers
        for got, peer in ((self.outgoing.pop(wave, None), peers[1] if peers else 0),
                          (self.incoming.pop(wave, None), peers[0] if peers else 0)):
            if got is not None:
                posted.append((got[1], peer))
        if posted:
            groups.wait_posted(posted, self.abort)

    def redo(self, wave: int) -> None:
        """Waves ``wave`` and later were discarded (each one :meth:`done`) and will be computed
        again: their receives are posted again as they are sent."""
        self._upto = min(self._upto, wave)

    def held(self, step: int, count: int
             ) -> tuple[tuple[complete.Kept, ...], dict[int, tuple[torch.Tensor, float, int]]]:
        """The backups received of waves ``step .. step + count - 1`` (entry ``i``: wave
        ``step + i``; a member applies agreed waves lazily, up to D + 1 behind what is
        agreed, and a VW starts at most D waves beyond that, so ``count`` is 2(D + 1)):
        each with the micro-batches its pack covers, and the packs by wave ``(pack, loss
        sum, samples)``. The receives are forgotten."""
        out, kept = [], {}
        micro = self.max_micro
        for wave in range(step, step + count):
            buf, work = self.incoming.get(wave, (None, None))
            if buf is None or not received(work) or not bool(torch.isfinite(buf).all()):
                out.append(complete.Kept())
                continue
            n = buf.numel() - micro - 2
            flags = buf[n:n + micro].tolist()
            cover = tuple(m for m, f in enumerate(flags) if f > 0)
            kept[wave] = (buf[:n], float(buf[n + micro]), int(buf[n + micro + 1]))
            out.append(complete.Kept(cover, True, False))
        self.incoming = {}
        return tuple(out), kept
