"""The job interface: what a user's file gives the elastic loop, and how it is loaded.

Design: a job is a Python module (dotted name or a ``.py`` path) defining
``make_job(seed: int) -> Job``. :class:`Job` holds the model, the optimiser, the loss, the
training set (any indexable ``torch.utils.data.Dataset`` returning ``(x, y)``; a
``TensorDataset`` is sliced directly), the global batch size, the number of epochs and an
optional ``evaluate(model) -> dict`` (e.g. ``{"accuracy": 0.97}``). Every worker calls
``make_job`` with the same seed, so all start from the same weights; the ring still sends a
peer's state to every joiner, so a job need not be deterministic for correctness.

Rule for callers: load the job (:func:`load_job`) *before* contacting the coordinator; a job
that fails to import or build raises :class:`JobError` naming the file and the fix, and the
ring never sees the worker.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset


class JobError(Exception):
    """The job module cannot be imported or ``make_job`` fails or returns something wrong."""


@dataclass
class Job:
    """A training job (see the module docstring). ``global_batch`` stays constant."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    train_set: Dataset
    global_batch: int
    epochs: int
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None

    def __len__(self) -> int:
        return len(self.train_set)  # type: ignore[arg-type]

    def batch(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(x, y)`` tensors of the sample ids ``ids``."""
        ds = self.train_set
        if isinstance(ds, TensorDataset):
            x, y = ds.tensors[0], ds.tensors[1]
            return x[ids], y[ids]
        items: Sequence[Any] = [ds[int(i)] for i in ids]
        xs, ys = zip(*items, strict=True)
        return torch.stack([torch.as_tensor(x) for x in xs]), torch.as_tensor(ys)


def _import(spec: str) -> Any:
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise JobError(f"job file {spec!r} does not exist; pass a .py path or a module name")
        name = f"spotring_job_{path.stem}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise JobError(f"job file {spec!r} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def load_job(spec: str, seed: int) -> Job:
    """Import ``spec`` (module name or ``.py`` path) and build its job with ``make_job(seed)``.

    Returns the :class:`Job`. Raises :class:`JobError` with the file, the cause and the fix
    when the import fails, ``make_job`` is missing or raises, or the result is invalid.
    """
    try:
        module = _import(spec)
    except JobError:
        raise
    except Exception as e:  # noqa: BLE001 - any import failure becomes one clear error
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        raise JobError(f"job {spec!r} failed to import: {tb}; fix the job file") from e
    make = getattr(module, "make_job", None)
    if not callable(make):
        raise JobError(f"job {spec!r} defines no make_job(seed) -> trainer.job.Job function")
    try:
        job = make(seed)
    except Exception as e:  # noqa: BLE001
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        raise JobError(f"job {spec!r}: make_job({seed}) raised {tb}; fix the job file") from e
    if not isinstance(job, Job):
        raise JobError(
            f"job {spec!r}: make_job returned {type(job).__name__}, expected trainer.job.Job"
        )
    if not isinstance(job.global_batch, int) or job.global_batch <= 0:
        raise JobError(f"job {spec!r}: global_batch={job.global_batch!r} must be a positive int")
    if not isinstance(job.epochs, int) or job.epochs <= 0:
        raise JobError(f"job {spec!r}: epochs={job.epochs!r} must be a positive int")
    if len(job) <= 0:
        raise JobError(f"job {spec!r}: the training set is empty")
    return job
