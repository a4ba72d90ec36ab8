"""Price sources: one file per implementation of :class:`pricing.sources.base.PriceSource`.

:func:`make_source` is the one factory the commands (``prices``, ``plan``, ``run``) use; it
imports the cloud SDK of the chosen source only (SkyPilot-style lazy imports), so a trace
replay never pays for boto3 or the Google clients.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from pricing.errors import PricingError
from pricing.sources.base import PriceSource

SOURCE_KINDS = ("aws", "gcp", "trace")

#: Files under $SPOTRING_DATA used when a trace source is asked for without a path.
DEFAULT_TRACE_FILES = ("gcp_gpu_price_history/gcp_gpu_vm_prices_history.csv.gz",
                       "preemption_lifetimes/gcp_preemptible_gpu_lifetimes_2019.csv")


def default_trace() -> list[Path]:
    """The default traces under ``$SPOTRING_DATA``; raises PricingError when it is unset."""
    root = os.environ.get("SPOTRING_DATA")
    if not root:
        raise PricingError("no trace given: pass --trace PATH (a trace file or folder) or set "
                           "SPOTRING_DATA to the shared data folder")
    return [Path(root) / f for f in DEFAULT_TRACE_FILES if (Path(root) / f).exists()]


def make_source(kind: str, *, trace: str | Path | Sequence[str | Path] | None = None,
                regions: Sequence[str] | None = None, endpoint_url: str | None = None,
                speed: float | None = None, clock: Callable[[], float] | None = None,
                project: str | None = None, **options: Any) -> PriceSource:
    """Build the source ``kind`` (``aws``, ``gcp`` or ``trace``).

    ``trace``: path(s) for the trace source (default :func:`default_trace`); ``speed`` and
    ``clock`` make it replay (see :class:`pricing.sources.trace.TraceSource`); trace quotes
    are sanity-checked at load so a replay never serves a refused price. ``regions``: the
    AWS fan-out or the GCP regions to read; ``endpoint_url``: a moto server or local fake.
    Raises ValueError for an unknown kind; the sources raise CredentialsError on first use
    without credentials.
    """
    if kind == "trace":
        from pricing.sources.trace import TraceSource

        paths = trace if trace else default_trace()
        return TraceSource(paths, speed=speed, clock=clock, sanitize=True, **options)
    if kind == "aws":
        from pricing.sources.aws import AwsSource

        options.setdefault("signals", True)  # placement scores into the risk estimate
        return AwsSource(regions=regions, endpoint_url=endpoint_url, **options)
    if kind == "gcp":
        from pricing.sources.gcp import GcpSource

        options.setdefault("signals", True)  # capacityHistory into the risk estimate
        return GcpSource(project=project, regions=regions, endpoint_url=endpoint_url, **options)
    raise ValueError(f"source kind {kind!r}: must be one of {', '.join(SOURCE_KINDS)}")
