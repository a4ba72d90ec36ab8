"""The job's issue-26 fields: each bad one refused with one line naming it, before any
contact with a ring; data as people have it (their order, indexed shards)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.data.sampler import CursorState, split
from trainer.data.shards import ShardedDataset
from trainer.errors import JobError
from trainer.job import load_job
from trainer.worker.runtime import user_order

HEAD = """
import torch
from torch.utils.data import IterableDataset, TensorDataset
from trainer.job import Job

class Stream(IterableDataset):
    def __iter__(self):
        yield from range(10)

def make_job(seed):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.zeros(10, 2), torch.zeros(10, 1))
    kw = dict(model=model, optimizer=opt, loss_fn=torch.nn.functional.mse_loss,
              train_set=data, global_batch=4, epochs=1)
"""


@pytest.mark.parametrize("extra, message", [
    ("kw['train_set'] = Stream()", "train_set is an IterableDataset; exactly-once data needs"),
    ("kw['loss_fn'] = None", "give loss_fn.*or forward_loss"),
    ("kw['grad_clip'] = -1.0", "grad_clip=-1.0 must be a positive number"),
    ("kw['micro_batch'] = 0", "micro_batch=0 must be a positive int"),
    ("kw['scheduler'] = 'cosine'", "scheduler=str is not a torch LR scheduler"),
    ("kw['scheduler'] = torch.optim.lr_scheduler.StepLR(torch.optim.SGD("
     "torch.nn.Linear(1, 1).parameters(), lr=1), 1)", "schedules another optimizer"),
    ("kw['extra_state'] = {'ema': 3}", r"extra_state\['ema'\] \(int\) needs state_dict"),
    ("kw['scheduler_every'] = 'batch'", "scheduler_every='batch'"),
    ("kw['epochs'] = 0", "epochs=0 must be a positive int .or set max_steps"),
])
def test_a_bad_field_is_refused_naming_it(tmp_path: Path, extra: str, message: str) -> None:
    f = tmp_path / "job.py"
    f.write_text(HEAD + f"    {extra}\n    return Job(**kw)\n")
    with pytest.raises(JobError, match=message):
        load_job(str(f), 0)


def test_max_steps_alone_ends_the_job(tmp_path: Path) -> None:
    f = tmp_path / "job.py"
    f.write_text(HEAD + "    kw['epochs'] = 0\n    kw['max_steps'] = 7\n    return Job(**kw)\n")
    job = load_job(str(f), 0)
    assert not job.ends_at(6, 2) and job.ends_at(7, 2)
    assert job.ends_at(3, 1, until_steps=3) and job.ends_at(1, 1, until_epochs=1)


def test_the_user_s_order_is_checked_once_and_may_repeat_samples(tmp_path: Path) -> None:
    f = tmp_path / "job.py"
    f.write_text(HEAD + "    kw['order'] = lambda seed, epoch, n: [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]"
                 "\n    return Job(**kw)\n")
    job = load_job(str(f), 0)
    assert user_order(job, 0, 0, 10).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # weighted
    job.order = lambda seed, epoch, n: list(range(n - 1))
    with pytest.raises(JobError, match=r"Job.order\(0, 0, 10\) must return 10 integer"):
        user_order(job, 0, 0, 10)
    job.order = lambda seed, epoch, n: [x + 5 for x in range(n)]
    with pytest.raises(JobError, match="in range"):
        user_order(job, 0, 0, 10)


def test_indexed_shards_are_read_in_contiguous_chunks_and_each_record_once() -> None:
    shards = [list(range(s * 100, s * 100 + c)) for s, c in enumerate([40, 25, 35])]
    reads: list[tuple[int, int, int]] = []

    def read(shard: int, start: int, stop: int) -> list[int]:
        reads.append((shard, start, stop))
        return shards[shard][start:stop]

    ds = ShardedDataset([40, 25, 35], read, chunk=16)
    assert len(ds) == 100
    order = ds.order(0, 1, 100)
    assert sorted(order.tolist()) == list(range(100))
    assert order.tolist() != ds.order(0, 2, 100).tolist()  # a new shard order per epoch
    seen = []
    cursor = CursorState(1, 0)
    for _ in range(5):  # five steps of 20 samples over three members
        for share in split(order, cursor, [7, 7, 6]):
            seen += [ds[int(i)] for i in share]
        cursor = cursor.advance(100, 20)
    assert sorted(seen) == sorted(sum(shards, []))  # every record once
    assert len(reads) <= 12  # contiguous: about one read per chunk, not one per record


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_gpt_example_computes_its_own_loss_from_a_dict_batch(
        monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    """The GPT example as a worker profiles it: a dict batch, ``model(**batch)`` returning
    its loss, in slices of ``micro_batch``, under bf16 autocast when asked."""
    from trainer.collective.step import Stepper

    monkeypatch.setenv("GPT_PRECISION", precision)
    job = load_job("examples/gpt.py", 0)
    assert job.precision == precision and job.epochs == job.max_steps == 60
    batch = job.batch(torch.arange(12))
    assert set(batch) == {"idx", "targets"} and batch["idx"].shape == (12, 32)
    loss = Stepper.profile_step(job, batch, torch.device("cpu"), None)
    assert 4.0 < loss < 7.0  # about log(256): an untrained byte model
    assert all(p.grad is not None for p in job.model.parameters())
