"""What a run was asked to do: the frozen options a :class:`~provisioner.daemon.run.session.
RunSession` takes.

Design: ``provision run`` checks its flags and the config (one line, exit 2, for anything
wrong) and hands the session this one frozen object, so the daemon never reads an argparse
namespace or the process environment, and a test builds a run from plain values. Every field
names the flag or setting it comes from.

Rule for callers: build it only from checked values (``provision run`` does:
:func:`provisioner.commands.run.options_from`); ``settings.job.job_file`` must have gone
through :func:`provisioner.daemon.run.jobspec.check_job`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provisioner.config import Settings


@dataclass(frozen=True)
class RunOptions:
    """One run's options (see the module docstring)."""

    settings: Settings
    config: str | None = None  # --config, as typed (the registry and `provision down` use it)
    workdir: Path | None = None  # --workdir (a local run; default local.state_dir)
    report: Path | None = None  # --report (default WORKDIR/report, or STATE_PATH.report)
    traces: tuple[str, ...] = ()  # --trace
    speed: float | None = None  # --speed (a local run; default local.speed)
    seed: int = 7  # --seed of the built-in market
    outages_per_hour: float | None = None  # --outages-per-hour of the built-in market
    until_epochs: int | None = None  # --until-epochs (the job ends there by itself)
    until_steps: int | None = None  # --until-steps (the run is cut there)
    duration_s: float | None = None  # --duration, in the run's (simulated) seconds
    duration_text: str | None = None  # --duration as typed, for messages
    on_exit: str | None = None  # --on-exit keep|terminate (default: the environment's)
    metrics_endpoint: tuple[str, int] | None = None  # --metrics-host/--metrics-port
    record_samples: bool = False  # --record-samples
    name: str | None = None  # --name: how `provision status/logs/down/stop/revoke` call it
    detached_log: Path | None = None  # the log of a detached daemon (`--detach` sets it)

    @property
    def job(self) -> str:
        """The job the workers train (``--job``, else ``job.job_file``), checked."""
        return self.settings.job.job_file
