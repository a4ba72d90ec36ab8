"""``torch.distributed`` called by the job's code: a clear error naming the context.

Design. A worker never initialises torch's default process group: each generation has its
own group objects (``ProcessGroupGloo``/``ProcessGroupNCCL`` built directly), and the members
change at every generation. A training script's ``dist.get_rank()``, ``dist.all_reduce(t)``
or ``dist.init_process_group(...)`` therefore has no group to mean, and torch's own message
("Default process group has not been initialized") points nowhere useful. :func:`install`
replaces those module-level functions of ``torch.distributed`` with wrappers that raise
:class:`RuntimeError` naming the call and what to use instead (the context the job's hooks
get: ``ctx.rank``, ``ctx.world``; the ring reduces gradients itself). A call given an
explicit ``group`` goes through unchanged, and the trainer itself only uses group objects,
so its own collectives are untouched. ``is_initialized()`` keeps answering False (the usual
"am I distributed?" test of training scripts then takes the single-process branch).

Rule for callers: install before the job module is imported (``from torch.distributed import
get_rank`` then binds the wrapper); install once per process.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

#: The module-level calls that mean "the default group".
GUARDED = ("init_process_group", "destroy_process_group", "new_group", "get_rank",
           "get_world_size", "barrier", "all_reduce", "all_gather", "all_gather_into_tensor",
           "all_gather_object", "broadcast", "broadcast_object_list", "reduce",
           "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
           "scatter_object_list", "all_to_all", "all_to_all_single", "send", "recv", "isend",
           "irecv", "monitored_barrier")
_MARK = "__spotring_guard__"


def message(name: str) -> str:
    """The error a job's ``torch.distributed.<name>`` call raises."""
    return (f"torch.distributed.{name}() called by the job: a spotring worker has no default "
            "process group (the ring's members change at every generation and the ring "
            "reduces gradients itself). Use the context your hooks get instead "
            "(ctx.rank, ctx.world in Job.after_step / Job.on_step), and remove "
            "init_process_group, DistributedDataParallel and DistributedSampler from the job")


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    at = params.index("group") if "group" in params else None

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        if group is None and at is not None and len(args) > at:
            group = args[at]
        if group is not None and name not in ("init_process_group", "new_group"):
            return fn(*args, **kwargs)  # an explicit group: not the default one
        raise RuntimeError(message(name))

    setattr(guarded, _MARK, True)
    return guarded


def install() -> list[str]:
    """Replace :data:`GUARDED` in ``torch.distributed`` (idempotent). Returns the names."""
    done = []
    for name in GUARDED:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, _MARK, False):
            continue
        setattr(dist, name, _wrap(name, fn))
        done.append(name)
    return done
