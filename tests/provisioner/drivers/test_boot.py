"""The launch values a driver sends are the ones a worker's boot accepts
(provisioner/drivers/boot.py; the boot scripts' side is tests/terraform/test_worker_boot.py)."""

from __future__ import annotations

import pytest

from pricing.model import Offering
from provisioner.drivers.boot import LAUNCH_VALUES, BootExit, check, gpus_of, launch_env
from provisioner.errors import DriverError

P3_8X = Offering("aws", "us-east-1", "us-east-1a", "p3.8xlarge")
N1_T4X2 = Offering("gcp", "us-central1", "us-central1-a", "n1-standard-8+nvidia-tesla-t4x2")


def test_the_gpu_count_of_an_instance_type_goes_with_its_launch() -> None:
    assert gpus_of(P3_8X) == 4 and gpus_of(N1_T4X2) == 2
    assert launch_env(P3_8X, {"SPOTRING_JOB": "pkg.job"})["SPOTRING_GPUS"] == "4"
    assert launch_env(P3_8X, {"SPOTRING_GPUS": "1"})["SPOTRING_GPUS"] == "1"  # said: kept
    assert "SPOTRING_GPUS" not in launch_env(Offering("aws", "us-east-1", "us-east-1a",
                                                      "m5.large"), {})


@pytest.mark.parametrize(("key", "value"), [
    ("SPOTRING_JOB", "spotring_examples.digits"), ("SPOTRING_MODE", "hybrid"),
    # the hybrid group as the daemon's mode choice names it (provisioner/plan/mode.py)
    ("SPOTRING_ZONE", "us-east-1/us-east-1b"), ("SPOTRING_ZONE", "us-central1-a"),
    ("SPOTRING_GPUS", "8"), ("SPOTRING_DEVICE", "cpu"),
    ("SPOTRING_WHEEL", "s3://bucket/artifacts/" + "a" * 64 + "/spotring-0.1.0-py3-none-any.whl"),
    ("SPOTRING_WHEEL_SHA256", "a" * 64), ("OMP_NUM_THREADS", "anything: the user's own"),
    # a job file inside the code that travels with the run (provisioner/drivers/code.py)
    ("SPOTRING_JOB", "train.py"), ("SPOTRING_JOB", "src/my-job/train_v2.py"),
    ("SPOTRING_CODE", "gs://bucket/artifacts/" + "b" * 64 + "/code.tar.gz"),
    ("SPOTRING_CODE_SHA256", "b" * 64),
])
def test_values_a_boot_accepts_pass(key: str, value: str) -> None:
    assert check(key, value) == value


@pytest.mark.parametrize(("key", "value"), [
    ("SPOTRING_JOB", "train.py x"), ("SPOTRING_JOB", "x; reboot"), ("SPOTRING_MODE", "pipeline"),
    ("SPOTRING_ZONE", "Zone A"), ("SPOTRING_ZONE", "a\nb"), ("SPOTRING_GPUS", "100"),
    ("SPOTRING_WHEEL", "file:///tmp/spotring.whl"), ("SPOTRING_WHEEL_SHA256", "A" * 64),
    ("SPOTRING_JOB", "../train.py"), ("SPOTRING_JOB", "/abs/train.py"),
    ("SPOTRING_JOB", ".hidden/train.py"), ("SPOTRING_JOB", "a b.py"),
    ("SPOTRING_CODE", "s3://bucket/code.tar.gz;reboot"), ("SPOTRING_CODE", "/tmp/code.tar.gz"),
    ("SPOTRING_CODE_SHA256", "x" * 64),
])
def test_values_a_boot_refuses_are_never_sent(key: str, value: str) -> None:
    with pytest.raises(DriverError, match=rf"{key}.*exit {int(LAUNCH_VALUES[key].code)}"):
        launch_env(P3_8X, {key: value})


def test_every_launch_value_has_an_exit_code_of_its_own_kind() -> None:
    assert {v.code for v in LAUNCH_VALUES.values()} <= set(BootExit)
    assert len({int(c) for c in BootExit}) == len(BootExit)
