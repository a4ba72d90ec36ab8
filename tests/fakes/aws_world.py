"""An AWS account on a moto server, and the SIGKILL harness, for the AWS end-to-end tests
and ``benchmarks/daemon_crash.py``.

Design: :class:`AwsWorld` starts moto's ``ThreadedMotoServer`` on an ephemeral port and sets
up what the Terraform module would: a worker launch template, an SQS notice queue and an
EventBridge rule sending the EC2 interruption, rebalance and state-change events to it. The
daemon talks to it over HTTP exactly as to AWS (``[aws] endpoint_url``). A generated market
(:mod:`pricing.sources.synthetic`'s price walk) prices two GPU types in three us-east-1 zones.

:func:`crash_trial` forks a daemon process, lets it run to a kill point (a driver wrapper
pauses *before* or *after* the k-th launch or terminate call and tells the parent; or the
parent kills after a random delay), SIGKILLs it, starts a new daemon on the same state file,
recovers, and counts orphans (instances alive in moto that the state does not hold) and
duplicates (instances beyond what an intent asked for, or beyond the fleet's size).

Rule for callers: one :class:`AwsWorld` per test module (a moto server costs ~1 s), never
two at once: moto's backends are global to the process and a new world resets them. Give each
daemon its own job id so tests sharing a world do not see each other's instances.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import functools
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

REGION = "us-east-1"
TEMPLATE = "spotring-worker"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
TYPES = (("g4dn.xlarge", 0.158, 0.526), ("p3.2xlarge", 0.918, 3.06))  # spot base, on-demand
EVENT_KINDS = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation",
               "EC2 Instance State-change Notification"]
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
KILL_POINTS = ("launch:before", "launch:after", "terminate:before", "terminate:after", "random")


def _credentials() -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        os.environ[key] = value


class AwsWorld:
    """A moto server with a launch template, a notice queue and its EventBridge rule."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        _credentials()
        import logging

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        reset_moto(self.endpoint)
        from pricing.sources.boto import make_client

        self.ec2 = make_client("ec2", REGION, endpoint_url=self.endpoint)
        self.sqs = make_client("sqs", REGION, endpoint_url=self.endpoint)
        self.events = make_client("events", REGION, endpoint_url=self.endpoint)
        self.ec2.create_launch_template(LaunchTemplateName=TEMPLATE, LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "t3.micro"})
        self.queue_url = self.sqs.create_queue(QueueName="spotring-notices")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.events.put_rule(Name="spotring-ec2", EventPattern=json.dumps(
            {"source": ["aws.ec2"], "detail-type": EVENT_KINDS}))
        self.events.put_targets(Rule="spotring-ec2", Targets=[{"Id": "queue", "Arn": arn}])

    def close(self) -> None:
        self.server.stop()

    def settings(self, job_id: str, *, queue: bool = True, max_size: int = 3,
                 **daemon: Any) -> Any:
        """Validated settings for a daemon of ``job_id`` on this world's AWS driver."""
        from provisioner.config import parse_settings

        return parse_settings({
            "job": {"id": job_id},
            "cloud": {"driver": "aws"},
            "aws": {"region": REGION, "endpoint_url": self.endpoint,
                    "launch_template": TEMPLATE,
                    "queue_url": self.queue_url if queue else None},
            "fleet": {"max_size": max_size, "markets": ["spot"], "max_zone_share": 0.5},
            "daemon": {"notice_poll_s": 2.0, "plan_s": 30.0, "price_poll_s": 60.0,
                       "metrics_s": 5.0, **daemon},
        }, origin="aws_world")

    def instances(self, job_id: str, *, alive_only: bool = True) -> list[dict[str, Any]]:
        """The raw EC2 instances tagged with ``job_id`` (alive: not shutting down/terminated)."""
        filters = [{"Name": "tag:spotring:job", "Values": [job_id]}]
        if alive_only:
            filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
        out = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                out.extend(reservation["Instances"])
        return out

    def interrupt(self, instance_id: str) -> None:
        """Put a spot interruption warning through EventBridge (-> the SQS queue)."""
        out = self.events.put_events(Entries=[{
            "Source": "aws.ec2", "DetailType": EVENT_KINDS[0],
            "Detail": json.dumps({"instance-id": instance_id, "instance-action": "terminate"})}])
        assert out["FailedEntryCount"] == 0, out


    def rebalance(self, instance_id: str) -> None:
        """Put an EC2 instance rebalance recommendation through EventBridge (elevated risk)."""
        out = self.events.put_events(Entries=[{
            "Source": "aws.ec2", "DetailType": EVENT_KINDS[1],
            "Detail": json.dumps({"instance-id": instance_id})}])
        assert out["FailedEntryCount"] == 0, out

    def state_change(self, instance_id: str, state: str) -> None:
        """Put an EC2 state-change event through EventBridge (moto does not emit them)."""
        out = self.events.put_events(Entries=[{
            "Source": "aws.ec2", "DetailType": EVENT_KINDS[2],
            "Detail": json.dumps({"instance-id": instance_id, "state": state})}])
        assert out["FailedEntryCount"] == 0, out


