"""The training state a worker holds: assembled, sent, loaded and checked in one place.

Design. :class:`TrainingState` is everything that must be equal on every member after a
commit and travel to a joiner or into a durable snapshot: the model's parameters and
buffers, the optimiser, the loss scaler, the :class:`~trainer.state.progress.Progress`
(step, data cursor, samples done), the batch planner's speed model and sizes, the last
evaluation's metrics and the RNG states, plus the job's fingerprint. :meth:`to_tree` builds
the tree (tensors and plain data: :mod:`trainer.state.codec` encodes it without pickle) and
:meth:`load` takes one back after checking it fits this job; :meth:`meta` and
:meth:`load_meta` are the plain part alone (a pipeline stage sends its layers with it);
:meth:`checksum` digests what must be bitwise equal on every member. Anything a later change
adds to what travels (an LR scheduler, the user's extra state) is added here, once, and
reaches every training mode, every joiner and every snapshot.

Rule for callers: read and replace :attr:`progress` whole; build the tree only when it is
sent (it is the live tensors, not copies: :func:`trainer.state.snapshot.host_copy` copies).
"""

from __future__ import annotations

import random
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


class TrainingState:
    """What a member holds and sends (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler | None, fingerprint: str) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.fingerprint = fingerprint
        self.progress = Progress()
        self.speed = batching.SpeedModel()  # the batch planner's model of every member
        self.sizes: dict[str, int] = {}  # the local batches it gave, by member key
        self.metrics: dict[str, float] = {}  # the last evaluation's

    def to_tree(self) -> dict[str, Any]:
        """The whole state as tensors and plain data (live tensors, not copies)."""
        return {
            "job": self.fingerprint,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            **self.progress.to_plain(),
            "rng": rng_state(),
            "speed": batching.speed_to_plain(self.speed),
            "sizes": dict(self.sizes),
            "metrics": dict(self.metrics),
        }

    def load(self, tree: dict[str, Any]) -> None:
        """Load a state received from a peer or a snapshot, after checking it fits this job's
        model (names, shapes, dtypes). Raises :class:`trainer.errors.BadState`."""
        codec.check_like(tree.get("model"), self.model.state_dict(), "the model state received")
        try:
            self.model.load_state_dict(tree["model"])
            self.optimizer.load_state_dict(tree["optimizer"])
            if self.scaler is not None and tree.get("scaler"):
                self.scaler.load_state_dict(tree["scaler"])
            self.progress = self.progress.from_plain(tree)
            set_rng_state(tree["rng"])
            self.speed = batching.speed_from_plain(tree["speed"])
            self.sizes = {str(k): int(v) for k, v in tree["sizes"].items()}
            self.metrics = _metrics(tree.get("metrics"))
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise BadState(f"the state received does not fit this job: {e}") from e

    def meta(self) -> dict[str, Any]:
        """The plain part of the state a pipeline stage's layers travel with: the job,
        progress and metrics."""
        return {"job": self.fingerprint, **self.progress.to_plain(),
                "metrics": dict(self.metrics)}

    def load_meta(self, meta: dict[str, Any]) -> None:
        """Take the progress and metrics of :meth:`meta`'s output. Raises ``KeyError``,
        ``TypeError`` or ``ValueError`` when it is not one."""
        self.progress = self.progress.from_plain(meta)
        self.metrics = _metrics(meta.get("metrics"))

    def checksum(self) -> str:
        """Digest of the parameters, buffers and optimiser state: equal on every member."""
        return codec.checksum(self.model, self.optimizer.state_dict())


def _metrics(d: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (d or {}).items()}
