"""Build the job once on this machine before anything is launched: ``make_job`` and one batch
through the model (``provision run`` and ``provision check``).

Design: the build runs in a child process (``python -m provisioner.daemon.run.jobcheck``)
with the environment every worker gets (:func:`provisioner.daemon.run.local.
LocalEnvironment.launch_env`), so a job that imports torch, seeds it, reads its data or
crashes changes nothing in the daemon, and it sees the epochs the workers will train
(``DIGITS_EPOCHS``, ``SPOTRING_UNTIL_EPOCHS``). The child loads the job as a worker does
(:func:`trainer.job.load_job`), sends one small batch forward and backward (no optimiser
step) and prints one JSON line of :class:`JobFacts`; any failure is one line naming the job
and the cause. :func:`limits` then decides, as data, whether ``--until-epochs`` and
``--until-steps`` fit the job: an epoch limit the job does not take (it would train past it)
is refused with the fix, a step limit beyond the job's end is moot.

Rule for callers: check before the run's lock is taken (nothing of the run changes); a
UserError from here is bad input (exit 2).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from provisioner.errors import UserError

#: How long the build may take (make_job may read or download its data).
BUILD_TIMEOUT_S = 600.0
#: The most samples the one batch holds (a check, not a training step).
CHECK_BATCH = 8
#: The environment variables every worker gets for the run's limits (a job, or a trainer
#: that honours them, ends there by itself: its on_finish runs).
UNTIL_EPOCHS_ENV = "SPOTRING_UNTIL_EPOCHS"
UNTIL_STEPS_ENV = "SPOTRING_UNTIL_STEPS"


def limit_env(until_epochs: int | None, until_steps: int | None) -> dict[str, str]:
    """The run's limits as every worker's environment carries them (a job, or a trainer that
    honours them, ends there by itself; the packaged example reads ``DIGITS_EPOCHS``)."""
    env = {}
    if until_epochs:
        env[UNTIL_EPOCHS_ENV] = str(until_epochs)
        env["DIGITS_EPOCHS"] = str(until_epochs)
    if until_steps:
        env[UNTIL_STEPS_ENV] = str(until_steps)
    return env


@dataclass(frozen=True)
class JobFacts:
    """What the build found (plain data: it crosses a process boundary as JSON)."""

    epochs: int
    samples: int  # per epoch
    global_batch: int
    parameters: int
    batch: int  # the samples of the checked batch
    loss: float | None
    seconds: float
    on_finish: bool
    evaluate: bool

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.samples / self.global_batch)

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def text(self, spec: str) -> str:
        loss = "-" if self.loss is None or not math.isfinite(self.loss) else f"{self.loss:.4g}"
        return (f"{spec}: builds; {self.parameters:,} parameters, {self.epochs} epochs of "
                f"{self.samples:,} samples ({self.steps_per_epoch:,} steps of "
                f"{self.global_batch}); one batch of {self.batch} through the model: loss "
                f"{loss}, {self.seconds:.1f} s"
                + ("; evaluate" if self.evaluate else "") + ("; on_finish" if self.on_finish
                                                            else ""))


def build(spec: str, env: Mapping[str, str], *, flag: str = "--job", seed: int = 0,
          python: str | None = None, timeout_s: float = BUILD_TIMEOUT_S,
          cwd: str | None = None) -> JobFacts:
    """Build ``spec`` in a child process with ``env`` added to this one's, started in ``cwd``
    (first on its import path, as a cloud worker's job folder is). Raises UserError naming
    ``flag``, the job and the cause."""
    try:
        done = subprocess.run([python or sys.executable, "-m", "provisioner.daemon.run.jobcheck",
                               spec, str(seed)], env={**os.environ, **env}, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"{flag} {spec}: building the job took more than {timeout_s:g} s "
                        f"(make_job and one batch); make it faster, or check it with "
                        f"provision check --job {spec}") from None
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    try:
        doc = json.loads(lines[-1]) if lines else {}
    except ValueError:
        doc = {}
    if "error" in doc or done.returncode != 0 or not doc:
        why = doc.get("error") or _last_line(done.stderr) or f"exit code {done.returncode}"
        raise UserError(f"{flag} {spec}: the job does not build here: {why}")
    return JobFacts(**doc)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def limits(facts: JobFacts, spec: str, until_epochs: int | None,
           until_steps: int | None) -> list[str]:
    """Whether the run's limits fit the job (pure). Returns notes for the person; raises
    UserError for an ``--until-epochs`` the job would train past (it does not take it)."""
    notes = []
    if until_epochs is not None:
        if facts.epochs > until_epochs:
            raise UserError(
                f"--until-epochs {until_epochs}: {spec} trains {facts.epochs} epochs (its "
                f"Job.epochs) and would train past the limit; let make_job read its epochs "
                f"from ${UNTIL_EPOCHS_ENV} (every worker gets it; examples/digits.py reads "
                f"DIGITS_EPOCHS), or stop it by steps with --until-steps "
                f"{until_epochs * facts.steps_per_epoch} (its on_finish then does not run)")
        if facts.epochs < until_epochs:
            notes.append(f"{spec} trains {facts.epochs} epochs: it ends by itself before "
                         f"--until-epochs {until_epochs}")
    if until_steps is not None and until_steps >= facts.steps:
        notes.append(f"{spec} trains {facts.steps:,} steps: it ends by itself before "
                     f"--until-steps {until_steps}")
    return notes


def _check(spec: str, seed: int) -> dict[str, Any]:
    """In the child: build the job and send one batch through its model."""
    import time

    t0 = time.monotonic()
    from trainer.job import load_job

    job = load_job(spec, seed)
    import torch

    n = len(job)
    b = max(min(CHECK_BATCH, job.global_batch, n), min(job.min_batch, n))
    batch = job.batch(torch.arange(b))
    x, y = batch[0], batch[1]
    job.model.train()
    out = job.model(x)
    loss = job.loss_fn(out, y)
    loss.backward()
    job.model.zero_grad(set_to_none=True)
    return asdict(JobFacts(epochs=int(job.epochs), samples=n, global_batch=int(job.global_batch),
                           parameters=sum(p.numel() for p in job.model.parameters()),
                           batch=b, loss=float(loss.detach()), seconds=time.monotonic() - t0,
                           on_finish=job.on_finish is not None,
                           evaluate=job.evaluate is not None))


def main(argv: list[str] | None = None) -> int:
    """``python -m provisioner.daemon.run.jobcheck SPEC SEED``: one JSON line on stdout."""
    import traceback

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        doc = _check(args[0], int(args[1]) if len(args) > 1 else 0)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's job is one line
        from trainer.job import JobError

        if isinstance(exc, JobError):
            why = str(exc)
        else:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            why = (f"one batch through the model failed: {type(exc).__name__}: {exc} "
                   f"({os.path.basename(where.filename)}, line {where.lineno})")
        print(json.dumps({"error": why.splitlines()[0][:400] if why else type(exc).__name__}))
        return 2
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":  # pragma: no cover - the child process
    sys.exit(main())
