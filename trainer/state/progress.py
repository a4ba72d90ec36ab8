"""Training progress: the one record of how far a job has come.

Design. A frozen :class:`Progress` holds the committed step, the data cursor (epoch and
position in that epoch's order, :class:`trainer.data.sampler.CursorState`), the samples
trained so far and the steps this worker computed that no member kept. It changes in one
way only, :meth:`Progress.advance` (one committed step of ``samples`` samples), which the
member skeleton calls on every commit of every mode; a state received from a peer or a
snapshot replaces it whole (:meth:`Progress.from_plain`). The steps lost stay with the
worker: they are not part of the training state that travels.

Rule for callers: never set a field; advance on a commit, or load a whole one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trainer.data.sampler import CursorState


@dataclass(frozen=True)
class Progress:
    """How far training has come (see the module docstring)."""

    step: int = 0
    cursor: CursorState = field(default_factory=CursorState)
    samples_done: int = 0
    lost_steps: int = 0  # steps this worker computed that no member kept (not sent on)

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    def advance(self, dataset_size: int, samples: int) -> Progress:
        """The progress after one committed step of ``samples`` samples (the data cursor
        moves by them, into the next epoch at an epoch's end)."""
        return replace(self, step=self.step + 1,
                       cursor=self.cursor.advance(dataset_size, samples),
                       samples_done=self.samples_done + samples)

    def lost(self, steps: int) -> Progress:
        """The same progress, with ``steps`` more steps computed and discarded."""
        return replace(self, lost_steps=self.lost_steps + max(0, steps))

    def to_plain(self) -> dict[str, Any]:
        """What travels in the training state: step, cursor, samples done."""
        return {"step": self.step, "cursor": [self.cursor.epoch, self.cursor.cursor],
                "samples_done": self.samples_done}

    def from_plain(self, d: Any) -> Progress:
        """The progress ``d`` holds (:meth:`to_plain`'s), keeping this worker's steps lost.
        Raises ``KeyError``, ``TypeError`` or ``ValueError`` when ``d`` is not one."""
        epoch, cursor = d["cursor"]
        return Progress(int(d["step"]), CursorState(int(epoch), int(cursor)),
                        int(d["samples_done"]), self.lost_steps)