@functools.lru_cache(maxsize=1)
def market() -> Any:
    """Two GPU types in three us-east-1 zones, prices from pricegen's seeded walk."""
    import random as _random

    from pricing.model import Offering, Snapshot
    from pricing.sources import synthetic

    params = synthetic.GeneratorParams(outages_per_hour=0.0, horizon_s=6 * 3600)
    rng = _random.Random(11)
    quotes = []
    for itype, spot, od in TYPES:
        for zone in ZONES:
            off = Offering("aws", REGION, zone, itype, "spot")
            quotes += synthetic.price_walk(rng, spot, od, START, params, off, "aws-world")
    return Snapshot(quotes=tuple(quotes))


def real_clock(start: datetime = START) -> Callable[[], datetime]:
    """Simulated time that runs at wall speed from ``start`` (inside the market's horizon)."""
    t0 = time.monotonic()
    return lambda: start + timedelta(seconds=time.monotonic() - t0)


def build_daemon(settings: Any, state_path: str | Path, driver: Any = None,
                 coordinator: Any = None, now: Callable[[], datetime] | None = None) -> Any:
    """A :class:`~provisioner.daemon.loop.scheduler.Daemon` on the AWS driver of ``settings``."""
    from pricing.sources.trace import TraceSource
    from provisioner.daemon.wiring import build_daemon as Daemon
    from provisioner.drivers.aws import AwsDriver
    from provisioner.daemon.state import State
    from tests.fakes.ring import FakeRing as FakeCoordinator

    return Daemon(settings, driver or AwsDriver(settings.aws),
                  TraceSource([], snapshot=market()), State(state_path),
                  now=now or real_clock(), coordinator=coordinator or FakeCoordinator())


class PausingDriver:
    """Wraps a driver; at the ``k``-th call of ``verb`` it pauses forever, ``when`` = before
    or after the cloud call, having set ``reached`` so the parent can SIGKILL it there."""

    def __init__(self, inner: Any, point: str, k: int, reached: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.verb, _, self.when = point.partition(":")
        self.k, self.reached, self.calls = k, reached, Counter()

    def _maybe_pause(self, verb: str, when: str) -> None:
        if verb == self.verb and when == self.when and self.calls[verb] == self.k:
            self.reached.set()
            while True:
                time.sleep(60)

    def _call(self, verb: str, fn: Callable[[], Any]) -> Any:
        self.calls[verb] += 1
        self._maybe_pause(verb, "before")
        result = fn()
        self._maybe_pause(verb, "after")
        return result

    def launch(self, request: Any) -> Any:
        return self._call("launch", lambda: self.inner.launch(request))

    def terminate(self, ids: Any) -> None:
        return self._call("terminate", lambda: self.inner.terminate(ids))

    def list(self, job_id: str) -> Any:
        return self.inner.list(job_id)

    def notices(self) -> Any:
        return self.inner.notices()

    def can_place(self, offering: Any) -> bool:
        return self.inner.can_place(offering)


def _child(settings: Any, state_path: str, point: str, k: int, reached: Any) -> None:
    """The daemon under test: recover, plan (launches), then stop with --on-exit terminate."""
    import logging

    logging.disable(logging.CRITICAL)
    from provisioner.drivers.aws import AwsDriver

    driver = AwsDriver(settings.aws)
    if point != "random":
        driver = PausingDriver(driver, point, k, reached)
    d = build_daemon(settings, state_path, driver)
    if point == "random":
        reached.set()  # the parent kills after a random delay
    d.recover()
    d.poll_prices()
    d.plan_and_reconcile("start")
    d.stop("terminate")
    reached.set()  # the pause point never came: killed after the last call
    while True:
        time.sleep(60)


@dataclass(frozen=True)
class TrialResult:
    job: str
    point: str
    k: int
    orphans: int  # alive in the cloud, not held by the recovered state
    duplicates: int  # instances beyond an intent's count or beyond the fleet size
    orphans_without_recovery: int  # baseline: what a daemon without recovery would leave
    alive_after: int


def kill_at_point(target: Callable[..., None], args: tuple, point: str, k: int,
                  rng: random.Random, max_delay_s: float, reached: Any) -> None:
    """Fork ``target(*args, reached)`` (a daemon that sets ``reached`` at its kill point and
    pauses there, see :class:`PausingDriver`), wait for the point (or, for ``random``, a
    random delay after it starts), and SIGKILL it."""
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=target, args=(*args, reached), daemon=True)
    child.start()
    if not reached.wait(60):
        child.kill()
        raise RuntimeError(f"the daemon never reached {point} #{k}")
    if point == "random":
        time.sleep(rng.uniform(0.0, max_delay_s))
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)


