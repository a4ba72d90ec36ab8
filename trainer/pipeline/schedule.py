"""Pipeline schedules: the order in which one stage runs its micro-batches' passes.

Design. A schedule is, per stage, a tuple of :class:`Op` (forward or backward of micro-batch
``i``); the runner executes it in order, receiving what it needs from its neighbours and
posting what it produces without waiting (sends never block, so any schedule whose receives
are consistent with its neighbours' sends cannot deadlock).

* **GPipe** (:func:`gpipe`): every forward, then every backward in reverse order; each stage
  keeps all ``m`` micro-batches' activations.
* **1F1B** (:func:`one_f_one_b`, PipeDream-Flush): stage ``j`` of ``k`` runs
  ``min(k - j - 1, m)`` warm-up forwards, then alternates one forward and one backward, then
  drains the backwards; it keeps at most ``k - j`` micro-batches' activations.

Both take ``(m + k - 1) (t_f + t_b)`` for balanced stages: the bubble (idle share) is
``(k - 1) / (m + k - 1)`` (:func:`bubble`). :func:`simulate` plays schedules against per-stage
pass times and a link latency (pure): the tests check the formula and the dependency order
with it, and the benchmark compares what it measures with it.

Rule for callers: every stage of a virtual worker runs the same kind of schedule for the
same ``m``; a micro-batch's gradient is accumulated, so the order of backwards does not
change the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FORWARD, BACKWARD = "F", "B"


@dataclass(frozen=True)
class Op:
    """One pass: ``kind`` ``F`` or ``B`` of micro-batch ``micro``."""

    kind: str
    micro: int


def gpipe(m: int, k: int, stage: int) -> tuple[Op, ...]:
    """GPipe for ``stage`` of ``k`` with ``m`` micro-batches."""
    _check(m, k, stage)
    return (*(Op(FORWARD, i) for i in range(m)), *(Op(BACKWARD, i) for i in reversed(range(m))))


def one_f_one_b(m: int, k: int, stage: int) -> tuple[Op, ...]:
    """1F1B (PipeDream-Flush) for ``stage`` of ``k`` with ``m`` micro-batches."""
    _check(m, k, stage)
    warm = min(k - stage - 1, m)
    ops = [Op(FORWARD, i) for i in range(warm)]
    for i in range(m - warm):
        ops += [Op(FORWARD, warm + i), Op(BACKWARD, i)]
    ops += [Op(BACKWARD, i) for i in range(m - warm, m)]
    return tuple(ops)


def schedule(name: str, m: int, k: int, stage: int) -> tuple[Op, ...]:
    """The schedule called ``name`` (``gpipe`` or ``1f1b``)."""
    if name == "gpipe":
        return gpipe(m, k, stage)
    if name == "1f1b":
        return one_f_one_b(m, k, stage)
    raise ValueError(f"schedule {name!r}: expected gpipe or 1f1b")


def peak_in_flight(ops: Sequence[Op]) -> int:
    """The most micro-batches whose forward ran and backward has not (activations held)."""
    live = peak = 0
    for op in ops:
        live += 1 if op.kind == FORWARD else -1
        peak = max(peak, live)
    return peak


def bubble(m: int, k: int) -> float:
    """The idle share of a balanced pipeline: ``(k - 1) / (m + k - 1)``."""
    return (k - 1) / (m + k - 1)


def _check(m: int, k: int, stage: int) -> None:
    if m < 0 or k < 1 or not 0 <= stage < k:
        raise ValueError(f"schedule: m={m}, k={k}, stage={stage}")


@dataclass(frozen=True)
class Timeline:
    """What :func:`simulate` found: the makespan, each stage's busy seconds, and each op's
    ``(start, end)`` per stage in schedule order."""

    makespan: float
    busy: tuple[float, ...]
    spans: tuple[tuple[tuple[float, float], ...], ...]

    @property
    def idle_fraction(self) -> float:
        """Idle share over all stages: ``1 - sum(busy) / (k * makespan)``."""
        if self.makespan <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def simulate(schedules: Sequence[Sequence[Op]], forward_s: Sequence[float],
             backward_s: Sequence[float], link_s: float = 0.0) -> Timeline:
    """Play one schedule per stage: an op starts when its stage is free and its input has
    arrived (``link_s`` after the neighbour produced it). Raises ``ValueError`` when the
    schedules deadlock (an op waits for one that never runs)."""
    k = len(schedules)
    done: dict[tuple[int, str, int], float] = {}
    pos = [0] * k
    free = [0.0] * k
    spans: list[list[tuple[float, float]]] = [[] for _ in range(k)]
    busy = [0.0] * k
    remaining = sum(len(s) for s in schedules)
    while remaining:
        moved = False
        for j in range(k):
            if pos[j] >= len(schedules[j]):
                continue
            op = schedules[j][pos[j]]
            if op.kind == FORWARD:
                dep = None if j == 0 else (j - 1, FORWARD, op.micro)
                dur = forward_s[j]
            else:
                dep = (j, FORWARD, op.micro) if j == k - 1 else (j + 1, BACKWARD, op.micro)
                dur = backward_s[j]
            if dep is not None and dep not in done:
                continue
            ready = 0.0 if dep is None else done[dep] + (link_s if dep[0] != j else 0.0)
            start = max(free[j], ready)
            free[j] = start + dur
            done[(j, op.kind, op.micro)] = free[j]
            spans[j].append((start, free[j]))
            busy[j] += dur
            pos[j] += 1
            remaining -= 1
            moved = True
        if not moved:
            raise ValueError("schedules deadlock: an op waits for one that never runs")
    return Timeline(max(free), tuple(busy), tuple(tuple(s) for s in spans))
