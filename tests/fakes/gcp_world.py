"""A GCP project on the local Compute Engine fake, for the GCP end-to-end test of the daemon.

Design: the GCP counterpart of :mod:`tests.fakes.aws_world`. :class:`GcpWorld` serves
:class:`tests.fakes.gcp_fake.GcpFake` on an ephemeral port; the daemon's real
:class:`~provisioner.drivers.gcp.GcpDriver` talks to it through google-cloud-compute's REST
transport (``[gcp] api_endpoint`` -> ``ClientOptions(api_endpoint=...)``, and
``AnonymousCredentials``), so launches, lists, deletes and preemption operations go over HTTP
exactly as to Compute Engine. Prices are a fixed snapshot of GCP spot offerings in three
us-central1 zones (:func:`market`):

- ``g2-standard-8`` (one L4): spot $0.479872/h, on-demand $0.853624/h, the us-central1 figures
  of the 2026-07-30 snapshot in ``../shared/data/gcp_gpu_price_history`` (copied as two
  numbers, not read, so the test runs without the data);
- ``n1-standard-8+nvidia-tesla-v100x1`` (N1 with one V100 as a guest accelerator; the history
  has no N1 rows): spot $0.82/h, on-demand $2.86/h, GCP's list prices (V100 $2.48/h on-demand,
  $0.74/h spot; n1-standard-8 $0.38/h, $0.08/h).

GCP prices a spot type the same in every zone of a region; here zone ``-a`` is a cent cheaper
than ``-b`` and ``-b`` than ``-c``, so the plan (and which zone a test stocks out) is
deterministic.

Rule for callers: one world per test module (``with GcpWorld() as world``), a job id of its own
per daemon so tests sharing a world do not see each other's instances.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

from tests.fakes.aws_world import START, real_clock
from tests.fakes.gcp_fake import GcpFake

PROJECT = "spotring-e2e"
REGION = "us-central1"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
V100_TYPE = "n1-standard-8+nvidia-tesla-v100x1"
L4_TYPE = "g2-standard-8"
#: instance type -> (spot $/h in zone -a, on-demand $/h); see the module docstring
TYPES = {V100_TYPE: (0.82, 2.86), L4_TYPE: (0.479872, 0.853624)}
ZONE_STEP_USD = 0.01


class GcpWorld:
    """The Compute Engine fake of one project, with helpers to read and disturb it."""

    def __init__(self) -> None:
        self.fake = GcpFake()

    def __enter__(self) -> "GcpWorld":
        self.fake.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.__exit__(*exc)

    @property
    def endpoint(self) -> str:
        return self.fake.endpoint

    def settings(self, job_id: str, *, max_size: int = 3, **daemon: Any) -> Any:
        """Validated settings for a daemon of ``job_id`` on this world's GCP driver."""
        from provisioner.config import parse_settings

        return parse_settings({
            "job": {"id": job_id},
            "cloud": {"driver": "gcp"},
            "gcp": {"project": PROJECT, "zones": list(ZONES), "api_endpoint": self.endpoint,
                    "startup_script": "python -m trainer worker"},
            "fleet": {"max_size": max_size, "markets": ["spot"], "max_zone_share": 0.5},
            "daemon": {"notice_poll_s": 2.0, "plan_s": 30.0, "price_poll_s": 60.0,
                       "metrics_s": 5.0, **daemon},
        }, origin="gcp_world")

    def driver(self, settings: Any) -> Any:
        """The real GCP driver of ``settings``, with anonymous credentials (the fake's)."""
        from google.auth.credentials import AnonymousCredentials

        from provisioner.drivers.gcp import GcpDriver

        return GcpDriver(settings.gcp, credentials=AnonymousCredentials())

    def instances(self, job_id: str) -> dict[str, dict[str, Any]]:
        """The raw VMs labelled with ``job_id``, by the driver's id ``"<zone>/<name>"``."""
        out = {}
        for inst in self.fake.alive(PROJECT):
            if inst.get("labels", {}).get("spotring-job") == job_id:
                zone = inst["zone"].rsplit("/", 1)[-1]
                out[f"{zone}/{inst['name']}"] = inst
        return out

    def preempt(self, instance_id: str) -> None:
        """Take a VM back as Compute Engine does a SPOT VM (a preemption operation)."""
        zone, _, name = instance_id.partition("/")
        self.fake.preempt(PROJECT, zone, name)

    def stockout(self, zone: str, on: bool = True) -> None:
        """Inserts in ``zone`` end in ZONE_RESOURCE_POOL_EXHAUSTED (or no longer)."""
        self.fake.stockout(zone, on)


@functools.lru_cache(maxsize=1)
def market() -> Any:
    """The GCP spot offerings of the module docstring, one quote each, an hour before START."""
    from pricing.model import Offering, PriceQuote, Snapshot

    at = START - timedelta(hours=1)
    quotes = tuple(
        PriceQuote(Offering("gcp", REGION, zone, itype, "spot"), at,
                   round(spot + i * ZONE_STEP_USD, 6), od, "gcp-world")
        for itype, (spot, od) in sorted(TYPES.items()) for i, zone in enumerate(ZONES))
    return Snapshot(quotes=quotes)


def build_daemon(world: GcpWorld, settings: Any, state_path: str | Path, *,
                 coordinator: Any = None,
                 now: Callable[[], datetime] | None = None) -> Any:
    """A :class:`~provisioner.daemon.loop.scheduler.Daemon` on the real GCP driver against ``world``."""
    from pricing.sources.trace import TraceSource
    from provisioner.daemon.wiring import build_daemon as Daemon
    from provisioner.daemon.state import State
    from tests.fakes.ring import FakeRing as FakeCoordinator

    return Daemon(settings, world.driver(settings), TraceSource([], snapshot=market()),
                  State(state_path), now=now or real_clock(),
                  coordinator=coordinator or FakeCoordinator())
