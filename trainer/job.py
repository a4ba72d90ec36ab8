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

The user's code at defined points (issue 26), each honoured identically on every member:

* ``scheduler``: a torch LR scheduler of ``optimizer``; the ring steps it once per committed
  step, after ``optimizer.step()`` (never on a discarded step), or once per epoch end with
  ``scheduler_every="epoch"``; its ``state_dict()`` travels to joiners and into snapshots
  and is covered by the members' digests.
* ``extra_state``: ``{name: obj}`` of objects with ``state_dict()``/``load_state_dict()`` (an
  EMA, a counter, a curriculum): sent, snapshotted and digested like the model, encoded as
  tensors and plain data (never pickled).
* ``forward_loss(model, batch) -> loss`` for any batch (dicts, several inputs, a model that
  returns its loss); without it ``x, y = batch; loss_fn(model(x), y)``.
* ``grad_clip``: the global norm the reduced, unscaled gradients are clipped to.
* ``after_step(ctx)`` on every member after each commit (update an EMA here: what it writes
  survives); ``on_step(ctx)`` on rank 0 only, for logging (``ctx.run_id`` is stable across
  rank-0 changes). ``ctx`` is a :class:`StepContext`.
* ``eval_every_steps``: ``evaluate`` also every that many steps (besides each epoch end).
* ``micro_batch``: the most samples of one forward pass; a larger share is accumulated.
* ``order(seed, epoch, n)``: the sample order of an epoch (a sequence of ``n`` indices in
  ``range(n)``, repeats allowed: weighted, repeated augmentation, length-grouped), the same
  for the same arguments; each position is trained exactly once.
* ``max_steps``: end after that many committed steps (``epochs`` may then be left out).
* ``on_notice(seconds_left)``: runs on a thread of a member that got a notice.

Rule for callers: load the job (:func:`load_job`) *before* contacting the coordinator; a job
that fails to import or build raises :class:`JobError` naming the file and the fix, and the
ring never sees the worker. User code never calls ``torch.distributed``: the context it is
given names its rank and world.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset, default_collate

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


@dataclass(frozen=True)
class StepContext:
    """What the job's hooks are told after a commit (the same on every member but ``rank``).

    ``step``: the steps committed so far (this one included); ``epoch``: the epoch the next
    step trains; ``epoch_end``: this step ended an epoch; ``lr``: the first parameter group's
    learning rate for the next step; ``loss``: this step's global mean loss; ``run_id``: the
    run's id, stable across rank-0 changes and resumes; ``metrics``: the last evaluation's.
    """

    step: int
    epoch: int
    epoch_end: bool
    lr: float
    loss: float
    rank: int
    world: int
    samples_done: int
    run_id: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Job:
    """A training job (see the module docstring). ``global_batch`` stays constant.

    ``evaluate(model)`` runs on rank 0 at each epoch end (and every ``eval_every_steps``) with
    the model on its device (use ``next(model.parameters()).device`` to place the data); it
    must leave the model as it found it or in eval mode (training mode is restored after
    it). It runs on one member only: a change of learning rate, optimiser, scheduler or
    extra state inside it ends the run with a message (step schedulers in ``after_step``).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    train_set: Dataset = None  # type: ignore[assignment]
    global_batch: int = 0
    epochs: int = 0
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
    scheduler: Any = None  # a torch LR scheduler, stepped once per committed step
    scheduler_every: str = "step"  # or "epoch": stepped once at each epoch end instead
    extra_state: dict[str, Any] | None = None  # {name: obj with state_dict/load_state_dict}
    forward_loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None
    grad_clip: float | None = None
    after_step: Callable[[StepContext], None] | None = None
    on_step: Callable[[StepContext], None] | None = None
    eval_every_steps: int | None = None
    micro_batch: int | None = None
    order: Callable[[int, int, int], Any] | None = None
    max_steps: int | None = None
    on_notice: Callable[[float], None] | None = None

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



    def compute_loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The loss of ``batch``: ``forward_loss(model, batch)`` when the job gives one, else
        ``x, y = batch; loss_fn(model(x), y)``."""
        if self.forward_loss is not None:
            return self.forward_loss(model, batch)
        x, y = batch
        assert self.loss_fn is not None
        return self.loss_fn(model(x), y)

    def ends_at(self, step: int, epoch: int, *, until_steps: int | None = None,
                until_epochs: int | None = None) -> bool:
        """Is the job over once ``step`` steps are committed and the cursor is in ``epoch``?
        (``epochs``, ``max_steps`` and the run's ``--until-*`` limits, whichever comes first.)"""
        if epoch >= self.epochs or (until_epochs is not None and epoch >= until_epochs):
            return True
        limit = self.step_limit(until_steps)
        return limit is not None and step >= limit

    def step_limit(self, until_steps: int | None = None) -> int | None:
        """The committed steps after which the job ends by count: the first of ``max_steps``
        and the run's ``until_steps`` (None: it ends by epochs only)."""
        limits = [n for n in (self.max_steps, until_steps) if n is not None]
        return min(limits) if limits else None

    def lr(self) -> float:
        """The first parameter group's learning rate (what the context reports)."""
        return float(self.optimizer.param_groups[0].get("lr", 0.0))


