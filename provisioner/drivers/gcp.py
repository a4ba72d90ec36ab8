"""The GCP driver: SPOT VMs with GPUs through google-cloud-compute, found again by labels.

Design: a narrow, lazily imported edge to ``google.cloud.compute_v1`` (SkyPilot imports cloud
SDKs lazily): ``InstancesClient.insert/delete/aggregated_list`` and
``ZoneOperationsClient.list``, nothing else. Errors are translated into
:mod:`provisioner.errors` at the edge (:func:`_edge`); retries of 429/503 are google-api-core's
:class:`~google.api_core.retry.Retry` (:data:`RETRY`), not a loop of our own.

- **Instance types.** An offering's type is either a machine type with GPUs bundled
  (``a2-highgpu-1g``, ``g2-standard-8``) or ``<machine>+<gpu>[x<count>]``
  (``n1-standard-8+nvidia-tesla-v100x2``, the spelling of :mod:`pricing.catalog`), which becomes
  ``guest_accelerators``. Every VM is ``provisioning_model="SPOT"`` (for a spot offering),
  ``instance_termination_action="DELETE"``, ``on_host_maintenance="TERMINATE"`` (required with
  GPUs) and ``automatic_restart=False``.
- **Identity.** Labels ``spotring-job`` and ``spotring-token`` carry the job and the launch;
  the offering key and the worker env go into metadata (label values cannot hold ``/``).
  :attr:`Instance.id` is ``"<zone>/<name>"`` so :meth:`GcpDriver.terminate` needs no lookup.
- **Idempotency.** Names are derived from the launch token (``sr-<hash>-<i>``) and each insert
  carries a ``request_id`` derived from it, so a retried launch finds the same VMs (409 on an
  existing name is success) instead of doubling.
- **Capacity.** An insert whose operation ends in ``ZONE_RESOURCE_POOL_EXHAUSTED`` (stockout) or
  a ``QUOTA_EXCEEDED`` answer raises :class:`~provisioner.errors.CapacityError`.
- **Never an untracked VM.** Once one VM of a launch is in, a later failure (capacity or any
  other) returns what was launched with the error in ``LaunchResult.errors``; an insert whose
  operation is still running after :data:`OPERATION_TIMEOUT_S` counts as launched (pending):
  GCE accepted it, and if it fails after all the list fallback reports the VM gone.
- **Notices.** SPOT VMs get a preemption notice of ``[gcp] preemption_notice_s`` (up to 120 s,
  ``scheduling.preemptionNoticeDuration``): ``instance/preempted`` reads TRUE on the VM, whose
  worker drains at its step boundary. The driver reads zone operations filtered by
  ``operationType="compute.instances.preempted"`` in every zone the job uses, each once,
  parsed by :mod:`provisioner.drivers.gcp_notices` (a VM still alive: an interruption with a
  deadline; gone: preempted); plus a list fallback every
  :data:`provisioner.timing.LIST_FALLBACK_S` for VMs that vanished otherwise.
- **Launch values.** The run's job, mode, hybrid group, GPUs and wheel go into
  ``spotring-env-<KEY>`` metadata (:mod:`provisioner.drivers.boot`, checked there), which the
  worker's startup script reads from the metadata server.

Rule for callers: ``settings.project`` must be set; call :meth:`GcpDriver.list` at start to
adopt the VMs a previous daemon launched (it also tells the driver which zones to watch).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import re
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from pricing.model import Offering
from provisioner.drivers.base import (PENDING, PREEMPTED, RUNNING, STOPPING, TERMINATED,
                                      TERMINATED_NOTICE, Instance, LaunchRequest, LaunchResult,
                                      Notice)
from provisioner.drivers.boot import launch_env
from provisioner.drivers.gcp_notices import PREEMPTED_TYPE, Operation, parse_operation
from provisioner.errors import CapacityError, CredentialsError, DriverError
from provisioner.timing import LIST_FALLBACK_S

if TYPE_CHECKING:
    from provisioner.config import GcpSettings

log = logging.getLogger(__name__)

LABEL_JOB = "spotring-job"
LABEL_TOKEN = "spotring-token"
META_OFFERING = "spotring-offering"
META_TOKEN = "spotring-token"  # the raw token (a label value is lowercased and cut to 63)
META_ENV_PREFIX = "spotring-env-"
PREEMPTED_FILTER = f'operationType="{PREEMPTED_TYPE}"'

#: How to give the driver credentials (Application Default Credentials).
CREDENTIALS_FIX = ("run `gcloud auth application-default login`, or set "
                   "GOOGLE_APPLICATION_CREDENTIALS to a valid service account key, or run on a "
                   "VM with a service account")

#: Seconds to wait for an insert operation: GCE answers stockouts within a few seconds.
OPERATION_TIMEOUT_S = 120.0

#: Operation or API error codes that mean "no capacity for this offering now".
CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "QUOTA_EXCEEDED", "quotaExceeded", "resourcePoolExhausted",
})
#: Short GPU names (as in pricing.catalog) -> GCE accelerator type names.
ACCELERATORS = {
    "k80": "nvidia-tesla-k80", "p4": "nvidia-tesla-p4", "p100": "nvidia-tesla-p100",
    "v100": "nvidia-tesla-v100", "t4": "nvidia-tesla-t4", "a100": "nvidia-tesla-a100",
    "l4": "nvidia-l4",
}
_STATE_MAP = {"PROVISIONING": PENDING, "STAGING": PENDING, "RUNNING": RUNNING,
              "STOPPING": STOPPING, "SUSPENDING": STOPPING, "REPAIRING": STOPPING,
              "STOPPED": TERMINATED, "SUSPENDED": TERMINATED, "TERMINATED": TERMINATED}


def _retry() -> Any:
    """429 and 503 retried with exponential backoff for up to 60 s (google-api-core Retry)."""
    from google.api_core import exceptions, retry

    return retry.Retry(initial=0.2, maximum=10.0, multiplier=2.0, timeout=60.0,
                       predicate=retry.if_exception_type(exceptions.TooManyRequests,
                                                         exceptions.ServiceUnavailable,
                                                         exceptions.DeadlineExceeded))


def _codes(exc: Exception) -> set[str]:
    codes = set()
    for err in getattr(exc, "errors", None) or ():
        for attr in ("code", "reason"):
            value = getattr(err, attr, None) or (err.get(attr) if isinstance(err, dict) else None)
            if value:
                codes.add(str(value))
    return codes


@contextlib.contextmanager
def _edge(what: str, offering_key: str | None = None) -> Iterator[None]:
    """Translate google-api-core and google-auth errors raised inside into provisioner errors."""
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions

    try:
        yield
    except auth_exceptions.DefaultCredentialsError:
        raise CredentialsError(f"no GCP credentials found: {CREDENTIALS_FIX}") from None
    except (auth_exceptions.RefreshError, auth_exceptions.TransportError) as exc:
        # the credentials were found but Google refused to (or could not) renew their access
        # token: a revoked or deleted key, an expired user login, no metadata server
        first = (str(exc).splitlines() or [""])[0][:160]
        raise CredentialsError(f"{what}: the GCP credentials could not be refreshed ({first}); "
                               f"{CREDENTIALS_FIX}") from None
    except exceptions.GoogleAPICallError as exc:
        codes = _codes(exc)
        if offering_key is not None and codes & CAPACITY_CODES:
            raise CapacityError(offering_key, f"{','.join(sorted(codes))}: {exc.message}") from None
        if isinstance(exc, (exceptions.Unauthenticated, exceptions.PermissionDenied)):
            raise CredentialsError(f"{what}: GCP refused the call ({exc.code}): {exc.message}; "
                                   f"grant the roles listed in docs/drivers.md") from None
        raise DriverError(f"{what}: {exc.code} {exc.message}") from None
    except exceptions.RetryError as exc:
        raise DriverError(f"{what}: gave up after retries: {exc.cause or exc}") from None
    except concurrent.futures.TimeoutError as exc:  # an operation's result(timeout=...)
        raise DriverError(f"{what}: {exc}") from None
    except OSError as exc:  # requests' ConnectionError/Timeout: the API never answered
        raise DriverError(f"{what}: cannot reach the Compute API ({type(exc).__name__}: "
                          f"{exc}); check the network and [gcp] api_endpoint") from None


def split_instance_type(instance_type: str) -> tuple[str, str | None, int]:
    """``"n1-standard-8+v100x2"`` -> ``("n1-standard-8", "nvidia-tesla-v100", 2)``;
    a bundled type (``"a2-highgpu-1g"``) -> ``(type, None, 0)``. Raises DriverError."""
    machine, plus, accel = instance_type.partition("+")
    if not re.fullmatch(r"[a-z][a-z0-9-]*", machine):
        raise DriverError(f"GCP instance type {instance_type!r}: machine type {machine!r} is not "
                          f"a GCE machine type name (e.g. n1-standard-8)")
    if not plus:
        return machine, None, 0
    m = re.fullmatch(r"([a-z0-9-]+?)(?:x(\d+))?", accel.lower())
    if not m:
        raise DriverError(f"GCP instance type {instance_type!r}: write GPUs as "
                          f"<machine>+<gpu>[x<count>], e.g. n1-standard-8+nvidia-tesla-t4x1")
    name = ACCELERATORS.get(m.group(1), m.group(1))
    return machine, name, int(m.group(2) or 1)


def instance_prefix(job_id: str) -> str:
    """The name prefix of every VM of job ``job_id``: ``sr-<8 hex of its hash>-``. Fixed width,
    so no job's prefix is a prefix of another's (job ``a``'s would cover ``a-b``'s); the
    daemon's IAM condition (terraform/gcp) lets it touch only VMs named so."""
    return f"sr-{hashlib.sha256(job_id.encode()).hexdigest()[:8]}-"


