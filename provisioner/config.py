"""Configuration: pydantic settings read from one TOML file.

Design: every section is a small pydantic model with ``extra="forbid"``, so a misspelt key is
an error, not a silent default. :func:`load_settings` turns pydantic's errors into one
:class:`~provisioner.errors.ConfigError` whose message names each bad field by its TOML path
(``objective.budget_per_hour``) and says what would be valid. An empty file (or no file) gives
the embedded local default: no cloud account needed.

Numbers are finite (``allow_inf_nan=False``) and bounded: ``inf``, ``nan`` or an absurd value
(a budget of 1e308 USD an hour) is refused with the field's name, like a misspelt key.

Relative paths in a config file (``daemon.state_path``, ``daemon.token_path``, a plain-path
``snapshot.url``, an explicit ``local.state_dir``) are read from the config file's folder, not
from the current directory: a daemon started from another directory finds the same state
(and so adopts its fleet instead of starting afresh).

Rule for callers: read settings only through :func:`load_settings`; never construct a
``Settings`` from unvalidated dicts elsewhere.

Ownership of sections (keep each edit inside its own class): ``job``/``objective``/``fleet``/
``source``/``optimizer`` belong to the optimiser; ``cloud``/``aws``/``gcp``/``local``/``daemon``/
``metrics`` to the drivers and the daemon.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from provisioner.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: The largest figure any rate or amount may take (1e12: a trillion samples/s or USD is no
#: real job; 1e308 or inf is a typo that would overflow the solver's arithmetic).
HUGE = 1e12


class JobSettings(_Section):
    """What is trained, and the figures the optimiser needs about it."""

    id: str = Field("spotring-demo", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
                    description="job id; tags every instance (lowercase letters, digits, '-')")
    job_file: str = Field("spotring_examples.digits", description="the trainer job: a module "
                          "or a .py path defining make_job(seed) (`provision run --job` "
                          "overrides); default: the packaged examples/digits.py")
    code: str | None = Field(None, min_length=1, description="a cloud run: the folder of the "
                             "job's code, packed and shipped with the run to every worker "
                             "(`provision run --code` overrides); default: the job file's "
                             "folder when job_file is a .py path (provisioner/drivers/code.py)")
    code_max_mb: float = Field(100.0, gt=0, le=10_000, description="the most MB of files the "
                               "code folder may hold (code, not data: data goes in a bucket or "
                               ".gitignore)")
    model_mb: float = Field(50.0, ge=0, le=1_000_000,
                            description="gradient size all-reduced each step, in MB (0: the "
                            "all-reduce is not priced, e.g. a tiny model)")
    activation_mb: float = Field(
        1.0, ge=0, le=100_000, description="MB of activations per sample a pipeline stage "
        "sends to the next (its gradient comes back as large); prices virtual workers' "
        "links (1.0: a 1024-token sequence of width 512 in bf16; 0 leaves them unpriced)")
    global_batch: int = Field(1024, ge=1, le=10_000_000,
                              description="samples per step over the whole ring (constant)")
    samples_per_s_per_unit: float = Field(
        400.0, gt=0, le=HUGE, description="samples/s of one GPU of relative throughput 1.0 "
        "(pricing.catalog.relative_throughput); scales every prior")
    throughput_priors: dict[str, Annotated[float, Field(gt=0, le=HUGE)]] = Field(
        default_factory=dict, description="instance type -> samples/s, overriding the catalog prior")
    mode: Literal["auto", "ring", "hybrid"] = Field(
        "auto", description="training mode of the run, given to every worker as SPOTRING_MODE "
        "(a job whose Job.mode is 'auto' trains in it): auto = hybrid when the first plan "
        "spans zones or its speeds differ 3x, else the ring (the ring on the local cloud)")
    max_hourly_cost: float | None = Field(
        None, gt=0, le=1e6, description="USD per hour the fleet may cost at most, whatever the "
        "objective (with objective.budget_per_hour, the smaller holds)")
    max_spot_price: float | None = Field(
        None, gt=0, le=1e4, description="USD per hour one spot instance may cost at most: a "
        "spot offering priced above is not bought, and one held is given up")
    budget_usd: float | None = Field(
        None, gt=0, le=1e9, description="USD the whole job may spend: the planner stops buying "
        "before it is spent (overshoot at most 1%), and says before it starts when it cannot "
        "finish objective.work_samples")


class ObjectiveSettings(_Section):
    """What the optimiser aims for.

    ``max-throughput`` is bounded by ``budget_per_hour`` when set (else by ``fleet.max_size``);
    ``min-cost`` needs ``target_samples_per_s``; ``deadline`` needs ``work_samples`` and
    ``deadline_hours``.
    """

    kind: Literal["max-throughput", "min-cost", "deadline"] = "max-throughput"
    # (min-cost with work_samples: the work paced at target_samples_per_s, a soft deadline
    # the job may miss rather than pay more; see provisioner/plan/objective.py)
    budget_per_hour: float | None = Field(None, gt=0, le=1e6,
                                          description="USD per hour cap on the fleet")
    target_samples_per_s: float | None = Field(None, gt=0, le=HUGE,
                                               description="useful throughput wanted (min-cost)")
    work_samples: float | None = Field(None, gt=0, le=1e18,
                                       description="samples to process (deadline; with min-cost, "
                                       "paced at target_samples_per_s)")
    deadline_hours: float | None = Field(None, gt=0, le=87_600,
                                         description="hours from job start to the deadline "
                                         "(at most ten years)")
    safety_hours: float = Field(2.0, ge=0, le=1000,
                                description="deadline: when the slack (time left minus the time "
                                "on-demand would need) falls below this, on-demand capacity "
                                "is phased in (Uniform Progress' safety net)")

    @model_validator(mode="after")
    def _needs(self) -> "ObjectiveSettings":
        need = {"max-throughput": (), "min-cost": ("target_samples_per_s",),
                "deadline": ("work_samples", "deadline_hours")}[self.kind]
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"kind = {self.kind!r} needs " + " and ".join(
                f"objective.{n}" for n in missing) + " (a positive number)")
        return self


class FleetSettings(_Section):
    """Bounds on the fleet, and the costs of changing it."""

    min_size: int = Field(0, ge=0, description="fewest instances")
    max_size: int = Field(16, ge=1, le=10_000, description="most instances (16: a paced job "
                          "catches up after an outage at up to 4x the nominal 4-instance ring; "
                          "8 cost 2.7x the hindsight bound on the 16-node aws-08-27-2023 trace)")
    markets: list[Literal["spot", "on-demand"]] = Field(
        default_factory=lambda: ["spot", "on-demand"], min_length=1,
        description="markets the optimiser may buy in")
    max_zone_share: float = Field(1.0, gt=0, le=1,
                                  description="most spot instances in one zone, as a share of "
                                  "the fleet (plus zone_allowance). 1.0: no cap; the optimiser "
                                  "already prices each zone's hazard and a ring is fastest in "
                                  "one zone; 0.5 cost 12% more on the nine-zone aws-02-15-2023 "
                                  "trace (1.16x against 1.04x the hindsight bound)")
    zone_allowance: int = Field(1, ge=0, description="spot instances any zone may hold whatever "
                                "the share (so a fleet of one is possible)")
    region_quota_gpus: dict[str, int] = Field(default_factory=dict,
                                              description="region -> most GPUs held there")
    family_quota_gpus: dict[str, int] = Field(default_factory=dict,
                                              description="instance family (p3, a2) -> most GPUs")
    max_regions: int = Field(1, ge=1, le=100, description="regions one ring may span")
    boot_s: float = Field(180.0, ge=0, le=7200, description="launch to ready to join, seconds")
    reform_s: float = Field(5.0, ge=0, le=3600, description="ring re-form time, seconds")
    step_s: float = Field(1.0, ge=0, le=3600, description="one training step, seconds (work "
                          "lost by the ring on a revocation without notice)")
    churn_horizon_hours: float = Field(1.0, gt=0, le=1000,
                                       description="a change must pay back its reconfiguration "
                                       "cost within this horizon")
    intra_zone_gbps: float = Field(10.0, gt=0, le=1e5, description="link bandwidth inside a zone")
    inter_zone_gbps: float = Field(5.0, gt=0, le=1e5, description="link bandwidth across zones")
    inter_region_gbps: float = Field(1.0, gt=0, le=1e5,
                                     description="link bandwidth across regions")
    max_half_ring_loss: float = Field(
        0.05, ge=0, le=1, description="most chance that one 3-minute window revokes half the "
        "ring or more (interruptions of one type in one zone come together): a fleet above it "
        "is spread over more pools when that costs at most spread_cost_tolerance more per "
        "useful sample (1: never spread for it)")
    spread_cost_tolerance: float = Field(
        1.05, ge=1.0, le=100.0, description="a fleet spread to keep max_half_ring_loss may "
        "cost at most this factor of the cheapest one per useful sample")

    @model_validator(mode="after")
    def _bounds(self) -> "FleetSettings":
        if self.min_size > self.max_size:
            raise ValueError(f"fleet.min_size ({self.min_size}) must be <= fleet.max_size "
                             f"({self.max_size})")
        return self


class PacingSettings(_Section):
    """How a job with known work keeps its progress line (provisioner/plan/pacing.py)."""

    ahead_tolerance: float = Field(1.10, ge=1.0, le=100.0, description="ahead of its progress "
                                   "line the job buys only hardware within this factor of the "
                                   "cheapest cost per sample")
    catch_up_tolerance: float = Field(1.05, ge=1.0, le=100.0, description="behind its own "
                                      "pace (no deadline) the job catches up only on rings "
                                      "within this factor of the cost per sample of the ring "
                                      "that keeps the pace; a deadline is kept at any price")
    bank_hours: float | None = Field(None, ge=0, le=1000, description="hours of the pace to "
                                     "bank ahead with the cheapest hardware while dearer spot "
                                     "is the fallback; unset: learned from the outages seen")
    spot_share: float | None = Field(None, gt=0, le=1, description="the share of the time "
                                     "the cheapest spot is expected to be there, for a "
                                     "deadline with only on-demand to fall back on: its work "
                                     "is spread over that time from the start (the lower of "
                                     "this and the share seen, once outages were); unset: "
                                     "learned from the outages seen (see share_prior_hours), "
                                     "none assumed before; `provision simulate` prints a "
                                     "trace's share")
    share_prior_hours: float = Field(48.0, ge=0, le=1000, description="hours counted as "
                                     "time the cheapest spot was there before the job "
                                     "began, when the share of the time it is there is "
                                     "learned from the outages seen (a prior: one early "
                                     "outage is one draw of the market, not its rule; chosen "
                                     "leave-one-family-out over the traces' windows)")
    work_per_dollar_steps: list[float] = Field(default_factory=lambda: [2.0, 4.0],
                                               description="also try these multiples of the "
                                               "pace; keep the fleet cheapest per sample")


class SourceSettings(_Section):
    """Where prices come from."""

    kind: Literal["aws", "gcp", "trace"] = "trace"
    trace: str | None = Field(None, description="trace file (kind = 'trace')")
    traces: list[str] = Field(default_factory=list,
                              description="more trace files combined with `trace` (e.g. prices "
                              "from one, availability from another)")
    regions: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list)


class OptimizerSettings(_Section):
    """Solver knobs."""

    time_limit_s: float = Field(1.0, gt=0, le=60, description="time limit of one MILP solve")
    default_spot_hazard_per_hour: float = Field(
        0.1, ge=0, le=100, description="revocations/hour assumed for a spot offering with no "
        "risk estimate")
    max_quote_age_hours: float = Field(24.0 * 14, gt=0, le=1e6, description="quotes older than this are "
                                       "ignored (GCP prices change weekly at most)")


class CloudSettings(_Section):
    """Which driver launches instances, and what a cloud worker installs
    (:mod:`provisioner.drivers.artifacts`)."""

    driver: Literal["local", "aws", "gcp"] = "local"
    artifacts: str | None = Field(None, min_length=1, description="where the run's artifacts "
                                  "go (s3://bucket/prefix, gs://bucket/prefix): the daemon "
                                  "stores its wheel there and each launch pins it by SHA-256; "
                                  "unset: workers install what terraform put on them")
    wheel: str | None = Field(None, min_length=1, description="the spotring wheel this daemon "
                              "runs (a .whl path), shipped to [cloud] artifacts; unset: built "
                              "from the checkout the daemon runs from")

    @field_validator("artifacts")
    @classmethod
    def _artifacts(cls, url: str | None) -> str | None:
        if url is None or "://" not in url:
            return url
        scheme, _, rest = url.partition("://")
        if scheme not in ("s3", "gs", "file") or not rest.split("/", 1)[0]:
            raise ValueError("use s3://bucket/prefix, gs://bucket/prefix or a folder")
        return url


class AwsSettings(_Section):
    """The AWS driver: where to launch, from which launch template, where notices arrive."""

    region: str = Field("us-east-1", pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$",
                        description="AWS region of the fleet, e.g. us-east-1")
    endpoint_url: str | None = Field(None, description="EC2/SQS endpoint override (a moto server)")
    launch_template: str | None = Field(None, min_length=3, max_length=128,
                                        description="launch template name of the workers")
    launch_template_id: str | None = Field(None, pattern=r"^lt-[0-9a-f]+$",
                                           description="launch template id (instead of a name)")
    launch_template_version: str = Field("$Default", description="$Default, $Latest or a number")
    launch_mode: Literal["fleet", "run-instances"] = Field(
        "fleet", description="create_fleet Type=instant, or run_instances with spot options")
    queue_url: str | None = Field(None, description="SQS queue fed by EventBridge EC2 events")
    subnets: dict[str, str] = Field(default_factory=dict,
                                    description="zone -> subnet id; default: the default VPC's")


class GcpSettings(_Section):
    """The GCP driver: project, zones to watch, and what each SPOT VM boots."""

    project: str | None = Field(None, pattern=r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$",
                                description="GCP project id of the fleet")
    zones: list[str] = Field(default_factory=list,
                             description="zones watched for preemptions (plus those launched in)")
    api_endpoint: str | None = Field(None, description="Compute API endpoint override (a fake)")
    source_image: str = "projects/debian-cloud/global/images/family/debian-12"
    boot_disk_gb: int = Field(50, ge=10, le=65536)
    network: str = "global/networks/default"
    subnetwork: str | None = Field(None, description="subnetwork of the VMs (required in a "
                                   "custom-mode network, such as the one terraform/gcp makes)")
    service_account: str | None = None
    startup_script: str | None = Field(None, description="boots the worker on each VM")
    preemption_notice_s: int = Field(120, ge=0, le=120, description="seconds a SPOT VM is told "
                                     "of its preemption (instance/preempted TRUE) before the "
                                     "soft-off, so its worker leaves at a step boundary; 0: "
                                     "none (GCE's 30 s soft-off only)")


class LocalSettings(_Section):
    """The embedded cloud: workers are processes on this machine (see docs/daemon.md)."""

    state_dir: str = Field("spotring-run", description="work directory of a local run: state, "
                           "pid files, notices, worker logs, report (--workdir overrides)")
    speed: float = Field(60.0, gt=0, le=1_000_000,
                         description="the most simulated seconds per real second (prices, "
                         "notices, cost); slower while the ring trains below "
                         "reference_samples_per_s (pricing/sources/pace.py)")
    reference_samples_per_s: float | None = Field(
        None, ge=0, le=1e9, description="the ring's samples/s at which the clock runs at "
        "speed; below it the clock slows in proportion (the market meets the job at the same "
        "samples on any machine). Default: the packaged example's figure on a quiet 2-core "
        "machine for it, none (always speed) for another job; 0: no pacing")
    pace_floor: float = Field(0.05, gt=0, le=1, description="the paced clock never runs below "
                              "this fraction of speed (a stalled ring does not freeze the market)")
    notice_window_s: float = Field(120.0, ge=0, le=3600, description="simulated seconds from a "
                                   "revocation notice to the kill (AWS gives 120)")
    hard_kill_every: int = Field(3, ge=0, le=1_000_000, description="every Nth trace revocation comes without "
                                 "notice (0: never)")
    gpus_per_instance: int = Field(1, ge=1, le=64, description="worker processes per local "
                                   "instance, as a cloud instance runs one per GPU (named "
                                   "<instance>/<k>; all on this machine's CPU)")
    python: str | None = Field(None, description="interpreter for the workers (default: this one)")
    worker_args: list[str] = Field(default_factory=list,
                                   description="extra arguments for `python -m trainer worker`")


class DaemonSettings(_Section):
    """Schedules and state of ``provision run`` (periods in simulated seconds; defaults and
    their reasons in provisioner/timing.py)."""

    state_path: str = Field("spotring-state.sqlite", min_length=1, description="the SQLite "
                            "state of a cloud run (relative: to the config file's folder); a "
                            "restart on it adopts the fleet")
    price_poll_s: float = Field(60.0, gt=0, le=86400, description="price poll period")
    notice_poll_s: float = Field(2.0, gt=0, le=600, description="notice watch period")
    plan_s: float = Field(30.0, gt=0, le=86400, description="plan-and-reconcile period")
    metrics_s: float = Field(5.0, gt=0, le=3600, description="metrics period")
    zone_avoid_ttl_s: float = Field(600.0, ge=0, le=30 * 86400,
                                    description="a revoked zone is avoided this long")
    capacity_ttl_s: float = Field(180.0, ge=0, le=30 * 86400, description="an offering out of "
                                  "capacity is skipped this long")
    drain_timeout_s: float = Field(60.0, gt=0, le=86400, description="a draining worker is "
                                   "terminated after this long anyway")
    join_deadline_s: float = Field(3600.0, gt=0, le=7 * 86400, description="an instance none "
                                   "of whose workers joined the ring this long after its launch "
                                   "is terminated and its offering skipped for capacity_ttl_s "
                                   "(longer when 3x the slowest boot measured is longer; at least 5 real "
                                   "minutes on the local cloud's fast clock)")
    max_launches_per_round: int = Field(4, ge=1, le=1000, description="churn limit")
    max_removals_per_round: int = Field(2, ge=1, le=1000, description="churn limit")
    on_exit: Literal["keep", "terminate"] = Field("keep", description="what happens to the fleet "
                                                  "when the daemon stops (--on-exit overrides)")
    coordinator_host: str = Field("127.0.0.1", description="address workers dial")
    coordinator_port: int = Field(0, ge=0, le=65535, description="0: any free port")
    token_path: str | None = Field(None, description="ring token file; when set, a cloud daemon "
                                   "runs the trainer's coordinator inside (the local run makes "
                                   "its own)")


class MetricsSettings(_Section):
    """The Prometheus endpoint of ``provision run`` (``--metrics-port`` and ``--metrics-host``
    override). Loopback by default: the metrics name instances, prices and spend, so a daemon
    is scraped from another host only when its operator says so (``host = "0.0.0.0"``, or the
    address of the interface Prometheus reaches, behind the network rules they keep)."""

    host: str = Field("127.0.0.1", min_length=1, max_length=255,
                      description="address /metrics listens on (0.0.0.0: every interface)")
    port: int | None = Field(None, ge=0, le=65535, description="port of /metrics (unset: no "
                             "endpoint; 0: any free port, printed at start)")


class SnapshotSettings(_Section):
    """Durable snapshots of the ring's state (the trainer's ``trainer.state.snapshot``): where and
    how often. Workers upload over the ring's authenticated control channel to the
    coordinator inside the daemon, which writes them here; workers need no credentials.

    ``url``: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``file:///abs/dir`` or a plain
    folder; the job id is appended (``.../<job.id>``) so jobs sharing a bucket never resume
    each other's state. Unset: the daemon host's disk, ``WORKDIR/snapshots`` for a local run
    and ``snapshots/<job.id>`` beside ``daemon.state_path`` for a cloud run.

    ``direct``: while the daemon is away (killed, restarting) the coordinator cannot store
    anything; with ``direct = true`` it tells the workers where the store is, and rank 0 writes
    its snapshot there itself (signed with the job token), so losing every worker during the
    outage costs one interval. The workers then need a put grant under ``url/<job.id>/`` (the
    terraform modules' ``snapshots.tf``); without it their write fails and they retry through
    the coordinator as before.
    """

    url: str | None = Field(None, min_length=1, description="where snapshots go (see above)")
    every_s: float = Field(300.0, ge=0, le=7 * 86400, description="seconds between snapshots "
                           "(0: by steps only); losing every member costs at most this")
    every_steps: int = Field(0, ge=0, le=1_000_000_000, description="steps between snapshots "
                             "(0: by time only; both 0: no snapshots)")
    keep: int = Field(3, ge=1, le=1000, description="newest complete snapshots kept")
    endpoint_url: str | None = Field(None, description="S3 endpoint override (a moto server)")
    api_endpoint: str | None = Field(None, description="GCS endpoint override (a fake)")
    direct: bool | None = Field(None, description="may rank 0 write its snapshot to the store "
                                "itself while the daemon is away? (true: the workers hold a put "
                                "grant under the prefix, as terraform/aws and terraform/gcp give; "
                                "unset: only a folder with the coordinator on loopback)")

    @field_validator("url")
    @classmethod
    def _where(cls, url: str | None) -> str | None:
        if url is None or "://" not in url:
            return url
        scheme, _, rest = url.partition("://")
        if scheme not in ("s3", "gs", "file"):
            raise ValueError(f"scheme {scheme!r} unknown; use s3://bucket/prefix, "
                             "gs://bucket/prefix or a folder")
        if scheme == "file" and not rest.startswith("/"):
            raise ValueError("a file URL needs an absolute path (file:///abs/dir)")
        if scheme in ("s3", "gs") and not rest.split("/", 1)[0]:
            raise ValueError(f"no bucket; use {scheme}://bucket/prefix")
        return url

    @property
    def enabled(self) -> bool:
        return self.every_s > 0 or self.every_steps > 0


class Settings(_Section):
    job: JobSettings = JobSettings()
    objective: ObjectiveSettings = ObjectiveSettings()
    fleet: FleetSettings = FleetSettings()
    source: SourceSettings = SourceSettings()
    pacing: PacingSettings = PacingSettings()
    optimizer: OptimizerSettings = OptimizerSettings()
    cloud: CloudSettings = CloudSettings()
    aws: AwsSettings = AwsSettings()
    gcp: GcpSettings = GcpSettings()
    local: LocalSettings = LocalSettings()
    daemon: DaemonSettings = DaemonSettings()
    metrics: MetricsSettings = MetricsSettings()
    snapshot: SnapshotSettings = SnapshotSettings()


def _describe(error: dict[str, Any]) -> str:
    path = ".".join(str(p) for p in error["loc"]) or "(top level)"
    kind = error["type"]
    msg = error["msg"]
    if kind == "extra_forbidden":
        return f"{path}: unknown setting (check the spelling; see examples/config.toml)"
    if kind == "literal_error":
        return f"{path}: {msg} (got {error.get('input')!r})"
    return f"{path}: {msg} (got {error.get('input')!r})"


def parse_settings(data: dict[str, Any], *, origin: str = "<config>") -> Settings:
    """Validate a dict (as read from TOML). Raises ConfigError naming every bad field."""
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"{origin}: invalid configuration: {problems}") from None


def load_settings(path: str | Path | None) -> Settings:
    """Read and validate a TOML config file; ``None`` gives the embedded local defaults.

    Raises ConfigError when the file is missing, is not valid TOML, or fails validation.
    """
    if path is None:
        return Settings()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found (pass --config with an existing file, "
                          f"e.g. examples/config.toml)") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return anchor_paths(parse_settings(data, origin=str(p)), p.resolve().parent)


def with_objective(settings: Settings, **fields: Any) -> Settings:
    """``settings`` with ``objective`` fields replaced, validated as a config file's would
    be (the simulator's ``--work``/``--deadline``). Raises ConfigError naming a bad field."""
    data = settings.objective.model_dump()
    data.update(fields)
    try:
        objective = ObjectiveSettings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe({**e, "loc": ("objective", *e["loc"])})
                             for e in exc.errors())
        raise ConfigError(f"invalid objective: {problems}") from None
    return settings.model_copy(update={"objective": objective})


def anchor_paths(settings: Settings, base: Path) -> Settings:
    """``settings`` with its relative file paths read from ``base`` (the config file's folder):
    ``daemon.state_path``, ``daemon.token_path``, a plain-path ``snapshot.url`` and an
    explicitly set ``local.state_dir``."""

    def anchored(path: str) -> str:
        p = Path(path).expanduser()
        return str(p if p.is_absolute() else base / p)

    d, snap, loc = settings.daemon, settings.snapshot, settings.local
    daemon = d.model_copy(update={"state_path": anchored(d.state_path),
                                  **({"token_path": anchored(d.token_path)}
                                     if d.token_path else {})})
    snapshot = snap
    if snap.url is not None and "://" not in snap.url:
        snapshot = snap.model_copy(update={"url": anchored(snap.url)})
    local = loc
    if "state_dir" in loc.model_fields_set:
        local = loc.model_copy(update={"state_dir": anchored(loc.state_dir)})
    return settings.model_copy(update={"daemon": daemon, "snapshot": snapshot, "local": local})
