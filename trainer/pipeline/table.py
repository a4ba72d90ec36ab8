"""What each member tells the others when a generation forms: one float64 row per member.

Design. The layout and the moves must be computed from the same inputs on every member, so
each member fills its own row of a ``(world, width)`` float64 table and the table is
all-reduced (a sum: every other row is zero). Every number in it is an integer below 2^53 or
a measurement, so it travels exactly. A row says: the member's speed (its profiled
samples/s) and memory, the layers it holds and at which step, how far it can roll forward
(``reach``: the waves whose reduced packs it kept), the newest wave agreed on it, the waves
it started, its previous slot and boundaries (the layout's hysteresis), its samples per
pass (its cap: a virtual worker's micro-batches are cut to its members' least), and its
per-layer measurement, and what it kept of the waves it started and nobody agreed
(:class:`trainer.pipeline.complete.Kept`: wave ``step + i`` in slot ``i``, up to ``waves``
of them, each ``3 + micro`` numbers; then the same for the backups it received).
:func:`agreed_wave`, :func:`holding`, :func:`costs`, :func:`hint` and :func:`holders` read
the decoded rows (pure).

Rule for callers: fill only your own row; decode the reduced table with the same ``stages``
and ``layers`` every member used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer.pipeline.complete import Holder, Kept
from trainer.pipeline.partition import Costs, Holding

_FIXED = 13


@dataclass(frozen=True)
class Row:
    """One member's row (see the module docstring). ``step``: the waves applied;
    ``reach``: the wave count it can roll forward to; ``agreed``: the waves agreed on it;
    ``started``: waves it started; ``fresh``: it holds no state at all (a joiner)."""

    speed: float
    memory: float = math.inf
    lo: int = 0
    hi: int = 0
    step: int = 0
    reach: int = 0
    agreed: int = 0
    started: int = 0
    fresh: bool = True
    slot: tuple[int, int] | None = None
    layout_gen: int = 0
    bounds: tuple[int, ...] | None = None
    seconds: tuple[float, ...] | None = None
    act: tuple[float, ...] | None = None
    kept: tuple[Kept, ...] = ()
    backup: tuple[Kept, ...] = ()
    cap: int = 0  # the member's samples per pass (0: no cap; lowered when out of memory)


def width(stages: int, layers: int, waves: int = 0, micro: int = 0) -> int:
    return _FIXED + stages + 1 + 2 * layers + 2 * waves * (3 + micro)


def encode(row: Row, stages: int, layers: int, waves: int = 0, micro: int = 0
           ) -> torch.Tensor:
    """``row`` as one float64 vector of :func:`width` entries (the first ``waves`` kept
    waves, covers within ``micro`` micro-batches)."""
    v = torch.zeros(width(stages, layers, waves, micro), dtype=torch.float64)
    v[:_FIXED] = torch.tensor([
        row.speed, -1.0 if math.isinf(row.memory) else row.memory, row.lo, row.hi, row.step,
        row.reach, row.agreed, row.started, 1.0 if row.fresh else 0.0,
        row.slot[0] if row.slot else -1, row.slot[1] if row.slot else -1, row.layout_gen,
        row.cap],
        dtype=torch.float64)
    o = _FIXED
    v[o:o + stages + 1] = -1.0
    if row.bounds is not None and len(row.bounds) <= stages + 1:
        v[o:o + len(row.bounds)] = torch.tensor(row.bounds, dtype=torch.float64)
    o += stages + 1
    if row.seconds is not None and row.act is not None:
        v[o:o + layers] = torch.tensor(row.seconds, dtype=torch.float64)
        v[o + layers:o + 2 * layers] = torch.tensor(row.act, dtype=torch.float64)
    else:
        v[o:o + 2 * layers] = -1.0
    o += 2 * layers
    for block in (row.kept, row.backup):
        for i, k in enumerate(block[:waves]):
            at = o + i * (3 + micro)
            v[at:at + 3] = torch.tensor([1.0, float(k.done), float(k.reduced)],
                                        dtype=torch.float64)
            for m in k.cover:
                if 0 <= m < micro:
                    v[at + 3 + m] = 1.0
        o += waves * (3 + micro)
    return v


def decode(table: torch.Tensor, stages: int, layers: int, waves: int = 0, micro: int = 0
           ) -> list[Row]:
    """The rows of a reduced ``(world, width)`` table, in rank order."""
    out = []
    for v in table.tolist():
        o = _FIXED + stages + 1 + 2 * layers
        blocks: list[list[Kept]] = [[], []]
        for block in blocks:
            for i in range(waves):
                at = o + i * (3 + micro)
                if v[at] <= 0:
                    break
                block.append(Kept(tuple(m for m in range(micro) if v[at + 3 + m] > 0),
                                  v[at + 1] > 0, v[at + 2] > 0))
            o += waves * (3 + micro)
        f = v[:_FIXED]
        o = _FIXED
        b = [int(x) for x in v[o:o + stages + 1] if x >= 0]
        o += stages + 1
        sec, act = v[o:o + layers], v[o + layers:o + 2 * layers]
        has = all(x >= 0 for x in sec)
        out.append(Row(
            speed=f[0], memory=math.inf if f[1] < 0 else f[1], lo=int(f[2]), hi=int(f[3]),
            step=int(f[4]), reach=int(f[5]), agreed=int(f[6]), started=int(f[7]),
            fresh=f[8] > 0, slot=(int(f[9]), int(f[10])) if f[9] >= 0 else None,
            layout_gen=int(f[11]), cap=int(f[12]), bounds=tuple(b) if len(b) >= 2 else None,
            seconds=tuple(sec) if has else None, act=tuple(act) if has else None,
            kept=tuple(blocks[0]), backup=tuple(blocks[1])))
    return out


def agreed_wave(rows: Sequence[Row]) -> int:
    """The newest wave count agreed on any member that holds state: every survivor can roll
    forward to it (its control reduction completed somewhere, so every member's stage
    reduction of it had completed)."""
    held = [r for r in rows if not r.fresh]
    return max((r.agreed for r in held), default=0)


def holding(rank: int, row: Row, wave: int) -> Holding:
    """What ``row``'s member will hold once it rolled forward to ``wave``: its layers when
    its kept packs reach that far, only the shared state when it holds no layers (a spare
    knows every wave's size), nothing when fresh or stuck behind."""
    if row.fresh:
        return Holding(rank)
    if row.hi <= row.lo:
        return Holding(rank, 0, 0, wave if row.started >= wave >= row.step else -1)
    ok = row.step <= wave <= row.reach
    return Holding(rank, row.lo, row.hi, wave if ok else -1)


def costs(rows: Sequence[Row], param_bytes: Sequence[float]) -> Costs | None:
    """The per-layer measurement of the lowest-ranked member that has one (the same choice on
    every member; stable while that member lives)."""
    for r in rows:
        if r.seconds is not None and r.act is not None:
            return Costs(r.seconds, tuple(param_bytes), r.act)
    return None


def hint(rows: Sequence[Row]) -> tuple[int, ...] | None:
    """The previous boundaries: those of the newest layout any member formed (lowest rank
    among them)."""
    best = max((r.layout_gen for r in rows), default=0)
    for r in rows:
        if best and r.layout_gen == best and r.bounds is not None:
            return r.bounds
    return None


def holders(rows: Sequence[Row], target: int) -> list[Holder]:
    """The rows as :func:`trainer.pipeline.complete.plan` sees them: a member's kept packs
    are of its stage in the newest layout any member formed, and usable when it reached the
    agreed wave ``target`` with its layers."""
    newest = max((r.layout_gen for r in rows), default=0)
    out = []
    for rank, r in enumerate(rows):
        ok = newest > 0 and r.layout_gen == newest and r.slot is not None
        out.append(Holder(rank, r.slot[1] if ok and r.slot else None, r.bounds if ok else None,
                          not r.fresh and r.hi > r.lo and r.step <= target <= r.reach,
                          r.step, r.kept, r.backup))
    return out
