"""What a worker writes: metrics lines, sample records, evaluations, the trained model, and
its durable snapshots.

Design. :class:`Outputs` is every way out of a worker, so a mode never opens a file: the
per-step metrics line (``--metrics-file``, JSON lines) and rank 0's progress log line at most
every ``LOG_EVERY_S`` and at each epoch end, the samples each member trained
(``--record-samples``: the tests' exactly-once check), the job's ``evaluate`` (its metrics go
into the training state, its duration into the next step's head start), the trained model
(``--output``: a ``state_dict`` of CPU tensors written whole) and the job's ``on_finish``,
and rank 0's durable snapshots (one :class:`trainer.state.snapshot.Snapshotter` for the
worker's life, started when the coordinator announces how often, and where the store is when
rank 0 may write there itself while the coordinator is away: signed with ``snapshot_key``).

Rule for callers: the member skeleton calls these at the points it owns (a commit, the end
of the job); :meth:`Outputs.close` flushes and waits for an upload in flight.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ControlLost, ControlTimeout, JobCodeError
from trainer.job import Job
from trainer.protocol import messages as mb
from trainer.state import snapshot as snap
from trainer.state.direct import DirectWriter
from trainer.state.training import CAUSES, PARTS, TrainingState

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0  # progress lines at most this often (and at every epoch end)
WRITE_WARN_EVERY_S = 60.0  # a line that cannot be written: one warning at most this often


class Outputs:
    """Every way out of a worker (see the module docstring)."""

    def __init__(self, job_name: str, *, metrics_file: Path | None = None,
                 record_samples: Path | None = None, output: Path | None = None,
                 snapshot_key: bytes | None = None) -> None:
        self.job_name = job_name
        self._snapshot_key = snapshot_key  # signs a snapshot written without the coordinator
        self.metrics_file, self.samples_file, self.output = metrics_file, record_samples, output
        self.snapshotter: snap.Snapshotter | None = None
        self.eval_s = 0.0  # how long this worker's last evaluation took
        self._files: dict[Path, Any] = {}
        self._last_log = 0.0
        self._log_epoch = -1
        self.skipped = 0  # lines that could not be written (disk full)
        self._warned_at = -WRITE_WARN_EVERY_S

    def close(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.wait()
        for f in self._files.values():
            f.close()
        self._files.clear()

    # -- lines ----------------------------------------------------------------------------------

    def append(self, path: Path | None, record: dict[str, Any]) -> None:
        """Append one JSON line to ``path`` (kept open, flushed per line). A line that cannot
        be written (a full disk, a quota, an I/O error) is skipped with a warning at most
        every ``WRITE_WARN_EVERY_S``: the ring trains on."""
        if path is None:
            return
        try:
            f = self._files.get(path)
            if f is None:
                f = self._files[path] = path.open("a", buffering=1)
            f.write(json.dumps(record) + "\n")
        except OSError as e:
            self.skipped += 1
            now = time.monotonic()
            if now - self._warned_at >= WRITE_WARN_EVERY_S:
                self._warned_at = now
                log.warning("cannot write %s (%s): %d line(s) skipped so far; training goes "
                            "on", path, e.strerror or e, self.skipped)
            bad = self._files.pop(path, None)
            if bad is not None:
                try:
                    bad.close()
                except OSError:
                    pass  # its buffer cannot be flushed either: dropped with the line

    def step_record(self, head: bool, record: dict[str, Any], *, epochs: int,
                    metrics: dict[str, float]) -> None:
        """One committed step: the metrics line, and on the head a progress line at most
        every ``LOG_EVERY_S`` and at each epoch end."""
        self.append(self.metrics_file, record)
        if not head:
            return
        now = time.monotonic()
        epoch = int(record["epoch"])
        if now - self._last_log >= LOG_EVERY_S or epoch != self._log_epoch:
            self._last_log, self._log_epoch = now, epoch
            shown = " ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())
                             if math.isfinite(v))
            log.info("step %d epoch %d/%d loss %.4g world %d%s", record["step"], epoch, epochs,
                     record["loss"], record["world"], f" {shown}" if shown else "")

    def samples(self, step: int, epoch: int, member: int, ids: list[int],
                by: int | None = None) -> None:
        """Record that ``member`` trained samples ``ids`` in ``step`` (``by``: the member
        that records them for another, gone, one)."""
        if self.samples_file is not None:
            self.append(self.samples_file, {"epoch": epoch, "step": step, "member": member,
                                            "ids": ids, **({"by": by} if by is not None else {})})

    # -- the job's results ------------------------------------------------------------------------

    def evaluate(self, job: Job, state: TrainingState) -> None:
        """Run the job's ``evaluate`` (rank 0): every metric it returns into the state, and
        how long it took (the head start the others give rank 0 after the next epoch end).
        Leaves training mode on. A metric that is not a number is logged and left out.
        Raises :class:`trainer.errors.JobCodeError`."""
        assert job.evaluate is not None
        t0 = time.perf_counter()
        before, lrs = state.digests(), [g.get("lr") for g in job.optimizer.param_groups]
        try:
            got = job.evaluate(job.model) or {}
        except Exception as e:  # noqa: BLE001 - the user's code: one clear error
            raise JobCodeError("evaluate", state.progress.step, 0, e) from e
        job.model.train()
        self.eval_s = time.perf_counter() - t0
        after = state.digests()
        changed = [k for k in PARTS if before[k] != after[k]]
        if changed:  # evaluate runs on one member only: the others would train on without it
            now = [g.get("lr") for g in job.optimizer.param_groups]
            lr = f" (learning rate {lrs[0]} -> {now[0]})" if lrs != now else ""
            raise JobCodeError("evaluate", state.progress.step, 0, RuntimeError(
                f"evaluate changed {', '.join(changed)}{lr}, but it runs on rank 0 only; "
                f"{CAUSES[changed[0] if changed[0] != 'optimizer' or not lr else 'scheduler']}"))
        state.metrics_step = state.progress.step
        metrics: dict[str, float] = {}
        for k, v in dict(got).items():
            try:
                metrics[str(k)] = float(v)
            except (TypeError, ValueError):
                log.warning("evaluate returned %r=%r, not a number: not reported", k, v)
        state.metrics = metrics

    def write_model(self, model: torch.nn.Module, step: int, why: str) -> None:
        """Write the trained model to ``--output`` (rank 0): a ``state_dict`` of CPU tensors,
        written whole (a temporary file renamed over it), that plain ``torch.load`` reads."""
        path = self.output
        if path is None:
            if why == "on request":
                log.warning("the trained model was requested, but this worker has no --output")
            return
        sd = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(sd, tmp)
        os.replace(tmp, path)
        log.info("trained model written to %s (%s, step %d)", path, why, step)

    def finish_model(self, job: Job, step: int) -> str | None:
        """The end of the job on rank 0: the trained model to ``--output`` and the job's
        ``on_finish`` hook. Returns the failure message when the hook raised."""
        self.write_model(job.model, step, "at the end")
        if job.on_finish is not None:
            try:
                job.on_finish(job.model)
            except Exception as e:  # noqa: BLE001 - the user's code: one clear error
                log.error("the job's on_finish raised %s: %s", type(e).__name__, e)
                return f"job {self.job_name}: on_finish raised {type(e).__name__}: {e}"
        return None

    # -- durable snapshots -----------------------------------------------------------------------

    def start_snapshots(self, store: Any) -> None:
        """As rank 0: take durable snapshots when the coordinator keeps them (it announces
        how often); one :class:`trainer.state.snapshot.Snapshotter` for the worker's life."""
        if self.snapshotter is not None:
            return
        try:
            raw = store.peek([mb.SNAPSHOT_CONFIG])[0]
        except (ControlLost, ControlTimeout):
            return
        if not raw:
            return
        try:
            cfg = mb.parse_json(raw, "snapshot config", max_bytes=64 << 10, max_depth=2)
            every_s, every_steps = float(cfg["every_s"]), int(cfg["every_steps"])
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            log.warning("snapshot settings from the coordinator unreadable: none taken")
            return
        writer = DirectWriter.from_config(cfg.get("direct"), self._snapshot_key)
        self.snapshotter = snap.Snapshotter(store.clone, every_steps, every_s, direct=writer)
        log.info("durable snapshots every %s%s", f"{every_steps} steps or {every_s:.0f}s"
                 if every_steps else f"{every_s:.0f}s", "; to the store itself while the "
                 "coordinator is away" if writer is not None else "")

    def snapshot_due(self, step: int) -> bool:
        """Is a durable snapshot due once ``step`` is committed?"""
        return self.snapshotter is not None and self.snapshotter.due(step)

    def snapshot(self, state: TrainingState) -> None:
        """Take a durable snapshot of ``state`` now (its upload runs on a thread)."""
        if self.snapshotter is not None:
            p = state.progress
            self.snapshotter.take(p.step, state.to_tree, state.fingerprint, p.epoch,
                                  p.samples_done)
