"""Which training mode a planned fleet runs (issue 20): the synchronous ring, or hybrid
aggregation (all-reduce inside a group on a fast link, parameter-server shards across
groups, asynchronous updates of bounded staleness: :mod:`trainer.hybrid`).

Design: pure, from the plan alone. A plan of virtual workers (the model does not fit one
GPU: :mod:`provisioner.plan.virtual`) runs the pipeline mode. A fleet that spans zones (or
regions) runs hybrid, a group per zone: what crosses the slow link is then one update
vector per update, not the ring's all-reduce. A fleet inside one zone whose instances'
speeds differ by :data:`SPREAD` or more runs hybrid with a group per instance type, so
the slow ones compute their own updates instead of holding the others back. Anything else
runs the ring (the hybrid with one group is the ring plus a sequencer). The figures are
``benchmarks/hybrid.py``'s (docs/trainer.md, "Hybrid aggregation"): two zones over a
50 Mbit/s link, hybrid 1.97x the ring's samples/s with a third of its cross-zone bytes;
two groups on an unshaped link, 1.49x with a 3x straggler (1.47x without one: the
threshold is the one speed spread measured, not a measured crossover); one zone, the ring
1.05x the hybrid's.

Rule for callers: :func:`training_mode` returns the mode and each offering's group (the
worker's ``--zone`` / ``SPOTRING_ZONE``); ``provision plan`` prints them. The daemon fixes
one mode per run with :func:`run_mode` at its first plan (members of two modes cannot train
together, so a later plan does not switch a running job) and gives it to every launch as
``SPOTRING_MODE``, each offering's group as ``SPOTRING_ZONE``; a job whose ``Job.mode`` is
``auto`` (the default) trains in it (:func:`trainer.job.resolve_mode`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SPREAD = 3.0  # fastest / slowest instance speed at which one zone runs hybrid (measured at 3x)


@dataclass(frozen=True)
class ModeChoice:
    """The training mode of a fleet, why, and the group of each offering (by key)."""

    mode: str  # "ring" | "hybrid" | "pipeline"
    reason: str
    groups: dict[str, str] = field(default_factory=dict)


def training_mode(plan: Any, spread: float = SPREAD) -> ModeChoice:
    """The mode a :class:`provisioner.plan.model.Plan` trains in (module docstring)."""
    from provisioner.plan.virtual import VirtualWorkers

    held = [c for c in plan.chosen if plan.counts.get(c.offering, 0) > 0]
    vws = sorted({c.stages for c in held if isinstance(c, VirtualWorkers) and c.stages > 1})
    if vws:  # the model does not fit one GPU: only the pipeline mode trains it (issue 19)
        return ModeChoice("pipeline", "the model does not fit one GPU: virtual workers of "
                          f"{', '.join(map(str, vws))} stages")
    if sum(plan.counts.get(c.offering, 0) for c in held) <= 1:
        return ModeChoice("ring", "one instance")
    zones = sorted({c.zone_key for c in held})
    if len(zones) > 1:
        return ModeChoice("hybrid", f"the fleet spans {len(zones)} zones ({', '.join(zones)}): "
                          "all-reduce inside each, parameter servers across",
                          {c.offering.key: c.zone_key for c in held})
    speeds = [c.samples_per_s for c in held if c.samples_per_s > 0]  # a worker per instance
    if speeds and max(speeds) >= spread * min(speeds):
        return ModeChoice("hybrid", f"one zone, speeds differ {max(speeds) / min(speeds):.1f}x "
                          f"(>= {spread:g}x): a group per instance type",
                          {c.offering.key: f"{c.zone_key}/{c.offering.instance_type}"
                           for c in held})
    return ModeChoice("ring", f"one zone ({zones[0]}), speeds within {spread:g}x")


#: The modes a run gives its workers (``SPOTRING_MODE``; trainer.job.CHOSEN_MODES): the
#: pipeline mode is the job's to ask for.
PASSED = ("ring", "hybrid")
#: ``[job] mode``: ``auto`` (the planner's fleet decides, :func:`training_mode`) or a mode.
SETTINGS = ("auto", *PASSED)


def run_mode(setting: str, driver: str, plan: Any) -> ModeChoice:
    """The one training mode of a run: ``setting`` (``[job] mode``) when it names one; with
    ``auto``, the ring on the local cloud (its zones are processes of one host: no slow link
    between them, so nothing for the hybrid to save) and :func:`training_mode` of the first
    plan elsewhere. The pipeline mode is the job's to ask for (its stages' settings), so a
    pipeline choice is passed on as no mode (the job's ``Job.mode`` decides)."""
    if setting not in SETTINGS:
        raise ValueError(f"job.mode {setting!r}: use one of {', '.join(SETTINGS)}")
    chosen = training_mode(plan) if plan is not None else ModeChoice("ring", "no plan yet")
    if setting != "auto":
        return ModeChoice(setting, "job.mode in the config",
                          chosen.groups if setting == "hybrid" else {})
    if driver == "local":
        return ModeChoice("ring", "the local cloud's zones share one host (no slow link)")
    return chosen
