"""The solver's vocabulary: Candidate, Problem, Plan, and the ring's scaling model.

Design: frozen dataclasses and one pure function (:func:`ring_efficiency`), imported by every
other module of :mod:`provisioner.plan` and by the simulator; this module imports none of
them, so the solver modules form no cycle. The MILP these describe is written out in
:mod:`provisioner.plan.solve`.

Rule: build a Problem with :func:`provisioner.plan.build.build_problem` or by hand (tests);
never mutate one (use ``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from pricing.model import GpuSpec, Offering

KINDS = ("max-throughput", "min-cost", "deadline")


def gpu_spec(instance_type: str) -> GpuSpec | None:
    """The GPUs of an instance type from :mod:`pricing.catalog`, or None when unknown."""
    try:
        from pricing import catalog
        return catalog.gpu_for(instance_type)
    except (ImportError, KeyError, ValueError, LookupError):
        return None


def family_of(instance_type: str) -> str:
    """Instance family: ``p3`` for ``p3.2xlarge``, ``a2`` for ``a2-highgpu-1g``."""
    return instance_type.replace("-", ".").split(".", 1)[0]


def gpu_of(instance_type: str) -> str:
    """The GPU model of an instance type (``v100`` for ``p3.2xlarge`` and ``p3.16xlarge``,
    ``t4`` for ``n1-standard-8+nvidia-tesla-t4``), else its family: the hardware one outage
    takes along, whatever the size."""
    spec = gpu_spec(instance_type)
    return spec.model.lower() if spec is not None else family_of(instance_type)


@dataclass(frozen=True)
class Candidate:
    """One offering as the solver sees it (see the module docstring for the symbols)."""

    offering: Offering
    price_per_hour: float
    samples_per_s: float
    hazard_per_hour: float = 0.0
    loss_hours: float = 0.0
    gpus: int = 1
    max_count: int | None = None
    current: int = 0
    min_count: int = 0  # keep at least this many (launched lately, or spot kept beside a floor)

    def __post_init__(self) -> None:
        # computed once: the solver reads it a few times per candidate per pass (not a
        # field, so equality, hashing and replace() are those of the fields alone)
        object.__setattr__(self, "_useful", self.samples_per_s * max(
            0.0, 1.0 - self.hazard_per_hour * self.loss_hours))

    @property
    def useful(self) -> float:
        """Useful samples/s of one instance: raw minus the expected loss to revocations."""
        return self._useful  # type: ignore[attr-defined]

    @property
    def room(self) -> bool:
        """It may grow: no known cap, or a cap above what it holds (out of capacity lately,
        capped at what it holds, it may not)."""
        return self.max_count is None or self.max_count > self.current

    def capped_at_held(self) -> "Candidate":
        """The same candidate that may keep what it holds but not grow: capped at what it
        holds (a known cap below that stays)."""
        cap = self.current if self.max_count is None else min(self.max_count, self.current)
        return replace(self, max_count=cap)

    @property
    def zone_key(self) -> str:
        o = self.offering
        return f"{o.region}/{o.zone}" if o.zone != "*" else o.region

    @property
    def family(self) -> str:
        return family_of(self.offering.instance_type)


@dataclass(frozen=True)
class Problem:
    """Everything one solve needs. Build it with :func:`build_problem` or by hand (tests)."""

    candidates: tuple[Candidate, ...]
    objective: str = "max-throughput"
    target_samples_per_s: float | None = None
    budget_per_hour: float | None = None
    ondemand_floor_samples_per_s: float = 0.0
    min_size: int = 0
    max_size: int = 8
    max_zone_share: float = 1.0
    zone_allowance: int = 1
    region_quota_gpus: Mapping[str, int] = field(default_factory=dict)
    family_quota_gpus: Mapping[str, int] = field(default_factory=dict)
    max_regions: int = 1000
    model_mb: float = 0.0
    activation_mb: float = 0.0  # per sample between pipeline stages (virtual workers)
    global_batch: int = 256
    intra_zone_gbps: float = 10.0
    inter_zone_gbps: float = 5.0
    inter_region_gbps: float = 1.0
    boot_s: float = 0.0
    reform_s: float = 0.0
    churn_horizon_hours: float = 1.0
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.objective not in KINDS:
            raise ValueError(f"Problem.objective={self.objective!r}: one of {', '.join(KINDS)}")
        if self.objective != "max-throughput" and not self.target_samples_per_s:
            raise ValueError(f"Problem.target_samples_per_s is needed for {self.objective!r}")

    @property
    def links(self) -> tuple[float, float, float]:
        """(intra-zone, inter-zone, inter-region) Gb/s, as :func:`~provisioner.plan.pacing.
        fleet_rate` takes them."""
        return self.intra_zone_gbps, self.inter_zone_gbps, self.inter_region_gbps


@dataclass(frozen=True)
class Plan:
    """The target fleet and why. ``counts`` omits zeros; figures are for the whole fleet."""

    counts: Mapping[Offering, int]
    cost_per_hour: float
    throughput: float  # useful samples/s after the ring's scaling efficiency
    hazard_per_hour: float  # expected revocations per hour across the fleet
    binding: tuple[str, ...]
    status: str  # "optimal" | "time-limit" | "fallback-lp" | "empty"
    objective: str = "max-throughput"
    raw_throughput: float = 0.0
    ring_efficiency: float = 1.0
    link: str = "intra-zone"
    solve_ms: float = 0.0
    considered: int = 0
    pruned: int = 0
    chosen: tuple[Candidate, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return sum(self.counts.values())

    def explain(self) -> str:
        """A few lines: what is chosen, what it costs and yields, and what bound it."""
        lines = [f"objective {self.objective}: status {self.status}, {self.size} instances, "
                 f"${self.cost_per_hour:.3f}/h, {self.throughput:.1f} useful samples/s "
                 f"(ring efficiency {self.ring_efficiency:.3f} over the {self.link} link), "
                 f"{self.hazard_per_hour:.3f} expected revocations/h"]
        for c in self.chosen:
            n = self.counts.get(c.offering, 0)
            lines.append(f"  {n:>3} x {c.offering.key}  ${c.price_per_hour:.3f}/h each, "
                         f"{c.samples_per_s:.1f} samples/s ({c.useful:.1f} useful), "
                         f"hazard {c.hazard_per_hour:.3f}/h" + (f", held now {c.current}"
                                                                if c.current else ""))
        lines.append("bound by: " + (", ".join(self.binding) if self.binding else "nothing"))
        lines.append(f"considered {self.considered} offerings, pruned {self.pruned} dominated; "
                     f"solved in {self.solve_ms:.1f} ms")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def ring_efficiency(n: int, raw_samples_per_s: float, model_mb: float, global_batch: int,
                    gbps: float) -> float:
    """R / S for a ring of ``n`` workers delivering ``raw_samples_per_s`` in compute."""
    if n <= 1 or raw_samples_per_s <= 0 or model_mb <= 0:
        return 1.0
    t_comm = 2.0 * (n - 1) / n * model_mb * 8e6 / (gbps * 1e9)
    return 1.0 / (1.0 + raw_samples_per_s * t_comm / global_batch)


def ring_rate(n: int, speed: float, model_mb: float, global_batch: int, gbps: float) -> float:
    """Useful samples/s of a ring of ``n`` workers of ``speed`` samples/s each."""
    raw = n * speed
    return raw * ring_efficiency(n, raw, model_mb, global_batch, gbps)
