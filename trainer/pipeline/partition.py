"""The layout of a generation's virtual workers: who runs which layers, who sends what.

Design. A generation of ``N`` members running a job of ``k`` stages forms ``V = N // k``
virtual workers (VWs); the ``N mod k`` slowest members are *spares* (they hold no layers and
take part only in the wave's control reduction, ready for a slot). Every member computes the
layout from the same inputs: the members in rank order with their speed (the samples/s of
the whole model their own profiling measured, scaled by nothing: relative speeds are enough)
and memory, and the model's measured per-layer cost (seconds per sample, any unit) and
memory. These travel in one table reduced over the generation's group, as float64, so every
member holds the same bits and :func:`decide` (pure, no I/O) returns the same
:class:`Layout` everywhere.

* **Slots.** Fresh, members are sorted by speed (fastest first, ties by rank) and cut into
  ``k`` tiers of ``V``: every stage gets one tier, so the members of one stage are about as
  fast as each other; which tier runs which stage is chosen too (every order up to 5
  stages): an expensive layer, a language model's head, belongs on a fast tier. Survivors of
  the previous layout keep their ``(vw, stage)`` slot when the VW count is unchanged and the
  kept layout's throughput is within ``keep_within`` of the fresh one: a replacement then
  takes the dead member's slot, and its layers come from the same stage of another VW. With
  fewer VWs, the old VWs with the most members left stay (renumbered in order), so the packs
  their members kept of the waves a failure left unagreed line up
  (:mod:`trainer.pipeline.complete`).
* **Boundaries.** The stages of every VW hold the same layers (so the replicas of a layer
  are reduced in one group of ``V`` members per stage). The boundaries minimise the
  bottleneck ``max_j C_j / S_j``, ``C_j`` the stage's summed layer cost and ``S_j`` the
  summed speed of its members over the VWs, subject to every member's memory (dynamic
  programming, ``O(k L^2)``); the previous boundaries are kept while their bottleneck is
  within ``keep_within`` of the optimum (a layout does not move weights for noise).
* **Micro-batches.** The number of fixed-size micro-batches a VW takes in a wave carries its
  share: :func:`split_micro` assigns them one at a time to the VW whose pipeline would finish
  first, ``(m_v + k - 1) / r_v``, ``r_v`` its bottleneck rate.
* **Memory** of a stage (:func:`stage_memory`): weights, gradients and optimiser slots of its
  layers, plus the activations in flight (GPipe: every micro-batch of the wave; 1F1B:
  ``k - j`` at stage ``j``).
* **Moves.** :func:`transfers` says which member sends which layers to whom after a change:
  each missing layer comes from a member holding it at the agreed wave, the longest run a
  source covers first, the least loaded source on ties, so a replacement receives its stage
  from the same stage of another VW; a member with a stale step and no layers to receive gets
  the small shared state alone. Layers nobody holds are reported (the durable snapshot, or
  the job is lost). Members leaving with notice first hand every stage that would have no
  replica left to a member that stays (:func:`handover`).

Rule for callers: give :func:`decide` exactly what every member agreed on (never a local
measurement), and never mutate what it returns.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Costs:
    """The model's layers as measured: ``seconds[l]`` per sample (forward and backward) on
    a member of speed 1, ``param_bytes[l]``, ``act_bytes[l]`` (the layer's output, per
    sample)."""

    seconds: tuple[float, ...]
    param_bytes: tuple[float, ...]
    act_bytes: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.seconds)
        if n == 0 or len(self.param_bytes) != n or len(self.act_bytes) != n:
            raise ValueError("costs: one entry per layer in each of seconds, param_bytes, "
                             "act_bytes")
        if any(not math.isfinite(c) or c < 0 for c in self.seconds):
            raise ValueError(f"costs: seconds must be finite and >= 0: {self.seconds}")

    @property
    def layers(self) -> int:
        return len(self.seconds)


@dataclass(frozen=True)
class Candidate:
    """A member as the layout sees it: rank, relative speed, memory (bytes; ``inf``: no
    limit), and the ``(vw, stage)`` slot it held in the previous layout (None: none)."""

    rank: int
    speed: float
    memory: float = math.inf
    slot: tuple[int, int] | None = None


@dataclass(frozen=True)
class Settings:
    """What the layout needs of the job: stages ``k``, the micro-batch size, the schedule,
    optimiser state tensors per parameter, the most micro-batches a wave has (GPipe keeps
    them all in flight), and the hysteresis ``keep_within`` (0.9: keep the previous slots
    and boundaries while within 10 % of the fresh optimum)."""

    stages: int
    micro_batch: int
    schedule: str = "1f1b"
    optimizer_slots: int = 2
    max_micro: int = 1
    keep_within: float = 0.9

    def __post_init__(self) -> None:
        if self.stages < 1 or self.micro_batch < 1 or self.max_micro < 1:
            raise ValueError("settings: stages, micro_batch and max_micro must be >= 1")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if not 0 < self.keep_within <= 1:
            raise ValueError("keep_within must be in (0, 1]")


@dataclass(frozen=True)
class Layout:
    """A generation's layout (see the module docstring).

    ``vws[v][j]``: the rank running stage ``j`` of VW ``v``; ``bounds``: ``k + 1`` layer
    indices, stage ``j`` holds layers ``bounds[j] .. bounds[j + 1] - 1`` in every VW;
    ``rates[v]``: VW ``v``'s micro-batches per second at its bottleneck (relative);
    ``spares``: ranks without a slot.
    """

    vws: tuple[tuple[int, ...], ...]
    bounds: tuple[int, ...]
    rates: tuple[float, ...]
    spares: tuple[int, ...] = ()

    @property
    def stages(self) -> int:
        return len(self.bounds) - 1

    def slot_of(self, rank: int) -> tuple[int, int] | None:
        """``(vw, stage)`` of ``rank``, or None for a spare."""
        for v, row in enumerate(self.vws):
            if rank in row:
                return v, row.index(rank)
        return None

    def layers_of(self, rank: int) -> tuple[int, int]:
        """The layer range ``[lo, hi)`` ``rank`` holds (``(0, 0)`` for a spare)."""
        slot = self.slot_of(rank)
        if slot is None:
            return 0, 0
        return self.bounds[slot[1]], self.bounds[slot[1] + 1]

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        """The ranks running ``stage``, one per VW, in VW order (a stage group's ranks)."""
        return tuple(row[stage] for row in self.vws)


# -- memory and time ---------------------------------------------------------------------------


def in_flight(settings: Settings, stage: int, stages: int) -> int:
    """Micro-batches whose activations a stage holds at once under the schedule."""
    if settings.schedule == "gpipe":
        return settings.max_micro
    return max(1, min(stages - stage, settings.max_micro))


def stage_memory(costs: Costs, lo: int, hi: int, stage: int, stages: int,
                 settings: Settings) -> float:
    """Bytes a member needs for layers ``[lo, hi)`` at ``stage``: weights, gradients and
    optimiser slots, and the activations in flight (its input and each layer's output)."""
    weights = sum(costs.param_bytes[lo:hi]) * (2 + settings.optimizer_slots)
    per_sample = sum(costs.act_bytes[lo:hi]) + (costs.act_bytes[lo - 1] if lo > 0 else 0.0)
    return weights + per_sample * settings.micro_batch * in_flight(settings, stage, stages)


def _prefix(xs: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def _bottleneck(pre: list[float], bounds: Sequence[int], speeds: Sequence[float]) -> float:
    return max((pre[bounds[j + 1]] - pre[bounds[j]]) / speeds[j] for j in range(len(speeds)))


def _feasible(costs: Costs, bounds: Sequence[int], caps: Sequence[float],
              settings: Settings) -> bool:
    k = len(bounds) - 1
    return all(bounds[j] < bounds[j + 1] for j in range(k)) and all(
        stage_memory(costs, bounds[j], bounds[j + 1], j, k, settings) <= caps[j]
        for j in range(k))


def best_bounds(costs: Costs, speeds: Sequence[float], caps: Sequence[float],
                settings: Settings) -> tuple[int, ...] | None:
    """Contiguous stage boundaries minimising ``max_j C_j / speeds[j]`` with each stage's
    memory within ``caps[j]``; None when no split fits. Ties: the earliest boundaries."""
    k, n = len(speeds), costs.layers
    if k > n:
        return None
    pre = _prefix(costs.seconds)
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    back = [[-1] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for p in range(j - 1, i):
                if best[j - 1][p] == inf:
                    continue
                if stage_memory(costs, p, i, j - 1, k, settings) > caps[j - 1]:
                    continue
                v = max(best[j - 1][p], (pre[i] - pre[p]) / speeds[j - 1])
                if v < best[j][i]:
                    best[j][i], back[j][i] = v, p
    if best[k][n] == inf:
        return None
    bounds = [n]
    for j in range(k, 0, -1):
        bounds.append(back[j][bounds[-1]])
    return tuple(reversed(bounds))


def vw_rates(costs: Costs, bounds: Sequence[int], vws: Sequence[Sequence[float]],
             micro_batch: int) -> tuple[float, ...]:
    """Each VW's micro-batches per second at its bottleneck stage; ``vws[v][j]`` is the
    speed of VW ``v``'s stage ``j`` member."""
    pre = _prefix(costs.seconds)
    out = []
    for speeds in vws:
        t = micro_batch * _bottleneck(pre, bounds, speeds)
        out.append(1.0 / t if t > 0 else math.inf)
    return tuple(out)


def split_micro(total: int, rates: Sequence[float], stages: int) -> tuple[int, ...]:
    """Micro-batches per VW for a wave of ``total`` of them: one at a time to the VW whose
    pipeline would then finish first, ``(m_v + stages - 1) / rates[v]`` (ties: lowest v)."""
    counts = [0] * len(rates)
    for _ in range(total):
        v = min(range(len(rates)),
                key=lambda i: ((counts[i] + stages) / rates[i] if rates[i] > 0 else math.inf,
                               i))
        counts[v] += 1
    return tuple(counts)


def micro_sizes(samples: int, micro_batch: int) -> tuple[int, ...]:
    """A wave of ``samples`` in ``ceil(samples / micro_batch)`` micro-batches as equal as
    possible (all exactly ``micro_batch`` when it divides; the larger ones first)."""
    if samples <= 0:
        return ()
    m = -(-samples // micro_batch)
    q, r = divmod(samples, m)
    return tuple(q + 1 if i < r else q for i in range(m))


# -- the layout --------------------------------------------------------------------------------


def _tiered(members: Sequence[Candidate], v_count: int, k: int
            ) -> tuple[list[list[Candidate]], list[int]]:
    order = sorted(members, key=lambda m: (-m.speed, m.rank))
    used = order[: v_count * k]
    vws = [[used[j * v_count + v] for j in range(k)] for v in range(v_count)]
    return vws, sorted(m.rank for m in order[v_count * k:])


def _kept(members: Sequence[Candidate], v_count: int, k: int
          ) -> tuple[list[list[Candidate]], list[int]] | None:
    held = [m for m in sorted(members, key=lambda m: m.rank) if m.slot is not None
            and m.slot[1] < k]
    old = sorted({m.slot[0] for m in held})
    if old and old[-1] >= v_count:  # fewer VWs: the fullest old ones stay (their members'
        full = sorted(old, key=lambda v: (-sum(m.slot[0] == v for m in held), v))  # packs
        renumber = {v: i for i, v in enumerate(sorted(full[:v_count]))}  # line up)
    else:
        renumber = {v: v for v in old}
    slots: dict[tuple[int, int], Candidate] = {}
    for m in held:
        slot = (renumber.get(m.slot[0], v_count), m.slot[1])
        if slot[0] < v_count and slot not in slots:
            slots[slot] = m
    if not slots:
        return None
    taken = {m.rank for m in slots.values()}
    free = sorted((m for m in members if m.rank not in taken), key=lambda m: (-m.speed, m.rank))
    for v in range(v_count):
        for j in range(k):
            if (v, j) not in slots:
                slots[(v, j)] = free.pop(0)
    vws = [[slots[(v, j)] for j in range(k)] for v in range(v_count)]
    return vws, sorted(m.rank for m in free)


def _fit(costs: Costs, vws: list[list[Candidate]], settings: Settings,
         hint: Sequence[int] | None) -> tuple[tuple[int, ...], float] | None:
    """Boundaries for the slots ``vws`` (the hint kept while close to optimal) and the
    resulting total rate; None when nothing fits in memory."""
    k = len(vws[0])
    speeds = [sum(row[j].speed for row in vws) for j in range(k)]
    caps = [min(row[j].memory for row in vws) for j in range(k)]
    bounds = best_bounds(costs, speeds, caps, settings)
    if bounds is None:
        return None
    pre = _prefix(costs.seconds)
    if (hint is not None and len(hint) == k + 1 and hint[0] == 0 and hint[-1] == costs.layers
            and _feasible(costs, hint, caps, settings)
            and settings.keep_within * _bottleneck(pre, hint, speeds)
            <= _bottleneck(pre, bounds, speeds)):
        bounds = tuple(hint)
    rates = vw_rates(costs, bounds, [[m.speed for m in row] for row in vws],
                     settings.micro_batch)
    return bounds, sum(rates)


def _orders(k: int) -> list[tuple[int, ...]]:
    """The orders of tiers over stages tried fresh: every one up to 5 stages (120), else
    fastest-first and fastest-last."""
    if k <= 5:
        return list(itertools.permutations(range(k)))
    return [tuple(range(k)), tuple(reversed(range(k)))]


def _fit_fresh(costs: Costs, vws: list[list[Candidate]], settings: Settings,
               hint: Sequence[int] | None
               ) -> tuple[list[list[Candidate]], tuple[tuple[int, ...], float]] | None:
    """The best order of the speed tiers over the stages (an expensive layer, e.g. a
    language model's head, belongs on a fast tier wherever it is in the model)."""
    best = None
    for order in _orders(len(vws[0])):
        cand = [[row[t] for t in order] for row in vws]
        fit = _fit(costs, cand, settings, hint)
        if fit is not None and (best is None or fit[1] > best[1][1] * (1 + 1e-9)):
            best = (cand, fit)
    return best


def decide(members: Sequence[Candidate], costs: Costs, settings: Settings,
           hint: Sequence[int] | None = None) -> Layout | None:
    """The layout of a generation (see the module docstring). ``members`` in rank order;
    ``hint``: the previous layout's boundaries. Returns None when no layout fits the
    members' memory (or no member has a positive speed)."""
    live = [m for m in members if m.speed > 0 and math.isfinite(m.speed)]
    if not live:
        return None
    k = min(settings.stages, len(live), costs.layers)
    v_count = len(live) // k
    idle = sorted(m.rank for m in members if m not in live)
    tiers, fresh_spares = _tiered(live, v_count, k)
    fresh = _fit_fresh(costs, tiers, settings, hint)
    kept = _kept(live, v_count, k)
    kept_fit = _fit(costs, kept[0], settings, hint) if kept is not None else None
    if kept_fit is not None and (fresh is None
                                 or kept_fit[1] >= settings.keep_within * fresh[1][1]):
        (vws, spares), (bounds, _) = kept, kept_fit  # type: ignore[misc]
    elif fresh is not None:
        (vws, (bounds, _)), spares = fresh, fresh_spares
    else:
        return None
    rates = vw_rates(costs, bounds, [[m.speed for m in row] for row in vws], settings.micro_batch)
    return Layout(tuple(tuple(m.rank for m in row) for row in vws), bounds, rates,
                  tuple(sorted([*spares, *idle])))


# -- moving state --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """What a member holds: layers ``[lo, hi)`` current at ``wave`` (-1: nothing current:
    a joiner, or a member that cannot reach the agreed wave)."""

    rank: int
    lo: int = 0
    hi: int = 0
    wave: int = -1


@dataclass(frozen=True)
class Transfer:
    """``src`` sends layers ``[lo, hi)`` (and the shared state) to ``dst``; ``lo == hi``:
    the shared state alone."""

    src: int
    dst: int
    lo: int
    hi: int


def transfers(holdings: Sequence[Holding], layout: Layout, wave: int,
              weights: Sequence[float] | None = None
              ) -> tuple[tuple[Transfer, ...], tuple[int, ...]]:
    """The moves that give every member its layers of ``layout`` at ``wave``.

    ``holdings``: one per rank, in rank order; ``weights``: each layer's bytes (balances the
    sources; default 1 each). Returns ``(transfers, missing)``: transfers sorted by
    ``(dst, lo)``, and the layers that no member holds at ``wave`` (their receivers get
    nothing for them: the caller resumes from a snapshot or gives the job up).
    """
    n_layers = layout.bounds[-1]
    w = list(weights) if weights is not None else [1.0] * n_layers
    current = [h for h in holdings if h.wave == wave and h.hi > h.lo]
    up_to_date = sorted(h.rank for h in holdings if h.wave == wave)
    load = {h.rank: 0.0 for h in holdings}
    out: list[Transfer] = []
    missing: set[int] = set()
    for h in sorted(holdings, key=lambda h: h.rank):
        lo, hi = layout.layers_of(h.rank)
        have = range(h.lo, h.hi) if h.wave == wave else range(0)
        need = [layer for layer in range(lo, hi) if layer not in have]
        sent = False
        i = 0
        while i < len(need):
            layer = need[i]
            srcs = [c for c in current if c.lo <= layer < c.hi and c.rank != h.rank]
            if not srcs:
                missing.add(layer)
                i += 1
                continue

            def run(c: Holding, start: int = i) -> int:
                j = start
                while j < len(need) and c.lo <= need[j] < c.hi and (
                        j == start or need[j] == need[j - 1] + 1):
                    j += 1
                return j - start

            src = min(srcs, key=lambda c: (-run(c), load[c.rank], c.rank))
            n = run(src)
            out.append(Transfer(src.rank, h.rank, layer, layer + n))
            load[src.rank] += sum(w[layer:layer + n])
            sent = True
            i += n
        if h.wave != wave and not sent and up_to_date:
            out.append(Transfer(up_to_date[0], h.rank, 0, 0))  # the shared state alone
    return tuple(sorted(out, key=lambda t: (t.dst, t.lo))), tuple(sorted(missing))


def handover(layout: Layout, staying: Sequence[int]) -> tuple[Transfer, ...]:
    """Before members leave with notice: each stage none of whose replicas stays is sent by
    its first replica to a member that stays and can hold it contiguously: a spare (it holds
    nothing) or, else, a member whose layers end where the stage begins or begin where it
    ends (lowest rank first; a receiver's range grows with what it received). A stage nobody
    can take is left out (the durable snapshot is then the floor)."""
    held = {r: layout.layers_of(r) for r in sorted(staying)}
    out = []
    for j in range(layout.stages):
        ranks = layout.stage_ranks(j)
        if not ranks or any(r in held for r in ranks):
            continue
        lo, hi = layout.bounds[j], layout.bounds[j + 1]
        empty = [r for r, (a, b) in held.items() if a >= b]
        near = [r for r, (a, b) in held.items() if a < b and (b == lo or a == hi)]
        if not empty and not near:
            continue
        dst = (empty or near)[0]
        a, b = held[dst]
        held[dst] = (lo, hi) if a >= b else (min(a, lo), max(b, hi))
        out.append(Transfer(ranks[0], dst, lo, hi))
    return tuple(out)


def gather(layout: Layout) -> tuple[Transfer, ...]:
    """The moves that put every layer on VW 0's stage-0 member (evaluation, snapshots, the
    trained model): each other stage of VW 0 sends its layers."""
    head = layout.vws[0][0]
    return tuple(Transfer(r, head, layout.bounds[j], layout.bounds[j + 1])
                 for j, r in enumerate(layout.vws[0]) if j > 0)


def wave_micro_sizes(cursor: Any, waves: int, dataset_size: int, global_batch: int,
                     min_batch: int, micro_batch: int) -> list[tuple[int, ...]]:
    """The micro-batch sizes of the next ``waves`` waves from the data ``cursor`` (a
    :class:`trainer.data.sampler.CursorState`): each wave is one step of the global batch
    (:meth:`~trainer.data.sampler.CursorState.step_total`), cut by :func:`micro_sizes`."""
    out = []
    for _ in range(waves):
        total = cursor.step_total(dataset_size, global_batch, min_batch=min_batch)
        out.append(micro_sizes(total, micro_batch))
        cursor = cursor.advance(dataset_size, total)
    return out
