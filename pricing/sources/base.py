"""The PriceSource protocol: what every source of prices and availability implements.

Design: one small Protocol, one file per implementation (aws.py, gcp.py, trace.py), and a
fake in the tests implementing the same protocol. A source does I/O and translation only:
sanity checks live in :mod:`pricing.sanity`, storage in :mod:`pricing.store`, scheduling in
the daemon. SDK errors are translated to :mod:`pricing.errors` at this edge.

Rule for callers: treat a :class:`~pricing.model.Snapshot` as the *raw* view; pass its quotes
through :func:`pricing.sanity.check` before storing or optimising over them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, Sequence, runtime_checkable

from pricing.model import Snapshot


@runtime_checkable
class PriceSource(Protocol):
    """A source of quotes, availability and lifetimes."""

    name: str

    def fetch(
        self,
        *,
        regions: Sequence[str] | None = None,
        gpus: Sequence[str] | None = None,
        now: datetime | None = None,
    ) -> Snapshot:
        """Return what the source knows at ``now`` (latest quotes per offering and any
        history it holds), restricted to ``regions`` and GPU models ``gpus`` when given.

        Raises :class:`pricing.errors.CredentialsError` when the cloud has no credentials,
        :class:`pricing.errors.SourceError` on API failures, and
        :class:`pricing.errors.TraceFormatError` on malformed trace files.
        """
        ...
