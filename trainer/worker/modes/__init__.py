"""Which member class trains a job: one per training mode, chosen by ``Job.mode``.

Design: every mode shares the worker (load, profile, join), the coordinator's protocol
(admission, generations, drains, reports, snapshots) and the state transfer; they differ in
what a member does inside a generation. ``ring`` is :class:`trainer.worker.member.Member` (data
parallel, heterogeneity-aware batches); ``pipeline`` (HetPipe virtual workers) and ``hybrid``
(all-reduce inside a zone, parameter servers across zones) live in their own packages and
subclass it, so each is a room of its own.

Rule for callers: a member class takes ``(worker, store, member_id, heartbeat)`` and its
``live()`` returns a :class:`trainer.worker.member.Outcome`.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainer.errors import JobError

_CLASSES = {
    "ring": ("trainer.worker.member", "Member"),
    "pipeline": ("trainer.worker.modes.pipeline", "PipelineMember"),
    "hybrid": ("trainer.worker.modes.hybrid", "HybridMember"),
}


def member_class(mode: str) -> Any:
    """The member class of ``mode``. Raises :class:`trainer.errors.JobError` for an unknown or
    unavailable mode."""
    if mode not in _CLASSES:
        raise JobError(f"mode {mode!r}: expected one of {', '.join(_CLASSES)}")
    module, name = _CLASSES[mode]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise JobError(f"mode {mode!r} is not available in this installation ({e})") from e
