"""A worker's runtime: the device, the input feed, the data order, the emulations.

Design. :class:`Runtime` holds what a worker computes with and on, and nothing that must
agree across members: the device (:mod:`trainer.worker.devices`), the job's input pipeline
(:class:`trainer.data.feed.Feed`, restarted once when a loader process dies), the minimum
local batch, the cached sample order of the epoch being trained, this worker's last
measured speed (the heartbeat reports it), the ``--slowdown`` emulation and the fault
injector of the tests. Every training mode reaches the device and the data through it: the
one place device handling lives.

``slowdown`` F sleeps (F - 1) x batch x the running median of the measured compute seconds
per sample after each forward/backward, to emulate slower hardware without multiplying the
host's timing noise by F.

Rule for callers: one runtime per worker; :meth:`Runtime.close` it at exit.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import threading
import time
from typing import Any

import torch

from trainer.data.feed import Feed
from trainer.data.sampler import epoch_order
from trainer.errors import FeedError, JobCodeError, JobError
from trainer.job import Job
from trainer.protocol import messages as mb
from trainer.worker import devices

log = logging.getLogger(__name__)

FAULTS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}
SLOW_WINDOW = 15  # steps in the running median that --slowdown sleeps against


def user_order(job: Job, seed: int, epoch: int, n: int) -> torch.Tensor:
    """The job's ``order(seed, epoch, n)`` as a checked int64 tensor of ``n`` indices in
    ``range(n)`` (repeats allowed: each *position* is trained exactly once). Raises
    :class:`trainer.errors.JobError` naming ``Job.order`` and the fix."""
    assert job.order is not None
    try:
        raw = job.order(seed, epoch, n)
        got = raw if isinstance(raw, torch.Tensor) else torch.as_tensor(list(raw))
    except Exception as e:  # noqa: BLE001 - the user's code: one clear line
        raise JobError(f"Job.order({seed}, {epoch}, {n}) raised {type(e).__name__}: {e}; "
                       "fix the job's order") from e
    if (got.dim() != 1 or got.numel() != n or got.is_floating_point()
            or (n and (int(got.min()) < 0 or int(got.max()) >= n))):
        raise JobError(f"Job.order({seed}, {epoch}, {n}) must return {n} integer indices in "
                       f"range({n}) (got shape {tuple(got.shape)}, dtype {got.dtype})")
    return got.to(torch.int64)


class Runtime:
    """What a worker computes with (see the module docstring)."""

    def __init__(self, job: Job, device: torch.device, *, seed: int, slowdown: float = 1.0,
                 loader_workers: int | None = None,
                 faults: tuple[tuple[str, int], ...] = ()) -> None:
        self.job, self.device, self.seed = job, device, seed
        self.device_name = devices.describe(device)
        self.min_batch = job.min_batch
        self.slowdown = slowdown
        self.loader_workers = loader_workers
        self.faults = faults
        self.feed = self._feed()
        self.samples_per_s = 0.0  # this worker's last measured speed (the heartbeat's)
        self.batch_size = 0  # and its last local batch
        self.micro_cap = job.micro_batch  # samples per forward pass; lowered on out of memory
        self._fired: set[tuple[str, int]] = set()
        self._orders: dict[int, torch.Tensor] = {}
        self._per_sample: list[float] = []  # recent compute s/sample, for --slowdown

    def _feed(self) -> Feed:
        job = self.job
        return Feed(job.train_set, device=self.device, collate_fn=job.collate_fn,
                    workers=self.loader_workers)

    def close(self) -> None:
        self.feed.close()

    # -- data ----------------------------------------------------------------------------------

    def batch(self, ids: torch.Tensor, step: int) -> Any:
        """The collated batch of ``ids`` on the device. A dead loader process gets one new
        pipeline; the dataset's own exceptions (and a second failure) are the job's error.
        Raises :class:`trainer.errors.JobCodeError`."""
        for attempt in (1, 2):
            try:
                return self.feed.batch(ids)
            except FeedError as e:
                if attempt == 2:
                    raise JobCodeError("input pipeline", step, len(ids), e) from e
                log.warning("input pipeline failed (%s); starting a new one", e)
                self.feed.close()
                self.feed = self._feed()
            except Exception as e:  # noqa: BLE001 - the dataset's own code
                raise JobCodeError("dataset", step, len(ids), e) from e
        raise AssertionError("unreachable")

    def order(self, epoch: int) -> torch.Tensor:
        """The sample order of ``epoch`` (seeded: the same on every member; the job's
        ``order`` when it gives one); the two epochs asked for last are kept (a step looks
        one epoch ahead to prefetch). Raises :class:`trainer.errors.JobError` when the
        job's ``order`` returns something else than ``n`` indices in ``range(n)``."""
        got = self._orders.pop(epoch, None)
        if got is None:
            n = len(self.job)
            got = (epoch_order(self.seed, epoch, n) if self.job.order is None
                   else user_order(self.job, self.seed, epoch, n))
        self._orders[epoch] = got  # the newest last
        while len(self._orders) > 2:
            del self._orders[next(iter(self._orders))]
        return got

    # -- speed -----------------------------------------------------------------------------------

    def note_speed(self, batch: int, compute_s: float) -> None:
        """This worker's last local batch and samples/s (the heartbeat reports them)."""
        self.batch_size = batch
        if compute_s > 0 and batch:
            self.samples_per_s = batch / compute_s

    def speed(self) -> mb.Speed:
        return mb.Speed(self.samples_per_s, self.batch_size)

    def slow(self, compute_s: float, batch: int) -> None:
        """Emulate F-times-slower hardware: sleep (F - 1) x batch x median s/sample.

        The median runs over this worker's last ``SLOW_WINDOW`` measured compute times per
        sample, so the emulated part of a step is steady: sleeping (F - 1) x *this* step's
        compute would multiply the host's scheduling noise by F. At a steady batch the step
        then takes F x the base compute, the definition of the slowdown.
        """
        if self.slowdown <= 1.0 or batch <= 0:
            return
        self._per_sample.append(compute_s / batch)
        del self._per_sample[:-SLOW_WINDOW]
        per_sample = statistics.median(self._per_sample)
        time.sleep((self.slowdown - 1.0) * batch * per_sample)

    # -- tests -----------------------------------------------------------------------------------

    def maybe_fault(self, step: int) -> None:
        """The fault injector (``--fault ACTION@STEP``): fire each fault once, at the first
        step at or after its own."""
        for action, at in self.faults:
            if at <= step and (action, at) not in self._fired:
                self._fired.add((action, at))
                log.warning("fault injector: %s at step %d", action, at)
                if action == "freeze":  # a wedged main thread; the heartbeat thread goes on
                    threading.Event().wait()
                os.kill(os.getpid(), FAULTS[action])
