"""What a worker is told: the settings of ``python -m trainer worker`` as one frozen value.

Design. :class:`WorkerConfig` is input only (the command line builds it, nothing changes it):
where the coordinator is and the token, the job and its seed, the emulations and fault
injection of the tests, the timeouts, where outputs go, and where this worker runs (its
zone, the provisioner's mode for the run). Every flag is documented in docs/trainer.md.

Rule for callers: build one per worker process; read, never write.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.collective.reducer import DEFAULT_BUCKET_MB


@dataclass(frozen=True)
class WorkerConfig:
    """What ``python -m trainer worker`` passes in (see docs/trainer.md)."""

    host: str
    port: int
    token: bytes
    job: str
    name: str
    seed: int = 0
    slowdown: float = 1.0
    metrics_file: Path | None = None
    record_samples: Path | None = None
    collective_timeout_s: float = 10.0
    connect_budget_s: float = 60.0
    heartbeat_s: float = 0.1
    profile_steps: int = 3
    faults: tuple[tuple[str, int], ...] = ()  # (kill|stop|term|freeze, first step >= this)
    rejoin: bool = True
    boot_idle: bool = False  # the process started under SCHED_IDLE: restore after profiling
    ring_host: str | None = None  # where gloo listens (default: the address facing the
    # coordinator)
    device: str = "auto"
    bucket_mb: float = DEFAULT_BUCKET_MB
    output: Path | None = None  # where rank 0 writes the trained model (state_dict)
    loader_workers: int | None = None  # overrides the job's
    coordinator_grace_s: float = 600.0  # train on / wait this long for a lost coordinator
    zone: str = ""  # where this worker runs (cloud zone): the hybrid mode groups by it
    mode: str = ""  # the provisioner's training mode for the run (a Job.mode "auto" takes it)
    record_digests: bool = False  # --record-digests: every metrics line carries the digests
    until_steps: int | None = None  # $SPOTRING_UNTIL_STEPS: end (finished) at this step
    until_epochs: int | None = None  # $SPOTRING_UNTIL_EPOCHS: end (finished) at this epoch
    resume: Path | None = None  # --resume: the user's checkpoint the first generation starts from