def instance_name(job_id: str, token: str, index: int) -> str:
    """A GCE name that is the same for the same (job, token, index):
    ``sr-<job 8 hex>-<launch 10 hex>-<index>``."""
    return f"{instance_prefix(job_id)}{hashlib.sha256(token.encode()).hexdigest()[:10]}-{index}"


def _label_value(value: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


class GcpDriver:
    """:class:`~provisioner.drivers.base.CloudDriver` for Compute Engine SPOT VMs.

    ``credentials`` and ``client_options`` go to the google clients (tests: the local fake
    with ``AnonymousCredentials``); ``now``/``monotonic`` are injected clocks. Thread-safe.
    """

    name = "gcp"

    def __init__(self, settings: "GcpSettings", *, credentials: Any = None,
                 client_options: Any = None,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 monotonic: Callable[[], float] = time.monotonic,
                 fallback_interval_s: float = LIST_FALLBACK_S) -> None:
        if not settings.project:
            raise DriverError("gcp.project is not set: name the GCP project in the [gcp] section")
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        self.settings = settings
        self.project = settings.project
        if client_options is None and settings.api_endpoint:
            client_options = ClientOptions(api_endpoint=settings.api_endpoint)
        kwargs: dict[str, Any] = {"transport": "rest", "client_options": client_options}
        if credentials is not None:
            kwargs["credentials"] = credentials
        with _edge("creating the Compute Engine client"):
            self._instances = compute_v1.InstancesClient(**kwargs)
            self._operations = compute_v1.ZoneOperationsClient(**kwargs)
        # The operation an insert returns is polled through a ZoneOperationsClient the SDK
        # builds itself, with the default endpoint and not our client_options (so with
        # `api_endpoint` set, waiting on an insert still running went to compute.googleapis.com);
        # hand it ours, through the cache the generated transport reads first.
        services = getattr(self._instances.transport, "_extended_operations_services", None)
        if isinstance(services, dict):
            services["zone_operations"] = self._operations
        self._compute = compute_v1
        self._now = now
        self._monotonic = monotonic
        self._fallback_interval_s = fallback_interval_s
        self._last_fallback: float | None = None
        self._lock = threading.Lock()
        self._zones: set[str] = set(settings.zones)
        self._jobs: set[str] = set()
        self._watch: set[str] = set()
        self._terminated_by_us: set[str] = set()
        self._seen_ops: set[str] = set()
        self._delivered: set[tuple[str, str]] = set()

    # -- launch --------------------------------------------------------------------------------

    def _resource(self, request: LaunchRequest, name: str) -> Any:
        c = self._compute
        off = request.offering
        zone = off.zone
        machine, accel, count = split_instance_type(off.instance_type)
        spot = off.market == "spot"
        scheduling = c.Scheduling(
            provisioning_model="SPOT" if spot else "STANDARD",
            on_host_maintenance="TERMINATE", automatic_restart=False)
        if spot:
            scheduling.instance_termination_action = "DELETE"
            if self.settings.preemption_notice_s > 0:  # instance/preempted reads TRUE this
                # long before the soft-off: the worker drains at a step boundary meanwhile
                scheduling.preemption_notice_duration = c.Duration(
                    seconds=self.settings.preemption_notice_s)
        items = [c.Items(key=META_OFFERING, value=off.key),
                 c.Items(key=META_TOKEN, value=request.token)]
        items += [c.Items(key=f"{META_ENV_PREFIX}{k}", value=v)
                  for k, v in launch_env(off, request.env).items()]
        if self.settings.startup_script:
            items.append(c.Items(key="startup-script", value=self.settings.startup_script))
        resource = c.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{machine}",
            labels={LABEL_JOB: _label_value(request.job_id),
                     LABEL_TOKEN: _label_value(request.token)},
            scheduling=scheduling,
            metadata=c.Metadata(items=items),
            disks=[c.AttachedDisk(
                boot=True, auto_delete=True,
                initialize_params=c.AttachedDiskInitializeParams(
                    source_image=self.settings.source_image,
                    disk_size_gb=self.settings.boot_disk_gb))],
            network_interfaces=[c.NetworkInterface(network=self.settings.network,
                                                   subnetwork=self.settings.subnetwork)],
        )
        if accel is not None:
            resource.guest_accelerators = [c.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{accel}", accelerator_count=count)]
        if self.settings.service_account:
            resource.service_accounts = [c.ServiceAccount(
                email=self.settings.service_account,
                scopes=["https://www.googleapis.com/auth/cloud-platform"])]
        return resource

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Insert ``request.count`` SPOT VMs named from the token; existing names count as
        launched. Raises CapacityError (stockout, quota) when none could be inserted,
        CredentialsError, or DriverError."""
        off = request.offering
        if off.cloud != "gcp" or off.zone == "*":
            raise DriverError(f"gcp driver cannot launch {off.key}: needs a gcp offering with a "
                              f"zone")
        if request.count < 1:
            raise DriverError(f"launch of {off.key}: count={request.count} must be >= 1")
        from google.api_core import exceptions

        launched: list[Instance] = []
        errors: list[str] = []
        with self._lock:
            self._zones.add(off.zone)
            self._jobs.add(request.job_id)
        for index in range(request.count):
            name = instance_name(request.job_id, request.token, index)
            request_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"spotring:{request.token}:{index}"))
            insert = self._compute.InsertInstanceRequest(
                project=self.project, zone=off.zone, request_id=request_id,
                instance_resource=self._resource(request, name))
            try:
                with _edge(f"insert {off.zone}/{name}", off.key):
                    try:
                        operation = self._instances.insert(request=insert, retry=_retry())
                        operation.result(timeout=OPERATION_TIMEOUT_S)
                    except exceptions.Conflict:
                        log.info("gcp launch %s/%s exists already (retried launch)", off.zone, name)
                    except concurrent.futures.TimeoutError:
                        log.warning("gcp launch %s/%s: insert still running after %.0f s; "
                                    "counted as launched", off.zone, name, OPERATION_TIMEOUT_S)
            except DriverError as exc:  # CapacityError included
                if not launched:
                    raise
                errors.append(str(exc))
                break
            launched.append(Instance(f"{off.zone}/{name}", off, PENDING, self._now(),
                                     {"job": request.job_id, "token": request.token}))
        with self._lock:
            self._watch.update(i.id for i in launched if i.id not in self._terminated_by_us)
        log.info("gcp launch %s x%d token=%s -> %s", off.key, request.count, request.token,
                 ",".join(i.id for i in launched))
        return LaunchResult(tuple(launched), tuple(errors))

    # -- list and terminate ---------------------------------------------------------------------

    def _list_raw(self, job_id: str) -> list[tuple[str, Any]]:
        request = self._compute.AggregatedListInstancesRequest(
            project=self.project, filter=f'labels.{LABEL_JOB} = "{_label_value(job_id)}"')
        found = []
        with _edge(f"aggregated list job={job_id}"):
            for scope, scoped in self._instances.aggregated_list(request=request, retry=_retry()):
                zone = scope.rsplit("/", 1)[-1]
                found.extend((zone, inst) for inst in scoped.instances)
        return found

    def _instance(self, zone: str, raw: Any) -> Instance:
        meta = {item.key: item.value for item in raw.metadata.items}
        try:
            offering = Offering.from_key(meta[META_OFFERING])
        except (KeyError, ValueError):
            machine = raw.machine_type.rsplit("/", 1)[-1]
            spot = raw.scheduling.provisioning_model == "SPOT"
            offering = Offering("gcp", zone.rsplit("-", 1)[0], zone, machine,
                                "spot" if spot else "on-demand")
        created = None
        if raw.creation_timestamp:
            with contextlib.suppress(ValueError):
                created = datetime.fromisoformat(raw.creation_timestamp).astimezone(timezone.utc)
        tags = dict(raw.labels)
        tags["job"] = tags.get(LABEL_JOB, "")
        if META_TOKEN in meta:
            tags["token"] = meta[META_TOKEN]
        return Instance(f"{zone}/{raw.name}", offering, _STATE_MAP.get(raw.status, PENDING),
                        created, tags)

    def list(self, job_id: str) -> list[Instance]:
        """Every VM labelled ``spotring-job=<job_id>`` that is not terminated or stopped."""
        instances = [self._instance(z, r) for z, r in self._list_raw(job_id)]
        instances = [i for i in instances if i.state != TERMINATED]
        with self._lock:
            self._jobs.add(job_id)
            self._zones.update(i.id.split("/", 1)[0] for i in instances)
            self._watch.update(i.id for i in instances if i.id not in self._terminated_by_us)
        return instances

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Delete VMs by ``"<zone>/<name>"`` id; unknown or already deleted ids are fine."""
        from google.api_core import exceptions

        ids = list(dict.fromkeys(instance_ids))
        with self._lock:
            self._terminated_by_us.update(ids)
            self._watch.difference_update(ids)
        for iid in ids:
            zone, slash, name = iid.partition("/")
            if not slash:
                raise DriverError(f"gcp instance id {iid!r}: expected <zone>/<name>")
            try:
                with _edge(f"delete {iid}"):
                    try:
                        self._instances.delete(project=self.project, zone=zone, instance=name,
                                               retry=_retry())
                    except exceptions.NotFound:
                        log.info("gcp terminate %s: not found (already gone)", iid)
            except DriverError:
                with self._lock:
                    self._terminated_by_us.discard(iid)
                raise
        log.info("gcp terminate %s", ",".join(ids))

    def can_place(self, offering: Offering) -> bool:
        """GCP offerings (any zone of the project)."""
        return offering.cloud == "gcp"

    # -- notices --------------------------------------------------------------------------------

    def notices(self) -> list[Notice]:
        """Preemptions since the last call (zone operations), then the list fallback.

        Each (instance, kind) is returned once; VMs this driver deleted are not reported.
        """
        with self._lock:
            zones = sorted(self._zones)
        found: list[Notice] = []
        for zone in zones:
            request = self._compute.ListZoneOperationsRequest(
                project=self.project, zone=zone, filter=PREEMPTED_FILTER)
            with _edge(f"list operations {zone}"):
                ops = list(self._operations.list(request=request, retry=_retry()))
            for op in ops:
                if op.id in self._seen_ops:
                    continue
                self._seen_ops.add(op.id)
                name = op.target_link.rsplit("/", 1)[-1]
                target = f"{zone}/{name}"
                notice = parse_operation(
                    Operation(str(op.id), op.operation_type, target, op.insert_time,
                              alive=op.operation_type == PREEMPTED_TYPE and self._exists(target)),
                    float(self.settings.preemption_notice_s), self._now())
                if notice is not None:
                    found.append(notice)
        now = self._monotonic()
        if self._last_fallback is None or now - self._last_fallback >= self._fallback_interval_s:
            self._last_fallback = now
            found.extend(self._list_fallback())
        out = []
        with self._lock:
            for notice in found:
                key = (notice.instance_id, notice.kind)
                gone = (notice.instance_id, PREEMPTED) in self._delivered or \
                    (notice.instance_id, TERMINATED_NOTICE) in self._delivered
                if key in self._delivered or gone or notice.instance_id in self._terminated_by_us:
                    continue
                self._delivered.add(key)
                self._watch.discard(notice.instance_id)
                out.append(notice)
        return out

    def _exists(self, instance_id: str) -> bool:
        """Does the VM still exist (not deleted, not stopped)? One ``instances.get``."""
        from google.api_core import exceptions

        zone, _, name = instance_id.partition("/")
        try:
            with _edge(f"get {instance_id}"):
                try:
                    raw = self._instances.get(project=self.project, zone=zone, instance=name,
                                              retry=_retry())
                except exceptions.NotFound:
                    return False
        except DriverError:
            return False  # unknown: treat it as gone (a preemption, nothing left to drain)
        return _STATE_MAP.get(raw.status, PENDING) != TERMINATED

    def _list_fallback(self) -> list[Notice]:
        with self._lock:
            jobs, watched = sorted(self._jobs), set(self._watch)
        if not watched:
            return []
        alive = set()
        for job in jobs:
            alive.update(f"{z}/{r.name}" for z, r in self._list_raw(job)
                         if _STATE_MAP.get(r.status, PENDING) != TERMINATED)
        now = self._now()
        return [Notice(i, TERMINATED_NOTICE, now, source="gcp-list")
                for i in sorted(watched - alive)]


def from_settings(settings: "GcpSettings") -> GcpDriver:
    """The driver the daemon uses for ``[cloud] driver = "gcp"``."""
    return GcpDriver(settings)
