"""Hybrid aggregation: all-reduce inside a zone, parameter-server shards across zones, and
asynchronous large mini-batches with bounded staleness (issue 20; ``Job.mode = "hybrid"``).

Design. Members that share a fast link (one zone: ``--zone`` / ``SPOTRING_ZONE``) form a
zone and all-reduce among themselves, as the ring does; each zone trains as one virtual
worker on whole global batches (the job's ``B``: an update is what one ring step commits),
asynchronously of the other zones; across zones the updates travel through parameter-server
shards on gloo point-to-point, placed by size. An update is applied to weights at most
``staleness`` versions older than the weights it was computed on; every replica applies the
same updates in the same order, so the ring's state transfer, snapshots, checksums and
exactly-once data carry over. The modules: :mod:`~trainer.hybrid.placement` (zones, shards:
pure), :mod:`~trainer.hybrid.staleness` (tickets and the bound: pure),
:mod:`~trainer.hybrid.update` (an update's vector: compute, apply),
:mod:`~trainer.hybrid.server` (the exchange), :mod:`~trainer.worker.modes.hybrid` (a membership).

Rule for callers: set ``Job.mode = "hybrid"`` and optionally ``Job.hybrid =
HybridSettings(...)``; ``staleness=0`` is today's synchronous ring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HybridSettings:
    """The hybrid mode's settings (``Job.hybrid``).

    ``staleness`` (s): an update is applied to weights at most s versions newer than the
    ones it was computed on; 0 runs the synchronous ring. ``shards``: parameter-server
    shards (0: one per zone, each served by its zone's leader). ``tolerance``: how far above
    the mean a shard may carry a parameter whole before it is cut. ``max_apply``: updates a
    zone applies in one round at most (bounds the zone's broadcast).
    """

    staleness: int = 1
    shards: int = 0
    tolerance: float = 0.05
    max_apply: int = 8

    def __post_init__(self) -> None:
        for name in ("staleness", "shards", "max_apply"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"HybridSettings.{name}={v!r}: must be an integer >= 0")
        if self.max_apply < 1:
            raise ValueError(f"HybridSettings.max_apply={self.max_apply}: must be >= 1")
        if not isinstance(self.tolerance, (int, float)) or not 0 <= self.tolerance <= 1:
            raise ValueError(f"HybridSettings.tolerance={self.tolerance!r}: must be in [0, 1]")


def settings_of(job: Any) -> HybridSettings:
    """The job's :class:`HybridSettings` (the defaults when ``Job.hybrid`` is None).

    Raises ``ValueError`` naming the fix when ``Job.hybrid`` is something else.
    """
    got = getattr(job, "hybrid", None)
    if got is None:
        return HybridSettings()
    if not isinstance(got, HybridSettings):
        raise ValueError(f"Job.hybrid={got!r}: expected trainer.hybrid.HybridSettings(...)")
    return got