def reset_moto(endpoint: str) -> None:
    """Empty moto's backends through the server at ``endpoint`` (``/moto-api/reset``).

    A moto server in this process keeps its state in moto's backends, which are global to
    the process and outlive the server: without this, a server starts with what earlier
    tests in the same pytest worker made (a bucket "snaps" of test_snapshot_stores made
    test_snapshots' missing bucket exist; the driver tests' "spotring-notices" queue)."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset",
                                                  method="POST"), timeout=30).close()


@contextlib.contextmanager
def moto_endpoint() -> Iterator[str]:
    """A bare moto server (S3 and the rest) on an ephemeral port, starting empty
    (:func:`reset_moto`); yields its URL."""
    from moto.server import ThreadedMotoServer

    _credentials()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        reset_moto(url)
        yield url
    finally:
        server.stop()


def crash_trial(world: AwsWorld, workdir: Path, n: int, rng: random.Random,
                replan: bool = True) -> TrialResult:
    """One SIGKILL trial (see the module docstring); leaves no instance of its job alive.

    ``replan``: after recovery, also run one plan round and check the fleet is back to its
    size without duplicates (costs a solve, ~0.5 s)."""
    job = f"crash-{n}-{rng.randrange(1 << 30):x}"
    settings = world.settings(job, queue=False)
    state_path = str(workdir / f"{job}.sqlite")
    point = KILL_POINTS[n % len(KILL_POINTS)]
    k = rng.choice((1, 2)) if point.startswith("launch") else 1
    reached = multiprocessing.get_context("fork").Event()
    kill_at_point(_child, (settings, state_path, point, k), point, k, rng, 1.5, reached)

    from provisioner.daemon.state import State

    held = {r.id for r in State(state_path).live_instances()}
    baseline = len({i["InstanceId"] for i in world.instances(job)} - held)
    d = build_daemon(settings, state_path)
    d.recover()
    alive = {i["InstanceId"] for i in world.instances(job)}
    live = {r.id for r in d.state.live_instances()}
    orphans = len(alive - live)
    per_token = Counter(next((t["Value"] for t in i.get("Tags", [])
                              if t["Key"] == "spotring:token"), "")
                        for i in world.instances(job, alive_only=False))
    asked = {i.token: i.count for i in d.state.intents() if i.kind == "launch"}
    duplicates = sum(max(0, c - asked.get(tok, 0)) for tok, c in per_token.items())
    if replan:
        d.poll_prices()
        d.plan_and_reconcile("restart")  # the fleet comes back to its size, no more
    alive_after = len(world.instances(job))
    duplicates += max(0, alive_after - settings.fleet.max_size)
    orphans += len({i["InstanceId"] for i in world.instances(job)}
                   - {r.id for r in d.state.live_instances()})
    d.stop("terminate")
    d.state.close()
    return TrialResult(job, point, k, orphans, duplicates, baseline, alive_after)