def _positive_int(job: Job, spec: str, name: str) -> None:
    v = getattr(job, name)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise JobError(f"job {spec!r}: {name}={v!r} must be a positive int (or None)")


def _check_hooks(job: Job, spec: str) -> None:
    """The issue-26 fields of ``job`` (one line naming the field and the fix)."""
    for name in ("forward_loss", "after_step", "on_step", "order", "on_notice", "loss_fn"):
        v = getattr(job, name)
        if v is not None and not callable(v):
            raise JobError(f"job {spec!r}: {name}={v!r} must be callable (or None)")
    if job.loss_fn is None and job.forward_loss is None:
        raise JobError(f"job {spec!r}: give loss_fn(outputs, targets) or "
                       "forward_loss(model, batch) -> loss")
    for name in ("eval_every_steps", "micro_batch", "max_steps"):
        _positive_int(job, spec, name)
    c = job.grad_clip
    if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0):
        raise JobError(f"job {spec!r}: grad_clip={c!r} must be a positive number (or None)")
    sch = job.scheduler
    if sch is not None:
        if not all(callable(getattr(sch, a, None)) for a in ("step", "state_dict",
                                                             "load_state_dict")):
            raise JobError(f"job {spec!r}: scheduler={type(sch).__name__} is not a torch LR "
                           "scheduler (step, state_dict, load_state_dict)")
        if getattr(sch, "optimizer", job.optimizer) is not job.optimizer:
            raise JobError(f"job {spec!r}: scheduler schedules another optimizer than "
                           "Job.optimizer; build it on Job.optimizer")
    if job.scheduler_every not in ("step", "epoch"):
        raise JobError(f"job {spec!r}: scheduler_every={job.scheduler_every!r}; use 'step' "
                       "or 'epoch'")
    extra = job.extra_state
    if extra is not None:
        if not isinstance(extra, dict):
            raise JobError(f"job {spec!r}: extra_state must be a dict {{name: object}}")
        for k, v in extra.items():
            if not isinstance(k, str) or not all(
                    callable(getattr(v, a, None)) for a in ("state_dict", "load_state_dict")):
                raise JobError(f"job {spec!r}: extra_state[{k!r}] ({type(v).__name__}) needs "
                               "state_dict() and load_state_dict(); wrap it in an object that "
                               "has them")


def _check_dataset(job: Job, spec: str) -> None:
    ds = job.train_set
    if ds is None:
        raise JobError(f"job {spec!r}: train_set is missing; give a map-style Dataset")
    if isinstance(ds, IterableDataset) or not callable(getattr(ds, "__len__", None)):
        kind = "an IterableDataset" if isinstance(ds, IterableDataset) else \
            f"a {type(ds).__name__} without __len__"
        raise JobError(f"job {spec!r}: train_set is {kind}; exactly-once data needs a "
                       "map-style Dataset (__len__ and __getitem__): index your shards "
                       "(trainer.data.shards.ShardedDataset) or materialise the stream")


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
    _check_dataset(job, spec)
    _check_hooks(job, spec)
    if job.epochs == 0 and job.max_steps is not None:
        job.epochs = job.max_steps  # every epoch has at least one step: an upper bound
    if not isinstance(job.global_batch, int) or job.global_batch <= 0:
        raise JobError(f"job {spec!r}: global_batch={job.global_batch!r} must be a positive int")
    if not isinstance(job.epochs, int) or job.epochs <= 0:
        raise JobError(f"job {spec!r}: epochs={job.epochs!r} must be a positive int (or set "
                       "max_steps)")
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
