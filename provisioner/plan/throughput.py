"""Throughput per instance type: a prior per GPU model, recalibrated from measurements.

Design: an immutable value. The prior for an instance type is, in order, an explicit
override (``job.throughput_priors``), else ``unit x relative_throughput(gpu model) x gpu
count`` from :mod:`pricing.catalog` (published figures, sources noted there). What the
trainer measures replaces the prior: the first measurement of a type is taken as is, later
ones are blended with an exponentially weighted mean (``alpha``), so one noisy step does not
swing the fleet.

Rule for callers: :meth:`ThroughputModel.observe` returns a *new* model; keep the returned
one. :meth:`samples_per_s` raises ``KeyError`` for a type with neither a prior nor a
measurement (callers skip that offering and say so).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

log = logging.getLogger(__name__)


def _catalog_prior(instance_type: str, unit: float) -> float | None:
    """unit x relative throughput x GPU count from pricing.catalog, or None when unknown."""
    try:
        from pricing import catalog
    except ImportError:  # pragma: no cover - the catalog is part of the package
        return None
    try:
        spec = catalog.gpu_for(instance_type)
        if spec is None or spec.count <= 0:
            return None
        rel = catalog.relative_throughput(spec.model)
    except (KeyError, ValueError, LookupError):
        return None
    if rel is None or not rel > 0:
        return None
    return unit * float(rel) * spec.count


@dataclass(frozen=True)
class ThroughputModel:
    """Samples/s per instance type: priors, then what was measured.

    ``priors`` maps instance type -> samples/s and wins over the catalog; ``unit`` is the
    samples/s of one GPU of relative throughput 1.0; ``alpha`` weighs a new measurement
    against the previous estimate (the first measurement replaces the prior).
    """

    priors: Mapping[str, float] = field(default_factory=dict)
    unit: float = 400.0
    alpha: float = 0.5
    measured: Mapping[str, float] = field(default_factory=dict)
    observations: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"ThroughputModel.alpha={self.alpha}: must be in (0, 1]")
        if not self.unit > 0:
            raise ValueError(f"ThroughputModel.unit={self.unit}: must be > 0")
        for name in ("priors", "measured", "observations"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def prior(self, instance_type: str) -> float:
        """The prior samples/s of one instance. Raises KeyError when no prior is known."""
        if instance_type in self.priors:
            return float(self.priors[instance_type])
        value = _catalog_prior(instance_type, self.unit)
        if value is None:
            raise KeyError(f"no throughput prior for instance type {instance_type!r} "
                           f"(add it to job.throughput_priors)")
        return value

    def samples_per_s(self, instance_type: str) -> float:
        """Best estimate of one instance's samples/s: measured if any, else the prior.

        Raises KeyError when neither is known.
        """
        if instance_type in self.measured:
            return float(self.measured[instance_type])
        return self.prior(instance_type)

    def observe(self, instance_type: str, samples_per_s: float) -> "ThroughputModel":
        """Return a new model that has seen one measurement of ``instance_type``.

        Raises ValueError on a non-finite or non-positive measurement (changes nothing).
        """
        if not (isinstance(samples_per_s, (int, float)) and math.isfinite(samples_per_s)
                and samples_per_s > 0):
            raise ValueError(f"measured samples/s for {instance_type!r} = {samples_per_s!r}: "
                             f"must be a finite number > 0")
        measured = dict(self.measured)
        seen = dict(self.observations)
        old = measured.get(instance_type)
        measured[instance_type] = (float(samples_per_s) if old is None
                                   else (1 - self.alpha) * old + self.alpha * samples_per_s)
        seen[instance_type] = seen.get(instance_type, 0) + 1
        log.debug("throughput observed", extra={"instance_type": instance_type,
                                                "samples_per_s": samples_per_s})
        return replace(self, measured=measured, observations=seen)
