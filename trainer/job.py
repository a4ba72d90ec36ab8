"""The job interface: what a user's file gives the elastic loop, and how it is loaded.

Design: a job is a Python module (dotted name or a ``.py`` path) defining
``make_job(seed: int) -> Job``. :class:`Job` holds the model, the optimiser, the loss, the
training set (any map-style ``torch.utils.data.Dataset`` returning ``(x, y)``; batches are
made with torch's ``default_collate``, as a DataLoader makes them), the global batch size, the
number of epochs and an optional ``evaluate(model) -> dict`` of metrics (every one is
reported). Optional: ``precision`` (``fp32``, ``bf16`` or ``fp16`` autocast),
``min_local_batch`` (the fewest samples a member may compute: 2 by default for a model with
BatchNorm, else 1), ``loader_workers`` and ``collate_fn`` for the input pipeline, and
``on_finish(model)``, called on rank 0 with the trained model at the end. Every worker calls
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from trainer.errors import JobError


PRECISIONS = ("fp32", "bf16", "fp16")
MODES = ("ring", "pipeline", "hybrid")  # how the members train together (trainer.worker.modes)
#: ``Job.mode`` "auto": the mode the provisioner chose for the run (the worker's ``--mode``,
#: ``$SPOTRING_MODE``), else the ring.
AUTO = "auto"
#: The modes a provisioner may choose for a run (the pipeline mode needs the job's stage
#: settings, so only a job asks for it).
CHOSEN_MODES = ("ring", "hybrid")


def resolve_mode(job_mode: str, chosen: str, precision: str = "fp32") -> tuple[str, str]:
    """The mode a worker trains in, and why: the job's own when it names one; with ``auto``
    (the default) the provisioner's ``chosen`` mode (``ring`` or ``hybrid``: the pipeline
    mode needs the job's stage settings, so only a job asks for it), else the ring. A
    hybrid choice for an fp16 job falls back to the ring (the hybrid mode refuses fp16).
    Every member of a run resolves the same: the same job, the same launch environment."""
    if job_mode != AUTO:
        return job_mode, "the job's Job.mode"
    if chosen == "hybrid" and precision == "fp16":
        return "ring", "the provisioner chose hybrid, which refuses fp16: the ring"
    if chosen in CHOSEN_MODES:
        return chosen, "the provisioner's choice (--mode / $SPOTRING_MODE)"
    return "ring", "no mode chosen: the ring"


@dataclass
class Job:
    """A training job (see the module docstring). ``global_batch`` stays constant.

    ``evaluate(model)`` runs on rank 0 at each epoch end with the model on its device (use
    ``next(model.parameters()).device`` to place the data); it must leave the model as it
    found it or in eval mode (training mode is restored after it).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    train_set: Dataset
    global_batch: int
    epochs: int
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None
    precision: str = "fp32"
    min_local_batch: int | None = None
    loader_workers: int | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    on_finish: Callable[[torch.nn.Module], None] | None = None
    mode: str = AUTO  # ring (data parallel), pipeline (HetPipe virtual workers), hybrid, or
    # auto: the provisioner's choice for the run (resolve_mode)
    pipeline: Any = None  # the pipeline mode's settings (trainer.pipeline)
    hybrid: Any = None  # the hybrid mode's settings (trainer.hybrid)

    def __len__(self) -> int:
        return len(self.train_set)  # type: ignore[arg-type]

    @property
    def min_batch(self) -> int:
        """The fewest samples a member may be given (``min_local_batch``, else the model's
        default: 2 with BatchNorm, which needs more than one value per channel, else 1)."""
        if self.min_local_batch is not None:
            return self.min_local_batch
        from trainer.data.batching import default_min_batch

        return default_min_batch(self.model)

    def batch(self, ids: torch.Tensor) -> Any:
        """The collated batch of the sample ids ``ids`` (``default_collate`` semantics: a
        target of shape ``(1,)`` gives ``(b, 1)``), made in this thread."""
        ds = self.train_set
        if isinstance(ds, TensorDataset):
            return tuple(t[ids] for t in ds.tensors)
        collate = self.collate_fn or default_collate
        return collate([ds[int(i)] for i in ids])


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
    if job.mode not in (*MODES, AUTO):
        raise JobError(f"job {spec!r}: mode={job.mode!r}; use one of {', '.join(MODES)} or "
                       f"{AUTO!r}")
    if job.precision not in PRECISIONS:
        raise JobError(f"job {spec!r}: precision={job.precision!r}; use one of "
                       f"{', '.join(PRECISIONS)}")
    m = job.min_local_batch
    if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1
                          or m > job.global_batch):
        raise JobError(f"job {spec!r}: min_local_batch={m!r} must be an int from 1 to "
                       f"global_batch ({job.global_batch})")
    if job.min_batch > min(job.global_batch, len(job)):
        raise JobError(f"job {spec!r}: the minimum local batch is {job.min_batch} (a model with "
                       f"BatchNorm needs 2) but global_batch={job.global_batch} and the "
                       f"training set has {len(job)} samples; raise them or set "
                       "min_local_batch")
    w = job.loader_workers
    if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 0):
        raise JobError(f"job {spec!r}: loader_workers={w!r} must be an int >= 0")
    return job
