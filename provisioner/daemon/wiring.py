"""The composition root: every part of a daemon is built and wired here, and only here.

Design: Karpenter's ``NewControllers``: :func:`build_daemon` takes the edges (settings, a
cloud driver, a price feed, the state, a clock, the ring's coordinator, a metrics sink) and
wires the market view, the planner, the write-ahead actuator, the telemetry and the
scheduler. :func:`make_coordinator` is the one place the trainer's coordinator is
constructed (with its durable snapshots: :func:`snapshot_url` says where), and
:func:`cloud_parts` the one place a cloud daemon's driver and source are made from settings
(the local run's are in :mod:`provisioner.daemon.run.local`).

Rule: the daemon's parts never build each other; a change of a constructor (the trainer's
coordinator's, a driver's) is made here.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Mapping

from provisioner.config import Settings, SnapshotSettings
from provisioner.daemon.loop.actuator import WriteAheadActuator
from provisioner.daemon.loop.market import Market
from provisioner.daemon.ports import MetricsSink, PriceFeed, RingCoordinator
from provisioner.daemon.loop.scheduler import Daemon, intervals_from
from provisioner.daemon.state import State
from provisioner.daemon.loop.telemetry import Telemetry
from provisioner.drivers import DRIVERS
from provisioner.drivers.base import CloudDriver
from provisioner.errors import ConfigError, DriverError, UserError
from provisioner.plan.objective import planner_input
from provisioner.plan.pipeline import Planner
from provisioner.plan.throughput import ThroughputModel
from provisioner.timing import Intervals

log = logging.getLogger(__name__)


def build_daemon(settings: Settings, driver: CloudDriver, source: PriceFeed, state: State, *,
                 now: Callable[[], datetime], speed: float = 1.0,
                 intervals: Intervals | None = None,
                 coordinator: RingCoordinator | None = None,
                 throughput: ThroughputModel | None = None,
                 metrics: MetricsSink | None = None,
                 launch_env: Mapping[str, str] | None = None,
                 logs: Any = None) -> Daemon:
    """A :class:`Daemon` of ``settings.job`` over these edges (nothing started yet).
    ``logs``: the cloud workers' shipped logs (:func:`shipped_logs`; None: the local cloud,
    or no ``[cloud] artifacts``)."""
    iv = intervals or intervals_from(settings)
    stopping = threading.Event()

    def clock() -> float:
        return now().timestamp()

    job = settings.job
    model = throughput or ThroughputModel(priors=job.throughput_priors,
                                          unit=job.samples_per_s_per_unit)
    market = Market(source, driver, timedelta(hours=settings.optimizer.max_quote_age_hours),
                    horizon_h=settings.fleet.churn_horizon_hours)
    actuator = WriteAheadActuator(job.id, driver, state, clock, iv, coordinator=coordinator,
                                  metrics=metrics, launch_env=launch_env, stopping=stopping,
                                  logs=logs)
    telemetry = Telemetry(state, model, coordinator=coordinator, metrics=metrics, speed=speed)
    return Daemon(settings, driver, source, state, now=now, speed=speed, intervals=iv,
                  market=market, planner=Planner.of(planner_input(settings)), actuator=actuator,
                  telemetry=telemetry, coordinator=coordinator, stopping=stopping)


def shipped_logs(settings: Settings) -> Any:
    """The cloud workers' shipped logs and exit reports in ``[cloud] artifacts``
    (:class:`provisioner.drivers.shiplog.StoreLogs`), or None when it is unset or the run
    is local (its workers' logs are files of the run)."""
    url = settings.cloud.artifacts
    if not url or settings.cloud.driver == "local":
        return None
    from provisioner.drivers.artifacts import open_store
    from provisioner.drivers.shiplog import StoreLogs

    return StoreLogs(open_store(url, settings))


def snapshot_url(settings: Settings, default_dir: Path) -> str | None:
    """Where the ring's snapshots go: ``snapshot.url`` with ``/<job.id>`` appended, else
    ``default_dir`` on the daemon host (a ``file://`` URL); None when snapshots are off
    (``every_s`` and ``every_steps`` both 0)."""
    snap = settings.snapshot
    if not snap.enabled:
        return None
    if snap.url is None:
        return Path(default_dir).resolve().as_uri()
    base = snap.url.rstrip("/")
    if "://" not in base:
        base = Path(base).resolve().as_uri()
    return f"{base}/{settings.job.id}"


def with_recorded_end(ring: Mapping[str, Any] | None, settings: Settings,
                      url: str | None, token: bytes | None) -> dict[str, Any]:
    """The ring's last recorded stats, completed by the end its coordinator recorded beside
    the snapshots at ``url`` (``trainer.state.snapshot.recorded_end``: signed with the token):
    a daemon killed less than a metrics period after the ring finished did not record that
    end itself, and must not take the run for unfinished. Reads only; never creates."""
    out = dict(ring or {})
    if not url or not token or out.get("finished"):
        return out
    if url.startswith("file://") and not Path(url[len("file://"):]).is_dir():
        return out
    try:
        from trainer.protocol.admission import derive_key
        from trainer.state.snapshot import open_store, recorded_end

        end = recorded_end(open_store(_trainer_snapshot(settings.snapshot, url)),
                           derive_key(token, b"snapshot manifest"))
    except Exception as exc:  # noqa: BLE001 - a store unreachable now: the stats decide
        log.warning("the ring's recorded end at %s could not be read: %s", url, exc)
        return out
    if end:
        out.update(end, finished=True)
    return out


def make_coordinator(host: str, port: int, token: bytes, *,
                     snapshot: SnapshotSettings | None = None, snapshot_url: str | None = None,
                     **options: float) -> RingCoordinator:
    """The trainer's coordinator, started (the only place it is constructed), storing the
    ring's snapshots at ``snapshot_url`` every ``snapshot.every_s`` / ``every_steps``.
    Raises UserError naming ``daemon.coordinator_port`` when it cannot listen."""
    from trainer.control.coordinator import Coordinator

    kw: dict[str, Any] = dict(options)
    if snapshot is not None and snapshot_url is not None:
        kw["snapshot"] = _trainer_snapshot(snapshot, snapshot_url)
        _check_store(kw["snapshot"])
    coord = Coordinator(host, port, token, **kw)
    try:
        coord.start()
    except (RuntimeError, OSError) as exc:
        raise UserError(f"daemon.coordinator_port {port}: cannot listen on {host} "
                        f"({str(exc).splitlines()[0][:120]}); pick a free port or 0") from None
    return coord


#: ``every_s`` handed to the trainer for "by steps only" (``[snapshot] every_s = 0``): its
#: settings need a positive period; this one never comes (about three years).
BY_STEPS_ONLY_S = 1e8


def _check_store(ring_snap: Any) -> None:
    """List the snapshot store once, so a missing bucket, credentials or SDK is one line
    naming ``snapshot.url`` before anything starts (the coordinator opens it again)."""
    from trainer.errors import SnapshotError
    from trainer.state.snapshot import open_store

    url = ring_snap.url
    try:
        open_store(ring_snap).names()
    except SnapshotError as exc:
        raise UserError(f"snapshot.url {url}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the SDK's own errors, translated at this edge
        first = (str(exc).splitlines() or [""])[0][:160]
        raise UserError(f"snapshot.url {url}: cannot list it ({type(exc).__name__}: {first}); "
                        f"check the bucket, this host's credentials, or [snapshot] "
                        f"endpoint_url / api_endpoint") from None


def _trainer_snapshot(snap: SnapshotSettings, url: str) -> Any:
    """``trainer.state.snapshot.SnapshotSettings`` of the daemon's ``[snapshot]`` section."""
    from trainer.state.snapshot import SnapshotSettings as RingSnapshots

    return RingSnapshots(url=url, every_s=snap.every_s if snap.every_s > 0 else BY_STEPS_ONLY_S,
                         every_steps=snap.every_steps, keep=snap.keep,
                         endpoint_url=snap.endpoint_url, api_endpoint=snap.api_endpoint,
                         direct=snap.direct)


def cloud_parts(settings: Settings, traces: list[str] | None) -> tuple[CloudDriver, PriceFeed]:
    """The driver and price source of a cloud daemon (``[cloud] driver = "aws"|"gcp"``).
    Raises ConfigError naming the section when either cannot be built."""
    from pricing.errors import CredentialsError as PricingCredentialsError
    from pricing.errors import PricingError
    from pricing.sources import make_source

    driver = cloud_driver(settings)
    endpoint = settings.aws.endpoint_url if settings.cloud.driver == "aws" else None
    src = settings.source
    try:
        source = make_source(src.kind, trace=traces or ([src.trace, *src.traces]
                                                        if src.trace else None),
                             regions=src.regions or None, endpoint_url=endpoint)
    except PricingCredentialsError:
        raise
    except PricingError as exc:
        raise ConfigError(f"[source] kind = {src.kind!r}: {exc}") from None
    return driver, source


def cloud_driver(settings: Settings) -> CloudDriver:
    """The driver of ``[cloud] driver`` (aws or gcp). Raises ConfigError naming the section
    when it cannot be built from it."""
    try:
        return DRIVERS[settings.cloud.driver](settings)
    except DriverError as exc:
        raise ConfigError(f"[{settings.cloud.driver}]: {exc}") from None


def ring_token(settings: Settings) -> bytes | None:
    """The ring's token from ``daemon.token_path`` (None when unset: no coordinator)."""
    path = settings.daemon.token_path
    if not path:
        return None
    try:
        token = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"daemon.token_path = {path!r}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"daemon.token_path = {path!r}: the file is empty")
    return token
