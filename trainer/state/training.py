"""The training state a worker holds: assembled, sent, loaded and checked in one place.

Design. :class:`TrainingState` is everything that must be equal on every member after a
commit and travel to a joiner or into a durable snapshot: the model's parameters and
buffers, the optimiser, the loss scaler, the job's LR scheduler and extra state (each a
``state_dict()``), the :class:`~trainer.state.progress.Progress` (step, data cursor,
samples done), the batch planner's speed model and sizes, the last evaluation's metrics and
its step, the RNG states, the run's id, plus the job's fingerprint. :meth:`to_tree` builds
the tree (tensors and plain data: :mod:`trainer.state.codec` encodes it without pickle) and
:meth:`load` takes one back after checking it fits this job; :meth:`meta` and
:meth:`load_meta` are the plain part alone (a pipeline stage sends its layers with it);
:meth:`digests` digests what must be bitwise equal on every member, one digest per part
(parameters, buffers, optimiser, scheduler, extra state), so a mismatch names what differs;
:meth:`checksum` joins them in one string (:func:`differing` reads two back). Anything added
to what travels is added here, once, and reaches every training mode, every joiner and
every snapshot.

Rule for callers: read and replace :attr:`progress` whole; build the tree only when it is
sent (it is the live tensors, not copies: :func:`trainer.state.snapshot.host_copy` copies).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trainer.data import batching
from trainer.errors import BadState
from trainer.state import codec
from trainer.state.progress import Progress


def rng_state() -> dict[str, Any]:
    """The process's RNG states (python, numpy, torch CPU, and CUDA when it is in use)."""
    out: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (a CUDA state only where CUDA is in use)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])


#: The parts of the state the members' digests cover, in the order of :meth:`checksum`.
PARTS = ("parameters", "buffers", "optimizer", "scheduler", "extra")


