"""What a training mode is to the member skeleton: the :class:`Mode` verbs and what a mode
hands back (:class:`Transferred`, :class:`Commit`, :class:`Duties`).

Design (torchft's ``Manager`` with the train loop outside it; torch elastic's one executor).
The skeleton (:class:`trainer.worker.member.Member`) owns the life of a membership: the plan
loop, forming the generation's group, the formed and done reports, the drains, the failure
report, the commit bookkeeping (progress advanced only on a commit), the metrics record, the
rank-0 duties (evaluation, durable snapshots, the export of the trained model, the progress
report) and the sample records. A mode owns only what differs between the ways members
train together:

* :meth:`Mode.transfer_state` how the newest state reaches the members that lack it
  (the ring: one source sends the whole state; the pipeline: stage layers move between
  virtual workers),
* :meth:`Mode.prepare` the machinery of a generation (buckets, stage runners, zone groups),
* :meth:`Mode.step` what one step computes and how it reduces; every update it applies is
  handed to :meth:`trainer.worker.member.Member.commit` as a :class:`Commit`,
* :meth:`Mode.whole_model` where the whole model is for the rank-0 duties (the pipeline
  gathers its stages on its head), and :meth:`Mode.checksum` of the state all hold.

A behaviour added to the skeleton (a hook after each commit, a new duty, state that
travels) therefore reaches every mode without a copy.

Rule for callers: a mode is built with its member (``Mode(member)``) once per membership;
the skeleton calls ``problem`` once, then per generation ``transfer_state``, ``prepare``,
``checksum``, then ``step`` until the generation ends, ``drop`` when it ends or breaks,
``unsettled`` when the membership is dropped, and ``close`` when the membership ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Duties:
    """Rank-0 duties after a commit that need the whole model: a durable snapshot, the
    export of the trained model. (Evaluation is due at every epoch end, known to all.)"""

    snapshot: bool = False
    export: bool = False

    def __bool__(self) -> bool:
        return self.snapshot or self.export


@dataclass(frozen=True)
class Transferred:
    """How a generation's state agreement went for this member: steps it had computed that
    no member kept (reported as lost), the rank it received from, the bytes moved."""

    lost: int = 0
    source: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class Commit:
    """One update applied on this member, identically on every member that holds it.

    ``samples``: the step's global samples (the data cursor moves by them); ``loss``: the
    global batch's mean loss; ``ids``: this member's samples of the step, recorded under its
    own id (empty: nothing to record here); ``record``: the mode's fields of the metrics
    line (batch, timings, ...); ``duties``: the rank-0 duties agreed in the step's reduction
    (None: the head decides them now, alone); ``quiet``: a commit replayed while forming
    (the pipeline rolling forward): counted and recorded, no metrics line, no duties.
    """

    samples: int
    loss: float = 0.0
    ids: Sequence[int] = ()
    record: Mapping[str, Any] = field(default_factory=dict)
    duties: Duties | None = None
    quiet: bool = False


@dataclass(frozen=True)
class Unsettled:
    """A step this member computed in ``generation`` whose fate it has not learned (in
    flight, or broken: a peer may have completed it); the worker keeps it when the
    membership is dropped before it learns. ``member``: the id it computed it under;
    ``ids``: its samples of the step."""

    generation: int
    member: int
    step: int
    epoch: int
    ids: tuple[int, ...] = ()


def step_kept(step: int, agreed: int) -> bool:
    """Did a step in flight when its generation broke complete on a peer? It did when the
    state the next generation to form agreed on is the step after it (the ring keeps its
    update and its samples count); otherwise it was discarded."""
    return agreed == step + 1


def lacking(job: Any, fields: Sequence[str], mode: str) -> str | None:
    """One line naming the first of ``fields`` the job sets (not None) that ``mode`` cannot
    honour, with the fix; None when it sets none of them."""
    for name in fields:
        if getattr(job, name, None) is not None:
            return (f"Job.{name} is not supported in the {mode} mode yet; leave it out or use "
                    "the ring (Job.mode='ring')")
    return None


#: The job's fields a pipeline of stages cannot honour (each stage holds only its layers).
PIPELINE_LACKS = ("extra_state", "after_step", "forward_loss")
#: The job's fields the hybrid mode with staleness > 0 cannot honour (none: every replica
#: clips each update as it applies it).
HYBRID_LACKS: tuple[str, ...] = ()


class Mode(Protocol):
    """A training mode plugged into the member skeleton (see the module docstring)."""

    def problem(self) -> str | None:
        """Why this job cannot train in this mode (one line naming the field), or None."""
        ...

    def transfer_state(self) -> Transferred:
        """After the generation's group formed: agree on the newest state and bring it to
        the members that lack it. Raises :class:`trainer.errors.GenerationBroken` and
        :class:`trainer.errors.StateLost`."""
        ...

    def prepare(self) -> int:
        """Build this generation's machinery; returns the steps lost besides the transfer's."""
        ...

    def is_head(self) -> bool:
        """Does this member act for the ring (rank 0; the pipeline's head)?"""
        ...

    def step(self) -> int:
        """Run one step (a wave, a round); commit what it applied through the member.
        Returns the newest generation any member saw (the current one to go on). Raises
        :class:`trainer.errors.GenerationBroken` and :class:`trainer.errors.JobCodeError`."""
        ...

    def epoch_ended(self, epoch: int) -> None:
        """Epoch ``epoch`` was just committed (the job's per-epoch scheduler stepped), before
        the head evaluates: the ring compares every member's digests here, so the others do
        not wait for the evaluation. Raises :class:`trainer.errors.Diverged` and
        :class:`trainer.errors.GenerationBroken`."""
        ...

    def whole_model(self) -> AbstractContextManager[bool]:
        """A context in which the whole model and optimiser state are on the head; yields
        whether this member is the head. Entered by every member that takes part."""
        ...

    def checksum(self) -> str:
        """Digest of the state this member holds (a collective in the pipeline mode)."""
        ...

    def describe(self) -> str:
        """What this member holds in the generation, for the formed log line ("": the
        whole model)."""
        ...

    def drop(self) -> None:
        """The generation ended or broke: free its groups and machinery."""
        ...

    def unsettled(self) -> Unsettled | None:
        """The step in flight when the membership was dropped, if any (see
        :class:`Unsettled`; the worker settles it once it is a member again)."""
        ...

    def close(self) -> None:
        """The membership ended."""
        ...
