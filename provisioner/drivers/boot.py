"""What a launch tells a worker's boot script, and the exit codes with which a boot refuses.

Design: the daemon plans a run (its job, training mode, hybrid group, the wheel it ships)
and each launch carries it as *launch values*: ``SPOTRING_*`` entries of the
:class:`~provisioner.drivers.base.LaunchRequest` env, which the AWS driver writes as
``spotring:env:<KEY>`` tags (read on the instance through IMDSv2) and the GCP driver as
``spotring-env-<KEY>`` metadata. The boot scripts (terraform/aws/templates/
worker-user-data.sh.tftpl, terraform/gcp/templates/worker-startup.sh.tftpl) read them, check
each with the same pattern as :data:`LAUNCH_VALUES` (tests/terraform compare the two), and
refuse a value they cannot use: one line ``spotring-boot: error: ...`` in the instance's log
(cloud-init's output on AWS, the startup-script log on GCP) and the value's exit code
(:class:`BootExit`; the table is in docs/deploy.md). The drivers check the same patterns at
launch (:func:`launch_env`), so a value a boot would refuse is never sent.

Rule for callers: put a new launch value here (pattern and exit code) and in both boot
scripts; never send a value :func:`launch_env` refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Mapping

from pricing.model import Offering
from provisioner.errors import DriverError


class BootExit(IntEnum):
    """Exit codes of the worker boot scripts (0: the workers started)."""

    PYTHON = 10  # python3 older than the package needs (3.11)
    METADATA = 11  # the metadata server did not answer (instance id, zone)
    JOB = 20  # SPOTRING_JOB is not a module name
    MODE = 21  # SPOTRING_MODE is not a mode a provisioner chooses
    ZONE = 22  # SPOTRING_ZONE (the hybrid group) is not a zone name
    GPUS = 23  # SPOTRING_GPUS / SPOTRING_DEVICE unusable, or fewer GPUs than the launch says
    WHEEL = 24  # SPOTRING_WHEEL outside the run's artifacts, or no wheel to install
    FETCH = 25  # the wheel could not be fetched, or its SHA-256 differs
    TOKEN = 26  # the ring token could not be read from SSM / Secret Manager
    DEPS = 27  # the package installed but its dependencies (torch) are not on the image
    INDEX = 28  # pip install from the index (the opt-in) failed
    CODE = 30  # SPOTRING_CODE outside the run's artifacts, unfetchable, not unpacked, no job in it
    CODE_SHA256 = 31  # the code's SHA-256 differs from SPOTRING_CODE_SHA256
    REQUIREMENTS = 32  # pip could not install the code's requirements.txt


@dataclass(frozen=True)
class LaunchValue:
    """One launch value: its pattern (a POSIX ERE that Python's ``re`` reads alike), what it
    is, and the exit code of a boot that gets a value outside it."""

    pattern: str
    what: str
    code: BootExit


#: Every launch value a worker boot reads. The patterns are anchored and hold no character a
#: shell or a systemd unit would interpret, so a checked value goes into the unit as is.
LAUNCH_VALUES: dict[str, LaunchValue] = {
    "SPOTRING_JOB": LaunchValue(r"^([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*|"
                                r"([A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_.-]*"
                                r"\.py)$", "the job: a module (make_job) importable on the "
                                "worker, or a .py path inside SPOTRING_CODE", BootExit.JOB),
    "SPOTRING_MODE": LaunchValue(r"^(ring|hybrid)$", "the training mode the run chose",
                                 BootExit.MODE),
    "SPOTRING_ZONE": LaunchValue(r"^[a-z0-9][a-z0-9/._-]{0,126}$", "the hybrid group the run "
                                 "planned (``<region>/<zone>``; default: the instance's zone)",
                                 BootExit.ZONE),
    "SPOTRING_GPUS": LaunchValue(r"^[0-9]{1,2}$", "workers to start, one per GPU (default: "
                                 "the GPUs nvidia-smi lists)", BootExit.GPUS),
    "SPOTRING_DEVICE": LaunchValue(r"^(cuda|cpu)$", "where the workers compute (default: "
                                   "cuda when the instance has GPUs)", BootExit.GPUS),
    "SPOTRING_WHEEL": LaunchValue(r"^(s3|gs)://[a-z0-9][a-z0-9._-]{1,62}/[A-Za-z0-9._/+-]{1,900}"
                                  r"\.whl$", "the spotring wheel the daemon runs, in the run's "
                                  "artifacts", BootExit.WHEEL),
    "SPOTRING_WHEEL_SHA256": LaunchValue(r"^[0-9a-f]{64}$", "the wheel's SHA-256",
                                         BootExit.WHEEL),
    "SPOTRING_CODE": LaunchValue(r"^(s3|gs)://[a-z0-9][a-z0-9._-]{1,62}/[A-Za-z0-9._/+-]{1,900}"
                                 r"\.tar\.gz$", "the user's code (provisioner/drivers/code.py), "
                                 "in the run's artifacts", BootExit.CODE),
    "SPOTRING_CODE_SHA256": LaunchValue(r"^[0-9a-f]{64}$", "the code's SHA-256",
                                        BootExit.CODE),
}


def gpus_of(offering: Offering) -> int | None:
    """GPUs of an offering's instance type (pricing.catalog), or None when unknown."""
    from pricing import catalog

    spec = catalog.gpu_for(offering.instance_type)
    return spec.count if spec is not None and spec.count > 0 else None


def check(key: str, value: str) -> str:
    """``value`` when launch value ``key`` accepts it; raises DriverError naming the key and
    what it should be (a key not in :data:`LAUNCH_VALUES` passes: the user's own env)."""
    spec = LAUNCH_VALUES.get(key)
    if spec is not None and not re.fullmatch(spec.pattern.strip("^$"), value):
        raise DriverError(f"launch value {key}={value[:80]!r}: not {spec.what} (a worker's "
                          f"boot would refuse it with exit {int(spec.code)})")
    return value


def launch_env(offering: Offering, env: Mapping[str, str]) -> dict[str, str]:
    """The launch values of one launch: ``env`` checked (:func:`check`), with
    ``SPOTRING_GPUS`` from the instance type when the launch does not say it.

    Raises DriverError naming the first value a boot would refuse.
    """
    out = {str(k): str(v) for k, v in env.items()}
    if "SPOTRING_GPUS" not in out:
        gpus = gpus_of(offering)
        if gpus is not None:
            out["SPOTRING_GPUS"] = str(gpus)
    for key, value in out.items():
        check(key, value)
    return out