class TrainingState:
    """What a member holds and sends (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler | None, fingerprint: str, *,
                 scheduler: Any = None, extra: Mapping[str, Any] | None = None) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.scheduler = scheduler
        self.extra: dict[str, Any] = dict(extra or {})
        self.fingerprint = fingerprint
        self.progress = Progress()
        self.speed = batching.SpeedModel()  # the batch planner's model of every member
        self.sizes: dict[str, int] = {}  # the local batches it gave, by member key
        self.metrics: dict[str, float] = {}  # the last evaluation's
        self.metrics_step = -1  # the step of the last evaluation (-1: none yet)
        self.run_id = uuid.uuid4().hex[:16]  # the first generation takes rank 0's

    def to_tree(self) -> dict[str, Any]:
        """The whole state as tensors and plain data (live tensors, not copies)."""
        return {
            "job": self.fingerprint,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "extra": {k: v.state_dict() for k, v in self.extra.items()},
            **self.progress.to_plain(),
            "rng": rng_state(),
            "speed": batching.speed_to_plain(self.speed),
            "sizes": dict(self.sizes),
            "metrics": dict(self.metrics),
            "metrics_step": self.metrics_step,
            "run_id": self.run_id,
        }

    def load(self, tree: dict[str, Any]) -> None:
        """Load a state received from a peer or a snapshot, after checking it fits this job's
        model (names, shapes, dtypes), scheduler and extra state. Raises
        :class:`trainer.errors.BadState`."""
        codec.check_like(tree.get("model"), self.model.state_dict(), "the model state received")
        if (tree.get("scheduler") is None) != (self.scheduler is None):
            raise BadState("the state received " + ("has no LR scheduler, this job has one"
                                                    if self.scheduler is not None else
                                                    "has an LR scheduler, this job has none"))
        extra = tree.get("extra") or {}
        if not isinstance(extra, dict) or sorted(extra) != sorted(self.extra):
            raise BadState(f"the state received holds extra state {sorted(extra)!r}, this job "
                           f"{sorted(self.extra)!r}")
        try:
            self.model.load_state_dict(tree["model"])
            self.optimizer.load_state_dict(tree["optimizer"])
            if self.scaler is not None and tree.get("scaler"):
                self.scaler.load_state_dict(tree["scaler"])
            if self.scheduler is not None:
                self.scheduler.load_state_dict(tree["scheduler"])
            for k, obj in self.extra.items():
                obj.load_state_dict(extra[k])
            self.progress = self.progress.from_plain(tree)
            set_rng_state(tree["rng"])
            self.speed = batching.speed_from_plain(tree["speed"])
            self.sizes = {str(k): int(v) for k, v in tree["sizes"].items()}
            self.metrics = _metrics(tree.get("metrics"))
            self.metrics_step = int(tree.get("metrics_step", -1))
            if isinstance(tree.get("run_id"), str) and tree["run_id"]:
                self.run_id = tree["run_id"][:64]
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise BadState(f"the state received does not fit this job: {e}") from e

    def load_checkpoint(self, parts: dict[str, Any], *, dataset_size: int,
                        global_batch: int) -> list[str]:
        """Start from a user's checkpoint (:func:`trainer.state.export.checkpoint_parts`):
        the model (its names, shapes and dtypes checked), and whichever of the optimiser,
        scheduler, extra states, step, epoch and cursor it holds (a checkpoint with an epoch
        and no step counts that many whole epochs of steps). Returns what was loaded.
        Raises :class:`trainer.errors.BadState` naming the part."""
        loaded = ["model"]
        codec.check_like(parts["model"], self.model.state_dict(), "the checkpoint's model")
        try:
            self.model.load_state_dict(parts["model"])
            for name, obj in (("optimizer", self.optimizer), ("scheduler", self.scheduler)):
                if obj is not None and isinstance(parts.get(name), dict):
                    obj.load_state_dict(parts[name])
                    loaded.append(name)
            for k, sd in parts.get("extra", {}).items():
                if k in self.extra:
                    self.extra[k].load_state_dict(sd)
                    loaded.append(f"extra_state[{k!r}]")
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise BadState(f"the checkpoint's {loaded[-1] if loaded else 'model'} does not fit "
                           f"this job: {str(e).splitlines()[0]}") from e
        epoch, step = parts.get("epoch"), parts.get("step")
        if epoch is not None or step is not None:
            per_epoch = -(-dataset_size // global_batch)
            epoch_i = int(epoch) if epoch is not None else int(step) // per_epoch
            step_i = int(step) if step is not None else epoch_i * per_epoch
            cursor = int(parts.get("cursor", 0)) if step is None or epoch is not None else (
                (int(step) % per_epoch) * global_batch)
            samples = int(parts.get("samples_done", epoch_i * dataset_size + cursor))
            if step_i < 0 or epoch_i < 0 or not 0 <= cursor < max(1, dataset_size):
                raise BadState(f"the checkpoint's step {step_i}, epoch {epoch_i}, cursor "
                               f"{cursor} are out of range")
            self.progress = self.progress.from_plain({"step": step_i, "cursor": [epoch_i, cursor],
                                                      "samples_done": samples})
            loaded.append(f"step {step_i} (epoch {epoch_i}, cursor {cursor})")
        return loaded

    def meta(self) -> dict[str, Any]:
        """The plain part of the state a pipeline stage's layers travel with: the job,
        progress, metrics and run id; with a scheduler, its state and the hyperparameters it
        sets in the optimiser's groups (``lr``, momentum, ...: a stage's layers carry only
        their per-parameter optimiser state, so these travel here, as the progress does)."""
        out: dict[str, Any] = {"job": self.fingerprint, **self.progress.to_plain(),
                               "metrics": dict(self.metrics),
                               "metrics_step": self.metrics_step, "run_id": self.run_id}
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.state_dict()
            out["groups"] = [{k: list(v) if isinstance(v, tuple) else v
                              for k, v in g.items()
                              if k != "params" and isinstance(v, (int, float, tuple))}
                             for g in self.optimizer.param_groups]
        return out

    def load_meta(self, meta: dict[str, Any]) -> None:
        """Take what :meth:`meta` returned: the progress, metrics and run id, and the
        scheduler's state and the optimiser's group hyperparameters when this job has a
        scheduler. Raises ``KeyError``, ``TypeError`` or ``ValueError`` when it is not one
        (the scheduler's part is checked before anything of it loads)."""
        progress = self.progress.from_plain(meta)
        metrics = _metrics(meta.get("metrics"))
        metrics_step = int(meta.get("metrics_step", -1))
        if self.scheduler is not None:
            groups = meta["groups"]
            if not isinstance(groups, list) or len(groups) != len(self.optimizer.param_groups):
                raise ValueError(f"{len(groups) if isinstance(groups, list) else groups!r} "
                                 f"parameter groups, not {len(self.optimizer.param_groups)}")
            self.scheduler.load_state_dict(meta["scheduler"])
            for g, got in zip(self.optimizer.param_groups, groups, strict=True):
                for k, v in got.items():
                    g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
        self.progress, self.metrics, self.metrics_step = progress, metrics, metrics_step
        if isinstance(meta.get("run_id"), str) and meta["run_id"]:
            self.run_id = meta["run_id"][:64]

    def digests(self) -> dict[str, str]:
        """One digest per part of :data:`PARTS`: equal on every member after a commit."""
        sch = self.scheduler.state_dict() if self.scheduler is not None else None
        return {
            "parameters": codec.checksum(*self.model.parameters()),
            "buffers": codec.checksum(*self.model.buffers()),
            "optimizer": codec.checksum(self.optimizer.state_dict()),
            "scheduler": codec.checksum(sch)[:8] if sch is not None else "-",
            "extra": codec.checksum({k: v.state_dict() for k, v in self.extra.items()})[:8]
            if self.extra else "-",
        }

    def checksum(self) -> str:
        """The digests of every part in one string (``part:digest ...``, at most 128
        characters): equal on every member."""
        d = self.digests()
        return " ".join(f"{k}:{d[k][:12]}" for k in PARTS)


def differing(a: str, b: str) -> list[str]:
    """The parts two :meth:`TrainingState.checksum` strings disagree on (every part named
    when either is not one, e.g. a pipeline stage's digest)."""
    def parts(s: str) -> dict[str, str]:
        return dict(p.split(":", 1) for p in s.split() if ":" in p)

    pa, pb = parts(a), parts(b)
    if set(pa) != set(PARTS) or set(pb) != set(PARTS):
        return [] if a == b else ["state"]
    return [k for k in PARTS if pa[k] != pb[k]]


#: The likely cause of each part differing between members, for the message that ends the run.
CAUSES = {
    "scheduler": "an LR scheduler stepped outside the ring's step (e.g. scheduler.step() in "
                 "evaluate, which runs on rank 0 only): give it to Job.scheduler",
    "optimizer": "the optimiser (its learning rate or state) changed outside the ring's step "
                 "(e.g. in evaluate or on_step, which run on rank 0 only): change it in "
                 "Job.after_step or through Job.scheduler",
    "extra": "extra state updated differently on the members: update it in Job.after_step "
             "from the committed model, never from a member's own batch",
    "buffers": "a buffer changed outside the ring's step (e.g. evaluate in training mode, or "
               "code that writes buffers on one member)",
    "parameters": "parameters changed outside the ring's step (e.g. in evaluate or on_step, "
                  "which run on rank 0 only)",
    "state": "the training state changed outside the ring's step",
}


def divergence_message(parts: list[str], where: str) -> str:
    """The one message that ends a run whose members differ in ``parts`` (pure)."""
    first = next((p for p in ("scheduler", "optimizer", "extra", "buffers", "parameters")
                  if p in parts), "state")
    return (f"the members' training state differs {where} ({', '.join(parts)}); likely cause: "
            f"{CAUSES[first]}")


def _metrics(d: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (d or {}).items()}
