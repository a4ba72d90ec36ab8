"""The training modes: how the members of a generation train together, one per ``Job.mode``.

Design. Every mode shares the worker (load, profile, join), the coordinator's protocol
(admission, generations, drains, reports, snapshots) and the member skeleton
(:class:`trainer.worker.member.Member`: wait, form, step, commit, leave); a mode is the small
strategy the skeleton calls (:class:`~trainer.worker.modes.base.Mode`): how the state
reaches the members that lack it, what a step computes, how it reduces. ``ring``
(:mod:`.ring`: data parallel, heterogeneity-aware batches), ``pipeline`` (:mod:`.pipeline`:
HetPipe virtual workers, on the machinery of :mod:`trainer.pipeline`) and ``hybrid``
(:mod:`.hybrid`: all-reduce inside a zone, parameter servers across zones, on
:mod:`trainer.hybrid`). A mode's module is imported only when a job trains in it.

Rule for callers: :func:`mode_class` names the class; the skeleton builds it with itself.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainer.errors import JobError

_CLASSES = {
    "ring": ("trainer.worker.modes.ring", "RingMode"),
    "pipeline": ("trainer.worker.modes.pipeline", "PipelineMode"),
    "hybrid": ("trainer.worker.modes.hybrid", "HybridMode"),
}


def mode_class(mode: str) -> Any:
    """The :class:`~trainer.worker.modes.base.Mode` class of ``mode``. Raises
    :class:`trainer.errors.JobError` for an unknown or unavailable mode."""
    if mode not in _CLASSES:
        raise JobError(f"mode {mode!r}: expected one of {', '.join(_CLASSES)}")
    module, name = _CLASSES[mode]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise JobError(f"mode {mode!r} is not available in this installation ({e})") from e
