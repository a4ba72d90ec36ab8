"""Loading a job: clear errors naming the file and the fix, before any contact with a ring."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.job import Job, JobError, load_job


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
