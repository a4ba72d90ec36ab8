"""Completing the waves a failure left started but not agreed, from what the survivors kept.

Design. Under WSP with bound D a member may hold up to D + 1 waves it started and nobody
agreed when a member of the generation is SIGKILLed. Each survivor keeps, for each of them,
its own *unreduced* stage contribution (``done``: the gradients and buffer changes of the
micro-batches it ``covers``) and, where its stage's reduction completed before the break, the
stage's *reduced* pack (``reduced``: every VW's contribution, the dead member's too). The
next generation re-runs those waves from the same data cursor, as it always did; what this
module decides, the same on every member from the formed table (pure), is which micro-batches
of each wave must really be computed again:

* a kept pack is usable only on the same stage of the new layout with the same boundaries,
  from a member that rolled forward to the agreed wave (its layers are current);
* a stage with a usable reduced pack is complete: its lowest-ranked holder posts it to the new
  stage reduction, every other member of the stage zeros;
* every other stage sums the kept contributions of its members: the micro-batches covered at
  *every* such stage are kept, the rest (``recompute``) run again through the new virtual
  workers at the current weights (which miss at most D updates: WSP's bound holds). A kept
  contribution that covers a recomputed micro-batch is dropped (its micro-batches join the
  recomputed ones) until the kept ones cover exactly what is not recomputed, so every
  micro-batch's gradient is in the wave exactly once at every stage;
* the work lost is the recomputed micro-batches some member had computed (a complete pack
  covering them: its VW had run them through every stage; ``lost_samples``) or started
  (its pass was in flight when the generation broke, at most one wave's share per VW:
  ``in_flight_samples``, as the ring counts the step in flight), each as a fraction of its
  wave, summed and rounded up (``Completion.lost``, waves).

With the layout's boundaries changed nothing is usable and every wave is computed again in
full (what dropping the waves did before; its started work is counted as lost).

The samples of a dead stage-0 member's part of the waves the survivors rolled forward
through are recorded for it (:func:`records_for_the_dead`).

Rule for callers: give :func:`plan` the decoded rows every member reduced, the new layout and
the agreed wave; waves are numbered absolutely.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainer.pipeline.partition import Layout


@dataclass(frozen=True)
class Kept:
    """What a member holds of one wave it started: the micro-batches its stage contribution
    covers (indices into the wave's micro-batches), whether that contribution is complete
    (``done``) and whether it holds its stage's reduced pack (``reduced``)."""

    cover: tuple[int, ...] = ()
    done: bool = False
    reduced: bool = False


@dataclass(frozen=True)
class Holder:
    """A member as the plan sees it: its rank, the stage and boundaries its kept packs are
    of (None: none), whether it reached the agreed wave, ``kept[i]``: its own pack of wave
    ``first + i``, and ``backup[i]``: the pack of that wave the same stage of the previous VW
    sent it (``reduced`` unused)."""

    rank: int
    stage: int | None
    bounds: tuple[int, ...] | None
    current: bool
    first: int
    kept: tuple[Kept, ...] = ()
    backup: tuple[Kept, ...] = ()

    def at(self, wave: int, backup: bool = False) -> Kept | None:
        i = wave - self.first
        got = self.backup if backup else self.kept
        return got[i] if 0 <= i < len(got) else None


@dataclass(frozen=True)
class WavePlan:
    """One wave to complete: the micro-batches to compute again, and per stage either the
    rank that posts the reduced pack (``reduced[j]``) or the kept packs summed (``kept[j]``:
    the rank that adds it, whether it is the backup it holds, what it covers)."""

    wave: int
    recompute: tuple[int, ...]
    reduced: tuple[int | None, ...]
    kept: tuple[tuple[tuple[int, bool, tuple[int, ...]], ...], ...]

    def role(self, rank: int, stage: int) -> tuple[str, tuple[int, ...], tuple[bool, ...]]:
        """What ``rank`` at ``stage`` adds to its recomputed part: ``("reduced", ...)`` /
        ``("zero", ...)`` on a complete stage; else ``("kept", cover, which)`` (its own pack
        when ``which`` has False, its backup when it has True; ``cover``: both's) or
        ``("none", (), ())``."""
        if self.reduced[stage] is not None:
            return ("reduced" if self.reduced[stage] == rank else "zero"), (), ()
        mine = [(b, c) for r, b, c in self.kept[stage] if r == rank]
        if not mine:
            return "none", (), ()
        return ("kept", tuple(sorted({m for _, c in mine for m in c})),
                tuple(b for b, _ in mine))


@dataclass(frozen=True)
class Completion:
    waves: tuple[WavePlan, ...]
    lost: int  # waves of work computed again, finished or in flight (rounded up)
    lost_samples: int
    in_flight_samples: int = 0


def plan(holders: Sequence[Holder], layout: Layout | None, target: int, end: int,
         sizes: Sequence[Sequence[int]]) -> Completion:
    """The completion of waves ``target .. end - 1`` (``sizes[i]``: wave ``target + i``'s
    micro-batch sizes) on ``layout`` (None: nothing is computed in it; every computed wave's
    work counts as lost)."""
    waves, lost, lost_samples, in_flight = [], 0.0, 0, 0
    for i, w in enumerate(range(target, end)):
        u = set(range(len(sizes[i])))
        done: set[int] = set()
        started: set[int] = set()
        for h in holders:
            for k in (h.at(w), h.at(w, backup=True)):
                if k is not None:
                    started |= set(k.cover)
                    if k.done:
                        done |= set(k.cover)
        wp = _wave(holders, layout, w, u) if layout is not None else None
        again = set(wp.recompute) if wp is not None else u
        gone = sum(sizes[i][m] for m in again & done)
        flying = sum(sizes[i][m] for m in (again & started) - done)
        lost += (gone + flying) / (sum(sizes[i]) or 1)
        lost_samples += gone
        in_flight += flying
        if wp is not None:
            waves.append(wp)
    return Completion(tuple(waves), math.ceil(lost - 1e-9), lost_samples, in_flight)


def _usable(h: Holder, layout: Layout, stage: int) -> bool:
    slot = layout.slot_of(h.rank)
    return (h.current and h.stage == stage and slot is not None and slot[1] == stage
            and h.bounds == layout.bounds)


def _wave(holders: Sequence[Holder], layout: Layout, wave: int, u: set[int]) -> WavePlan:
    k = layout.stages
    reduced: list[int | None] = [None] * k
    kept: list[list[tuple[int, bool, frozenset[int]]]] = [[] for _ in range(k)]
    for h in sorted(holders, key=lambda h: h.rank):
        kw = h.at(wave)
        if h.stage is None or not 0 <= h.stage < k or not _usable(h, layout, h.stage):
            continue
        if kw is not None and kw.reduced and reduced[h.stage] is None:
            reduced[h.stage] = h.rank
        for backup, got in ((False, kw), (True, h.at(wave, backup=True))):
            if got is not None and got.done and got.cover and set(got.cover) <= u:
                kept[h.stage].append((h.rank, backup, frozenset(got.cover)))
    open_ = [j for j in range(k) if reduced[j] is None]
    for j in open_:
        # a pack and its backup cover the same micro-batches: one of them is summed (its
        # owner's first); packs that overlap otherwise cannot both be: neither is
        once: dict[frozenset[int], tuple[int, bool, frozenset[int]]] = {}
        for c in sorted(kept[j], key=lambda c: (c[1], c[0])):
            once.setdefault(c[2], c)
        seen: dict[int, int] = {}
        for _, _, c in once.values():
            for m in c:
                seen[m] = seen.get(m, 0) + 1
        kept[j] = sorted(c for c in once.values() if all(seen[m] == 1 for m in c[2]))
    again: set[int] = set() if not open_ else set(u)
    while open_:
        covered = set(u)
        for j in open_:
            covered &= set().union(*[c for _, _, c in kept[j]])
        again = u - covered
        changed = False
        for j in open_:
            keep = [x for x in kept[j] if not x[2] & again]
            changed |= len(keep) != len(kept[j])
            kept[j] = keep
        if not changed:
            break
    return WavePlan(wave, tuple(sorted(again)), tuple(reduced),
                    tuple(() if reduced[j] is not None else
                          tuple((r, b, tuple(sorted(c))) for r, b, c in kept[j])
                          for j in range(k)))


def split(todo: Sequence[int], counts: Sequence[int], vw: int) -> tuple[int, ...]:
    """VW ``vw``'s share of the micro-batches ``todo`` (in order) given ``counts`` per VW."""
    first = sum(counts[:vw])
    return tuple(todo[first:first + counts[vw]])


def parts(wp: WavePlan | None, layout: Layout, todo: Sequence[int], counts: Sequence[int],
          n_micro: int, stage: int) -> dict[int, tuple[int, ...]]:
    """rank -> the micro-batches whose gradient at ``stage`` that rank's pack carries in the
    wave: its VW's share of ``todo``, plus its kept cover; everything for the reduced pack's
    poster, nothing for the other members of a stage completed by it. At stage 0: what each
    member records as trained."""
    out: dict[int, tuple[int, ...]] = {}
    for v, row in enumerate(layout.vws):
        r = row[stage]
        mine = set(split(todo, counts, v))
        if wp is not None:
            role, cover, _ = wp.role(r, stage)
            if role == "reduced":
                mine = set(range(n_micro))
            elif role == "zero":
                mine = set()
            else:
                mine |= set(cover)
        out[r] = tuple(sorted(mine))
    return out


@dataclass(frozen=True)
class Part:
    """The samples one stage-0 member trained of a wave: a record of the ones it applied."""

    wave: int
    epoch: int
    member: int
    ids: tuple[int, ...]


def records_for_the_dead(history: Sequence[tuple[int, int, bool, Sequence[tuple[int, Any]]]],
                         alive: set[int], target: int, staleness: int) -> list[Part]:
    """The samples of stage-0 members that died, to be recorded by a surviving one (pure).

    A stage-0 member applies agreed waves only as the gate needs them (up to D behind): when
    it dies, the waves the survivors roll forward through may be agreed and unapplied there,
    so unrecorded. Each surviving stage-0 member records the dead ones' part of its newest
    applied waves, from ``target - D - 1`` (the oldest the dead may have missed; a sample
    recorded twice there is the same wave's, the same record, not trained twice). A member
    in ``alive`` (the plan's members and the drained, who applied every wave) is skipped.
    ``history``: ``(wave, epoch, recorded here, parts)`` of the waves this member applied,
    ``parts`` the ``(member id, ids)`` of every stage-0 pack; only waves this member
    recorded itself (it held stage 0) count.
    """
    out = []
    for wave, epoch, mine, parts in history:
        if wave < target - staleness - 1 or not mine:
            continue
        for mid, ids in parts:
            if mid not in alive and ids:
                out.append(Part(wave, epoch, mid, tuple(int(i) for i in ids)))
    return out


def combine(wp: WavePlan, rank: int, stage: int, flat: Any, loss: float, loss_n: int, *,
            own: tuple[Any, float, int] | None, reduced: Any,
            backup: tuple[Any, float, int] | None) -> tuple[Any, float, int]:
    """This member's pack of a wave completed after a failure (its recomputed part ``flat``
    with its loss sum and samples): plus its kept contributions (``own``: its pack of the
    wave before the failure; ``backup``: the previous VW's it holds), or its stage's kept
    ``reduced`` pack, or zeros, as :meth:`WavePlan.role` says. Raises ``LookupError`` when a
    pack the plan counts on is not here."""
    role, _, which = wp.role(rank, stage)
    if role == "zero":
        return flat.new_zeros(flat.shape), 0.0, 0
    if role == "none":
        return flat, loss, loss_n
    mine = own or (None, 0.0, 0)
    if role == "reduced":
        got = [(reduced, mine[1], mine[2])]
        flat, loss, loss_n = flat.new_zeros(flat.shape), 0.0, 0
    else:
        got = [(backup or (None, 0.0, 0)) if b else mine for b in which]
    for pack, extra, extra_n in got:
        if pack is None or pack.numel() != flat.numel():
            raise LookupError(f"wave {wp.wave}: a kept pack the completion counts on is not "
                              "here")
        flat, loss, loss_n = flat + pack.to(flat.device), loss + extra, loss_n + extra_n
    return flat, loss, loss_n


def describe(done: Completion) -> str:
    """One line on what completing the waves costs (for the log)."""
    return (f"completed from the kept packs, {done.lost_samples} samples computed before are "
            f"computed again, {done.in_flight_samples} were in flight (" + ", ".join(
                f"wave {wp.wave}: {len(wp.recompute)} micro-batches again"
                for wp in done.waves) + ")")
