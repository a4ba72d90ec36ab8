"""The ring mode's step in flight: what it hands the worker when its membership is dropped
(the ring itself runs in tests/trainer/worker/test_ring.py)."""

from __future__ import annotations

from types import SimpleNamespace

from trainer.worker.modes.base import Unsettled, step_kept
from trainer.worker.modes.ring import RingMode


def test_a_step_in_flight_is_handed_over_unless_its_share_is_empty() -> None:
    ring = RingMode(SimpleNamespace(id=6))  # type: ignore[arg-type]
    assert ring.unsettled() is None  # nothing in flight
    ring.pending = Unsettled(9, 6, 12, 3, ())
    assert ring.unsettled() is None  # an empty share: nothing to record
    ring.pending = Unsettled(9, 6, 12, 3, (4, 7))
    assert ring.unsettled() == Unsettled(9, 6, 12, 3, (4, 7))


def test_a_step_counts_only_when_the_state_agreed_next_is_the_step_after_it() -> None:
    assert step_kept(12, 13)
    assert not step_kept(12, 12)  # discarded: computed again
    assert not step_kept(12, 4)   # a snapshot older than it was resumed
