"""Loading a job: clear errors naming the file and the fix, before any contact with a ring."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.errors import JobError
from trainer.job import Job, load_job


def test_missing_file_is_named() -> None:
    with pytest.raises(JobError, match="no/such/job.py.*does not exist"):
        load_job("no/such/job.py", 0)


def test_import_failure_names_the_file_and_cause() -> None:
    with pytest.raises(JobError, match="broken.py.*spotring_no_such_module.*fix the job file"):
        load_job("tests/trainer/jobs/broken.py", 0)


def test_missing_make_job_and_wrong_return_type(tmp_path: Path) -> None:
    f = tmp_path / "nomake.py"
    f.write_text("x = 1\n")
    with pytest.raises(JobError, match="defines no make_job"):
        load_job(str(f), 0)
    f = tmp_path / "wrong.py"
    f.write_text("def make_job(seed):\n    return 42\n")
    with pytest.raises(JobError, match="returned int, expected trainer.job.Job"):
        load_job(str(f), 0)
    f = tmp_path / "raises.py"
    f.write_text("def make_job(seed):\n    raise RuntimeError('no GPU here')\n")
    with pytest.raises(JobError, match=r"make_job\(0\) raised RuntimeError: no GPU here"):
        load_job(str(f), 0)


def test_probe_job_loads_and_slices_batches() -> None:
    job = load_job("tests/trainer/jobs/probe.py", 0)
    assert isinstance(job, Job) and len(job) == job.global_batch == 48
    import torch

    x, y = job.batch(torch.tensor([3, 1]))
    assert x.shape == (2, 10) and y.shape == (2,)


def test_a_job_left_at_auto_trains_in_the_provisioners_mode() -> None:
    from trainer.job import AUTO, Job, resolve_mode

    assert Job.__dataclass_fields__["mode"].default == AUTO
    assert resolve_mode("auto", "hybrid") == ("hybrid", resolve_mode("auto", "hybrid")[1])
    assert resolve_mode("auto", "")[0] == "ring"  # no choice made: the ring
    assert resolve_mode("ring", "hybrid")[0] == "ring"  # a job that names its mode keeps it
    assert resolve_mode("pipeline", "hybrid")[0] == "pipeline"
    mode, why = resolve_mode("auto", "hybrid", precision="fp16")
    assert mode == "ring" and "fp16" in why  # the hybrid mode refuses fp16


def test_workers_of_two_modes_have_different_fingerprints() -> None:
    import torch

    from trainer.state.codec import fingerprint

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ring = fingerprint(model, opt, 32, 100)
    assert fingerprint(model, opt, 32, 100, "ring") == ring  # unchanged for the ring
    assert fingerprint(model, opt, 32, 100, "hybrid") != ring  # refused as another job's
