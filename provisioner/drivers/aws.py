"""The AWS driver: spot instances from a launch template, found again by their tags.

Design: a narrow edge to boto3 (Karpenter ``pkg/aws/sdk.go``): the only calls are the ones in
:data:`AWS_DRIVER_ACTIONS`, every client comes from :func:`pricing.sources.boto.make_client`
(botocore's adaptive retry mode rides out throttling, so there is no retry loop here), and
every botocore error is translated into :mod:`provisioner.errors` at the edge
(:func:`_edge`).

- **Launch.** ``create_fleet`` with ``Type="instant"`` (spot, ``price-capacity-optimized``),
  or ``run_instances`` with spot market options (``launch_mode="run-instances"``), always
  from the configured launch template, in the offering's zone (its subnet: configured, or the
  default VPC's subnet for that zone). Every instance is tagged at launch with
  ``spotring:job``, ``spotring:offering`` and ``spotring:token``; ``env`` (the launch values
  of :mod:`provisioner.drivers.boot`, checked there) goes into ``spotring:env:<KEY>`` tags,
  which the worker's boot script reads through IMDSv2.
- **Idempotency.** ``ClientToken`` is the request's token, and before launching the driver
  looks for instances tagged ``spotring:token=<token>`` and returns those instead: moto does
  not honour ``ClientToken``, and the tag check also covers a daemon killed after the call
  returned but before it recorded the result. Tags are applied atomically with the launch
  (``TagSpecifications``), so an instance is never untagged.
- **Capacity.** ``InsufficientInstanceCapacity`` and its kin (a ``ClientError`` from
  ``run_instances`` or an entry of ``create_fleet``'s ``Errors`` with no instance launched)
  raise :class:`~provisioner.errors.CapacityError` naming the offering; the daemon marks the
  offering unavailable (``provisioner.timing.TtlCache``) and fails over.
- **Notices.** EventBridge -> SQS messages parsed by :mod:`provisioner.drivers.aws_notices`
  (one parser per kind; unknown kinds deleted), plus a ``describe_instances`` fallback every
  :data:`provisioner.timing.DESCRIBE_FALLBACK_S`: an instance this driver saw alive that is now gone, and that it
  did not terminate itself, yields a notice. Each (instance, kind) is delivered once.

Rule for callers: pass the same ``LaunchRequest.token`` when retrying a launch, and call
:meth:`AwsDriver.list` at start to adopt what a previous daemon launched.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from pricing.model import Offering
from pricing.sources.boto import CREDENTIALS_HELP, REJECTED_CREDENTIAL_CODES, make_client
from provisioner.drivers.aws_notices import parse_message
from provisioner.drivers.base import (PENDING, PREEMPTED, RUNNING, STOPPING, TERMINATED,
                                      TERMINATED_NOTICE, Instance, LaunchRequest, LaunchResult,
                                      Notice)
from provisioner.drivers.boot import launch_env
from provisioner.errors import CapacityError, CredentialsError, DriverError
from provisioner.timing import DESCRIBE_FALLBACK_S

if TYPE_CHECKING:
    from provisioner.config import AwsSettings

log = logging.getLogger(__name__)

#: An AWS zone *id* (use1-az4), as the price history names zones, not a zone name (us-east-1a).
_ZONE_ID = re.compile(r"^[a-z]{2,5}[0-9]-az[0-9]+$")

#: Every AWS API action the driver calls (the Terraform module grants exactly these, plus
#: ``iam:PassRole`` on the workers' instance role when the launch template names one).
#: ``ec2:CreateTags`` is needed because instances are tagged at launch (TagSpecifications).
AWS_DRIVER_ACTIONS: tuple[str, ...] = (
    "ec2:CreateFleet",
    "ec2:RunInstances",
    "ec2:CreateTags",
    "ec2:DescribeInstances",
    "ec2:DescribeSubnets",
    "ec2:TerminateInstances",
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
)

TAG_JOB = "spotring:job"
TAG_OFFERING = "spotring:offering"
TAG_TOKEN = "spotring:token"
TAG_ENV_PREFIX = "spotring:env:"


#: Error codes that mean "no capacity for this offering now": the daemon fails over.
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientCapacityOnHost", "InsufficientReservedInstanceCapacity",
    "UnfulfillableCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded", "InsufficientFreeAddressesInSubnet",
})
CREDENTIAL_CODES = REJECTED_CREDENTIAL_CODES | {
    "UnauthorizedOperation", "AccessDenied", "AccessDeniedException"}
_STATE_MAP = {"pending": PENDING, "running": RUNNING, "stopping": STOPPING, "stopped": STOPPING,
              "shutting-down": STOPPING, "terminated": TERMINATED}
_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
_ALIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
_MAX_ENV_TAGS = 40  # AWS allows 50 tags per resource; 3 are ours, leave room for the user's


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def _edge(what: str, offering_key: str | None = None,
          passthrough: frozenset[str] = frozenset()) -> Iterator[None]:
    """Translate botocore errors raised inside into provisioner errors.

    A ``ClientError`` whose code is in ``passthrough`` is re-raised as is, for the caller.
    """
    from botocore import exceptions as bce

    try:
        yield
    except (bce.NoCredentialsError, bce.PartialCredentialsError):
        raise CredentialsError(CREDENTIALS_HELP) from None
    except bce.ProfileNotFound as exc:
        raise CredentialsError(f"{exc}: set AWS_PROFILE to a profile of ~/.aws/config (or unset "
                               f"it to use the environment or the instance role)") from None
    except (bce.CredentialRetrievalError, bce.TokenRetrievalError, bce.SSOError,
            bce.SSOTokenLoadError, bce.UnauthorizedSSOTokenError,
            bce.UnknownCredentialError) as exc:
        first = (str(exc).splitlines() or [""])[0][:160]
        raise CredentialsError(f"{what}: the AWS credentials could not be loaded ({first}); "
                               f"renew them (e.g. `aws sso login`) or {CREDENTIALS_HELP}") from None
    except bce.ClientError as exc:
        code = _error_code(exc)
        if code in passthrough:
            raise
        if code in CAPACITY_CODES and offering_key is not None:
            raise CapacityError(offering_key, f"{code}: {exc}") from None
        if code in CREDENTIAL_CODES:
            raise CredentialsError(f"{what}: AWS refused the call ({code}); {CREDENTIALS_HELP} "
                                   f"and grant the actions listed in docs/drivers.md") from None
        raise DriverError(f"{what}: {code or 'error'}: {exc}") from None
    except bce.BotoCoreError as exc:
        raise DriverError(f"{what}: {exc}") from None


def _tags(raw: Sequence[dict[str, str]] | None) -> dict[str, str]:
    """EC2 tags as a dict, plus the driver-neutral ``job`` and ``token`` keys the daemon's
    recovery reads (the same keys every driver reports)."""
    tags = {t["Key"]: t["Value"] for t in raw or ()}
    for neutral, ours in (("job", TAG_JOB), ("token", TAG_TOKEN)):
        if ours in tags:
            tags[neutral] = tags[ours]
    return tags


class AwsDriver:
    """:class:`~provisioner.drivers.base.CloudDriver` for EC2 spot (and on-demand) instances.

    ``ec2``/``sqs`` clients may be passed in (tests); by default they are made with
    :func:`make_client` from ``settings``. ``now`` returns aware UTC datetimes and
    ``monotonic`` seconds; both are injected so notice handling tests deterministically.
    Thread-safe: the daemon calls launch/terminate and notices from different scheduler jobs.
    """

    name = "aws"

    def __init__(self, settings: "AwsSettings", *, ec2: Any = None, sqs: Any = None,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 monotonic: Callable[[], float] = time.monotonic,
                 fallback_interval_s: float = DESCRIBE_FALLBACK_S) -> None:
        if not (settings.launch_template or settings.launch_template_id):
            raise DriverError("aws.launch_template (or aws.launch_template_id) is not set: name "
                              "the launch template of the workers in the [aws] section")
        self.settings = settings
        self.region = settings.region
        with _edge("creating the EC2 and SQS clients"):
            self._ec2 = ec2 or make_client("ec2", settings.region,
                                           endpoint_url=settings.endpoint_url)
            self._sqs = sqs
            if self._sqs is None and settings.queue_url:
                self._sqs = make_client("sqs", settings.region,
                                        endpoint_url=settings.endpoint_url)
        self._now = now
        self._monotonic = monotonic
        self._fallback_interval_s = fallback_interval_s
        self._last_fallback: float | None = None
        self._lock = threading.Lock()
        self._watch: set[str] = set()  # instances seen alive, not terminated by us
        self._terminated_by_us: set[str] = set()
        self._delivered: set[tuple[str, str]] = set()
        # notices taken off the queue (and deleted there) but not yet returned: a call that
        # fails later in the same poll must not lose them
        self._backlog: list[Notice] = []
        self._subnet_cache: dict[str, str | None] = {}

    # -- launch --------------------------------------------------------------------------------

    def can_place(self, offering: Offering) -> bool:
        """Offerings of this region; with ``subnets`` configured (e.g. by terraform/aws), only
        in their zones, so every worker lands in the deployment's network."""
        if offering.cloud != "aws" or offering.region != self.region:
            return False
        return not self.settings.subnets or offering.zone in self.settings.subnets

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Launch ``request.count`` instances of ``request.offering`` (see the module docstring).

        Returns the instances of an earlier launch with the same token instead of launching
        again. Raises CapacityError when nothing could be launched for lack of capacity,
        CredentialsError, or DriverError (wrong cloud/region, other API failures).
        """
        off = request.offering
        if off.cloud != "aws" or off.region != self.region:
            raise DriverError(f"aws driver for region {self.region} cannot launch {off.key}")
        if request.count < 1:
            raise DriverError(f"launch of {off.key}: count={request.count} must be >= 1")
        existing = self._by_token(request.token)
        if existing:
            log.info("aws launch token=%s already launched %d instance(s); not launching again",
                     request.token, len(existing))
            self._remember(i.id for i in existing if i.state != TERMINATED)
            return LaunchResult(tuple(existing))
        tags = self._launch_tags(request)
        if self.settings.launch_mode == "fleet":
            ids, errors = self._create_fleet(request, tags)
        else:
            ids, errors = self._run_instances(request, tags)
        self._remember(ids)
        launched_at = self._now()
        neutral = {**tags, "job": request.job_id, "token": request.token}
        instances = tuple(Instance(i, off, PENDING, launched_at, neutral) for i in ids)
        log.info("aws launch %s x%d token=%s -> %s", off.key, request.count, request.token,
                 ",".join(ids) or "nothing")
        return LaunchResult(instances, tuple(errors))

    def _launch_tags(self, request: LaunchRequest) -> dict[str, str]:
        env = launch_env(request.offering, request.env)
        if len(env) > _MAX_ENV_TAGS:
            raise DriverError(f"launch env has {len(env)} entries; at most {_MAX_ENV_TAGS} "
                              f"fit in instance tags")
        tags = {TAG_JOB: request.job_id, TAG_OFFERING: request.offering.key,
                TAG_TOKEN: request.token}
        tags.update({f"{TAG_ENV_PREFIX}{k}": v for k, v in env.items()})
        return tags

    def _template_spec(self) -> dict[str, str]:
        spec = {"Version": self.settings.launch_template_version}
        if self.settings.launch_template_id:
            spec["LaunchTemplateId"] = self.settings.launch_template_id
        else:
            spec["LaunchTemplateName"] = str(self.settings.launch_template)
        return spec

    def _subnet(self, zone: str) -> str | None:
        """The subnet for ``zone``: configured, else the default VPC's; None if neither."""
        if zone in self.settings.subnets:
            return self.settings.subnets[zone]
        if zone not in self._subnet_cache:
            with _edge(f"DescribeSubnets {zone}"):
                by = "availability-zone-id" if _ZONE_ID.match(zone) else "availability-zone"
                found = self._ec2.describe_subnets(Filters=[
                    {"Name": by, "Values": [zone]},
                    {"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
            self._subnet_cache[zone] = found[0]["SubnetId"] if found else None
        return self._subnet_cache[zone]

    def _placement_override(self, zone: str) -> dict[str, str]:
        if zone == "*":
            return {}
        subnet = self._subnet(zone)
        if subnet:
            return {"SubnetId": subnet}
        if _ZONE_ID.match(zone):  # Placement takes a zone name, never an id (use1-az4)
            raise DriverError(f"no subnet for zone id {zone}: add it to [aws] subnets "
                              "(zone id -> subnet id)")
        return {"AvailabilityZone": zone}

    def _create_fleet(self, request: LaunchRequest,
                      tags: dict[str, str]) -> tuple[list[str], list[str]]:
        off = request.offering
        override = {"InstanceType": off.instance_type, **self._placement_override(off.zone)}
        kwargs: dict[str, Any] = dict(
            Type="instant",
            ClientToken=request.token[:64],
            LaunchTemplateConfigs=[{"LaunchTemplateSpecification": self._template_spec(),
                                    "Overrides": [override]}],
            TargetCapacitySpecification={
                "TotalTargetCapacity": request.count,
                "DefaultTargetCapacityType": "spot" if off.market == "spot" else "on-demand"},
            TagSpecifications=[{"ResourceType": "instance",
                                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )
        if off.market == "spot":
            kwargs["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized"}
        with _edge(f"CreateFleet {off.key}", off.key):
            response = self._ec2.create_fleet(**kwargs)
        ids = [i for group in response.get("Instances", []) for i in group.get("InstanceIds", [])]
        errors = [f"{e.get('ErrorCode')}: {e.get('ErrorMessage', '')}"
                  for e in response.get("Errors", [])]
        if not ids and response.get("Errors"):
            codes = {e.get("ErrorCode") for e in response["Errors"]}
            if codes & CAPACITY_CODES:
                raise CapacityError(off.key, "; ".join(errors))
            raise DriverError(f"CreateFleet {off.key} launched nothing: {'; '.join(errors)}")
        return ids, errors

    def _run_instances(self, request: LaunchRequest,
                       tags: dict[str, str]) -> tuple[list[str], list[str]]:
        off = request.offering
        kwargs: dict[str, Any] = dict(
            MinCount=request.count, MaxCount=request.count,  # all or nothing (fleet: partial)
            ClientToken=request.token[:64],
            LaunchTemplate=self._template_spec(),
            InstanceType=off.instance_type,
            TagSpecifications=[{"ResourceType": "instance",
                                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )
        placement = self._placement_override(off.zone)
        if "SubnetId" in placement:
            kwargs["SubnetId"] = placement["SubnetId"]
        elif placement:
            kwargs["Placement"] = {"AvailabilityZone": placement["AvailabilityZone"]}
        if off.market == "spot":
            kwargs["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time",
                                "InstanceInterruptionBehavior": "terminate"}}
        with _edge(f"RunInstances {off.key}", off.key):
            response = self._ec2.run_instances(**kwargs)
        ids = [i["InstanceId"] for i in response.get("Instances", [])]
        errors = [] if len(ids) == request.count else [
            f"asked for {request.count}, launched {len(ids)}"]
        return ids, errors

    # -- list and terminate ---------------------------------------------------------------------

    def _describe(self, filters: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        with _edge(what):
            for page in self._ec2.get_paginator("describe_instances").paginate(Filters=filters):
                for reservation in page.get("Reservations", []):
                    found.extend(reservation.get("Instances", []))
        return found

    def _instance(self, raw: dict[str, Any]) -> Instance:
        tags = _tags(raw.get("Tags"))
        zone = raw.get("Placement", {}).get("AvailabilityZone") or "*"
        market = "spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand"
        try:
            offering = Offering("aws", self.region, zone, raw["InstanceType"], market)
        except ValueError:
            offering = Offering.from_key(tags[TAG_OFFERING])
        launched = raw.get("LaunchTime")
        if isinstance(launched, datetime):
            launched = launched.astimezone(timezone.utc)
        return Instance(raw["InstanceId"], offering,
                        _STATE_MAP.get(raw.get("State", {}).get("Name", ""), PENDING),
                        launched, tags)

    def _by_token(self, token: str) -> list[Instance]:
        raws = self._describe([{"Name": f"tag:{TAG_TOKEN}", "Values": [token]}],
                              f"DescribeInstances token={token}")
        return [self._instance(r) for r in raws]

    def list(self, job_id: str) -> list[Instance]:
        """Every instance tagged ``spotring:job=<job_id>`` that is not terminated."""
        raws = self._describe([{"Name": f"tag:{TAG_JOB}", "Values": [job_id]},
                               {"Name": "instance-state-name", "Values": list(_ALIVE_STATES)}],
                              f"DescribeInstances job={job_id}")
        instances = [self._instance(r) for r in raws]
        self._remember(i.id for i in instances if i.state in (PENDING, RUNNING))
        return instances

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate instances; unknown or already terminated ids are not an error."""
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return
        with self._lock:
            self._terminated_by_us.update(ids)
            self._watch.difference_update(ids)
        from botocore.exceptions import ClientError

        for start in range(0, len(ids), 1000):
            chunk = ids[start:start + 1000]
            try:
                with _edge(f"TerminateInstances {','.join(chunk)}", passthrough=_NOT_FOUND):
                    self._ec2.terminate_instances(InstanceIds=chunk)
            except ClientError:  # one id unknown fails the whole call: go one by one
                self._terminate_one_by_one(chunk)
        log.info("aws terminate %s", ",".join(ids))

    def _terminate_one_by_one(self, ids: Sequence[str]) -> None:
        from botocore.exceptions import ClientError

        for iid in ids:
            try:
                with _edge(f"TerminateInstances {iid}", passthrough=_NOT_FOUND):
                    self._ec2.terminate_instances(InstanceIds=[iid])
            except ClientError:
                log.info("aws terminate %s: not found (already gone)", iid)

    # -- notices --------------------------------------------------------------------------------

    def notices(self) -> list[Notice]:
        """Notices since the last call: the SQS queue first, then the describe fallback.

        Each (instance, kind) is returned once. Notices about instances this driver terminated
        itself are dropped. Raises CredentialsError or DriverError when a call fails.
        """
        if self._sqs is not None and self.settings.queue_url:
            self._drain_queue()
        now = self._monotonic()
        if self._last_fallback is None or now - self._last_fallback >= self._fallback_interval_s:
            self._last_fallback = now
            self._backlog.extend(self._describe_fallback())
        found, self._backlog = self._backlog, []
        out = []
        with self._lock:
            for notice in found:
                key = (notice.instance_id, notice.kind)
                if key in self._delivered or notice.instance_id in self._terminated_by_us:
                    continue
                self._delivered.add(key)
                if notice.kind in (PREEMPTED, TERMINATED_NOTICE):
                    self._watch.discard(notice.instance_id)
                out.append(notice)
        return out

    def _drain_queue(self, max_batches: int = 10) -> None:
        """Move the queue's notices into :attr:`_backlog` (deleted from the queue only once
        kept there: a receive or delete that fails later loses none; a message whose delete
        failed comes back and is dropped as already delivered)."""
        queue_url = self.settings.queue_url
        for _ in range(max_batches):
            with _edge(f"ReceiveMessage {queue_url}"):
                messages = self._sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                                     WaitTimeSeconds=0).get("Messages", [])
            if not messages:
                break
            for message in messages:
                notice = parse_message(message.get("Body", ""))
                if notice is not None:
                    self._backlog.append(notice)
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                       for n, m in enumerate(messages)]
            with _edge(f"DeleteMessageBatch {queue_url}"):
                self._sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)

    def _describe_fallback(self) -> list[Notice]:
        with self._lock:
            watched = sorted(self._watch)
        if not watched:
            return []
        now = self._now()
        seen: set[str] = set()
        notices = []
        for start in range(0, len(watched), 195):  # a filter takes at most 200 values
            chunk = watched[start:start + 195]
            for raw in self._describe([{"Name": "instance-id", "Values": chunk}],
                                      "DescribeInstances fallback"):
                seen.add(raw["InstanceId"])
                state = raw.get("State", {}).get("Name", "")
                if state in ("pending", "running"):
                    continue
                reason = raw.get("StateReason", {}).get("Code", "")
                spot = raw.get("InstanceLifecycle") == "spot"
                kind = PREEMPTED if spot and reason.startswith("Server.") else TERMINATED_NOTICE
                notices.append(Notice(raw["InstanceId"], kind, now, source="aws-describe"))
        notices.extend(Notice(i, TERMINATED_NOTICE, now, source="aws-describe")
                       for i in watched if i not in seen)
        return notices

    def _remember(self, ids: Any) -> None:
        with self._lock:
            self._watch.update(i for i in ids if i not in self._terminated_by_us)


def from_settings(settings: "AwsSettings") -> AwsDriver:
    """The driver the daemon uses for ``[cloud] driver = "aws"``."""
    return AwsDriver(settings)
