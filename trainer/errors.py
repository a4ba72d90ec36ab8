"""Every exception the trainer raises on purpose: one tree, one module.

Design. One base class, :class:`TrainerError`, and one subclass per thing that can go wrong,
grouped by who must act (httpx's ``_exceptions.py``; the house rule of one exception module
per package). A module raises these and never defines its own, so a caller catches a failure
by one name wherever it was raised, and ``tests/trainer/test_architecture.py`` can check that
no two classes of the trainer share a name. Where a caller outside the trainer already
catches a built-in kind (``ValueError`` for bad input, ``RuntimeError`` for what torch's C++
side raises through a Python store), the class keeps that kind as a second base.

The tree::

    TrainerError
    +-- JobError             the job file or its settings: fix the job (before training)
    +-- JobCodeError         the job's own code raised while training: fix the job
    +-- Diverged             the members' training states differ: the run is wrong, it ends
    +-- OutOfMemory          a member's forward/backward ran out of memory: the step is
                             discarded everywhere and computed again in smaller slices
    +-- DeviceError          a --device this host cannot give
    +-- FeedError            the input pipeline cannot deliver
    +-- ControlLost          the coordinator's connection broke
    |   +-- TokenRefused     ... because the coordinator refused this token (also AuthError)
    +-- ControlTimeout       a blocking store call outlived its timeout
    +-- CoordinatorUnreachable  no coordinator within the connect budget
    +-- JoinRefused          the coordinator refused this worker, or the job is over
    +-- AuthError            a handshake or a frame failed its check
    +-- Malformed            bytes that are not the message or frame they claim to be
    +-- GenerationBroken     a collective or a group's forming failed: the step is discarded
    +-- StateLost            training state no member holds and no snapshot restores
    +-- ExchangeError        a cross-zone exchange peer broke the rules (hybrid mode)
    +-- LayoutError          a model that cannot be cut into stages (pipeline mode)
    +-- BadState             bytes that are not a training state, or one of another job
    +-- SnapshotError        a durable snapshot cannot be stored, found or read

Rule for callers: raise and catch these by name from this module; add a new failure here,
under the parent whose handling it needs.
"""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every exception the trainer raises on purpose."""


# -- the job: the user must fix it ------------------------------------------------------------


class JobError(TrainerError):
    """The job module cannot be imported or ``make_job`` fails or returns something wrong."""


class JobCodeError(TrainerError):
    """The job's own code (forward, loss, backward, dataset, evaluate) raised; the run cannot
    go on as is. ``stage`` says which, ``step`` and ``batch`` where."""

    def __init__(self, stage: str, step: int, batch: int, exc: BaseException) -> None:
        self.stage, self.step, self.batch, self.exc = stage, step, batch, exc
        first = (str(exc).splitlines() or [""])[0][:300]
        hint = ""
        if "more than 1 value per channel" in str(exc):
            hint = " (BatchNorm needs at least 2 samples: set Job.min_local_batch)"
        super().__init__(f"the job's {stage} raised {type(exc).__name__}: {first}{hint} at "
                         f"step {step} with a local batch of {batch}; fix the job")


class Diverged(TrainerError):
    """The members' digests differ (parameters, buffers, optimiser, scheduler, extra state):
    the message names what differs and the likely cause. The run ends; it is never trained on
    silently."""


class OutOfMemory(TrainerError):  # noqa: N818 - the name the user reads
    """A forward or backward pass ran out of device memory with ``samples`` in one slice."""

    def __init__(self, samples: int) -> None:
        super().__init__(f"out of memory with {samples} samples in one forward pass")
        self.samples = samples


# -- the worker's host ---------------------------------------------------------------------------


class DeviceError(TrainerError, ValueError):
    """A ``--device`` this host cannot give (the message names the flag and the fix)."""


class FeedError(TrainerError, RuntimeError):
    """The input pipeline cannot deliver: a worker died, the loader failed, a wait timed out,
    or the feed is closed. The message says which and what to do."""


# -- the coordinator and its control store -----------------------------------------------------


class ControlLost(TrainerError, RuntimeError):
    """The control connection broke, or the coordinator refused (or failed) the handshake."""


class ControlTimeout(TrainerError, RuntimeError):
    """A blocking ``get``/``wait`` did not see its keys within the timeout."""


class CoordinatorUnreachable(TrainerError):
    """The coordinator did not answer within the connect budget (or stopped answering)."""


class JoinRefused(TrainerError):
    """The coordinator refused this worker (wrong token, another job) or the job is over."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        super().__init__(verdict)


class AuthError(TrainerError):
    """A handshake or a frame failed its check (wrong token, forged, replayed or garbled)."""


class TokenRefused(AuthError, ControlLost):
    """The coordinator said this client's token is wrong (a handshake failure, and a lost
    control connection for a caller of the store client)."""


class Malformed(TrainerError, ValueError):
    """Bytes read from the network or the store that are not the message (or request frame)
    their key or header promises: ignored and counted by the reader, never fatal."""


# -- the ring ------------------------------------------------------------------------------------


class GenerationBroken(TrainerError):
    """A collective or the forming of a generation's groups failed or was aborted; the step
    is discarded and the member waits for the next generation."""


class StateLost(TrainerError):
    """Training state that no member holds any more and no durable snapshot restores (e.g.
    every replica of a pipeline stage): the job cannot go on."""


class ExchangeError(TrainerError):
    """A cross-zone exchange peer sent what the generation does not allow, or the link
    failed (hybrid mode)."""


class LayoutError(TrainerError, ValueError):
    """The model cannot be cut into stages (not an ``nn.Sequential``, tied layers)."""


# -- training state ----------------------------------------------------------------------------


class BadState(TrainerError, ValueError):
    """Bytes that are not a state this trainer wrote, or a state that does not fit the job."""


class SnapshotError(TrainerError):
    """A snapshot could not be stored, found or read (the message says which and why)."""
