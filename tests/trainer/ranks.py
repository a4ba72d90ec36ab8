"""Ranks as threads: a collective test's members in one process, over one store.

Design: :func:`on_ranks` runs ``fn(rank)`` for each rank on a thread of its own (a gloo
collective needs every rank inside it at once), waits for them and returns each rank's
result; any rank's exception fails the test with every rank's error.

Rule for callers: ``fn`` forms its own group (e.g. ``trainer.pipeline.local._gloo`` over a
``PrefixStore`` of one shared ``HashStore``) with a timeout, so a rank that fails cannot keep
the others waiting past it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_ranks(fn: Callable[[int], T], world: int, timeout_s: float = 60.0) -> dict[int, T]:
    """``{rank: fn(rank)}`` with every rank run at once; raises AssertionError naming the
    errors when a rank failed or did not finish in ``timeout_s``."""
    out: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not errors and len(out) == world, errors or f"ranks {sorted(out)} of {world} done"
    return out
