"""Whole virtual workers as the optimiser's candidates, when the model does not fit one GPU.

Design (pure). A job whose training state does not fit an offering's GPU memory cannot run
there in the ring; with the trainer's pipeline mode (``Job(mode="pipeline")``, issue 19) it
runs on ``k`` such GPUs as the ``k`` stages of a *virtual worker* (VW). :func:`expand` turns
each such offering into one candidate whose unit is a whole VW, so the MILP prices and
counts VWs, never a fraction of one:

* memory: the job needs ``model_mb x MEMORY_FACTOR`` (weights, gradients and Adam's two
  moments in fp32, plus a quarter for activations and fragmentation; the trainer's own
  layout later cuts by measured bytes); ``k`` is the fewest GPUs whose share fits one GPU,
  rounded up to whole instances (a VW of ``n`` instances of ``g`` GPUs has ``n g`` stages);
  up to ``MAX_STAGES`` (an offering needing more is left out, with a note);
* price ``n`` times the instance's; throughput :func:`vw_speed`: ``n`` times its speed
  times the pipeline's efficiency ``m / (m + k - 1)`` with ``m = MICRO_PER_STAGE k``
  micro-batches per wave (the bubble), slowed by the activations between instances when
  their transfer is not hidden (below); revocations ``n`` times the instance's hazard (any
  member's revocation costs the VW a re-form); capacity and the held fleet in whole VWs.
* activations: every sample crosses each of the ``n - 1`` boundaries between the VW's
  instances twice, its activations forward and their gradients back (``a`` MB per sample,
  ``job.activation_mb``), over the zone's link (``fleet.intra_zone_gbps``; stages inside one
  instance hand over through its own memory, not priced). An instance's link carries
  ``t_x = 2 a / B`` seconds per sample while it computes ``t_c = 1 / (n s)`` seconds per
  sample of the VW's samples (its ``1/n`` of the model); sends overlap the other
  micro-batches' compute, so the transfers are hidden while ``t_x <= t_c`` and only their
  excess adds: ``t = t_c / efficiency + max(0, t_x - t_c)`` seconds per sample, the speed is
  ``1 / t``. (The link is taken as shared by both directions: a middle instance sends
  activations on and gradients back.)

:func:`instances` turns a plan's counts back into instances (a VW unit is ``n`` of them).
Offerings whose GPU fits the model, or whose memory is unknown, stay as they are (the ring).

Rule for callers: expand the candidates of every decision (the planner's
:func:`~provisioner.plan.pipeline.candidates` does) and convert every plan's counts with
:func:`instances` before reconciling; ``Problem.max_size`` and the zone shares count a VW
as its ``n`` instances (:func:`per_unit`, which the solver and the pacing read).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pricing.model import Offering
from provisioner.plan.model import Candidate, Plan, gpu_spec

MEMORY_FACTOR = 4 * 1.25  # weights + gradients + 2 Adam moments, fp32; + 25 % headroom
MICRO_PER_STAGE = 4  # micro-batches per wave per stage the efficiency assumes
MAX_STAGES = 16


@dataclass(frozen=True)
class VirtualWorkers(Candidate):
    """A candidate whose unit is one VW of ``instances`` instances and ``stages`` stages
    (its price, speed, hazard, GPUs, capacity and held count are the whole VW's)."""

    stages: int = 1
    instances: int = 1


def need_gib(model_mb: float) -> float:
    """GiB of GPU memory training the model takes (see the module docstring)."""
    return model_mb * MEMORY_FACTOR / 1024


def efficiency(stages: int) -> float:
    """The pipeline's share of useful time, ``m / (m + k - 1)``, ``m = MICRO_PER_STAGE k``."""
    m = MICRO_PER_STAGE * stages
    return m / (m + stages - 1)


def vw_speed(speed: float, instances: int, stages: int, activation_mb: float = 0.0,
             gbps: float = math.inf) -> float:
    """Samples/s of one VW of ``instances`` instances of ``speed`` samples/s each (the
    speed one instance would have holding the whole model) cut into ``stages`` stages, with
    ``activation_mb`` MB of activations per sample between instances over ``gbps`` Gb/s
    (see the module docstring)."""
    n = max(1, instances)
    if speed <= 0:
        return 0.0
    t_c = 1.0 / (n * speed)
    t_x = 2.0 * activation_mb * 8e6 / (gbps * 1e9) if n > 1 and gbps > 0 else 0.0
    return 1.0 / (t_c / efficiency(stages) + max(0.0, t_x - t_c))


def shape(memory_gib: float, gpus: int, need: float) -> tuple[int, int] | None:
    """``(stages, instances)`` of the smallest VW of instances with ``gpus`` GPUs of
    ``memory_gib`` each that holds ``need`` GiB, or None when it would take more than
    ``MAX_STAGES``."""
    g = max(1, gpus)
    k = max(2, math.ceil(need / memory_gib))
    n = math.ceil(k / g)
    return (n * g, n) if n * g <= MAX_STAGES else None


def expand(cands: Sequence[Candidate], model_mb: float,
           memory: Mapping[str, float | None] | None = None, activation_mb: float = 0.0,
           gbps: float = math.inf) -> tuple[list[Candidate], list[str]]:
    """The candidates with every offering whose GPU cannot hold the model replaced by its
    VW candidate (see the module docstring), and notes. ``memory``: GiB per GPU by instance
    type, overriding :mod:`pricing.catalog` (tests); ``activation_mb``: per sample between
    stages; ``gbps``: the link between a VW's instances."""
    need = need_gib(model_mb)
    out: list[Candidate] = []
    as_vw: dict[str, tuple[int, int]] = {}
    slowed: dict[str, float] = {}
    dropped: set[str] = set()
    for c in cands:
        itype = c.offering.instance_type
        mem = memory.get(itype) if memory is not None else _memory(itype)
        if mem is None or mem <= 0 or need <= mem:
            out.append(c)
            continue
        per = max(1, c.gpus)
        got = shape(mem, per, need)
        if got is None:
            dropped.add(itype)
            continue
        k, n = got
        as_vw[itype] = got
        speed = vw_speed(c.samples_per_s, n, k, activation_mb, gbps)
        unhidden = vw_speed(c.samples_per_s, n, k)  # the same VW, its activations free
        if speed < unhidden * (1 - 1e-9):
            slowed[itype] = speed / unhidden
        out.append(VirtualWorkers(
            c.offering, c.price_per_hour * n, speed,
            c.hazard_per_hour * n, c.loss_hours, c.gpus * n,
            None if c.max_count is None else c.max_count // n, c.current // n,
            stages=k, instances=n))
    notes = []
    if as_vw:
        notes.append(f"the model needs ~{need:.0f} GiB: planned as virtual workers "
                     + ", ".join(f"{t} x{n} ({k} stages)" for t, (k, n) in sorted(as_vw.items())))
    if slowed:
        notes.append(f"activations of {activation_mb:g} MB/sample over {gbps:g} Gb/s slow "
                     "virtual workers to " + ", ".join(
                         f"{t} {f:.0%}" for t, f in sorted(slowed.items())[:8])
                     + " of their compute")
    if dropped:
        notes.append(f"left out (more than {MAX_STAGES} stages for ~{need:.0f} GiB): "
                     + ", ".join(sorted(dropped)[:8]))
    return out, notes


def _memory(instance_type: str) -> float | None:
    spec = gpu_spec(instance_type)
    return spec.memory_gib if spec is not None else None


def per_unit(c: Candidate) -> int:
    """Instances one unit of ``c`` is (``n`` for a VW, else 1): what the fleet-size cap and
    the zone shares count."""
    return c.instances if isinstance(c, VirtualWorkers) else 1


def most_units(c: Candidate, max_size: int, *, capped: bool = True) -> int:
    """The most units of ``c`` a fleet of at most ``max_size`` instances holds (a VW counts
    its ``n`` instances), and with ``capped`` no more than its known capacity
    (``max_count``)."""
    most = max_size // per_unit(c)
    if capped and c.max_count is not None:
        most = min(most, c.max_count)
    return max(most, 0)


def units(c: Candidate, instances: int) -> int:
    """The whole units of ``c`` that ``instances`` instances make (``instances // n`` for a
    VW of ``n`` instances; the instances themselves otherwise)."""
    return instances // c.instances if isinstance(c, VirtualWorkers) else instances


def instances(plan: Plan) -> dict[Offering, int]:
    """The plan's counts in instances (a VW unit of ``n`` instances counts ``n``)."""
    counts = dict(plan.counts)
    for c in plan.chosen:
        if isinstance(c, VirtualWorkers) and c.offering in counts:
            counts[c.offering] = counts[c.offering] * c.instances
    return counts
