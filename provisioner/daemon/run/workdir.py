"""The local run's work directory: what lives where, and whether a start continues the run
found there.

Design: a work directory holds ONE run and is never wiped. :class:`Workdir` names its
paths. :func:`decide_start` (pure) reads the run found there (the ``run`` meta of its state)
against this start's :class:`RunIdentity`:

- no state: a **fresh** run;
- a run whose end was recorded but never finished stopping (its daemon was killed while
  stopping it: ``ended.stopped`` false) and whose job is over, or a run whose ring's
  recorded stats decided its end (done, lost, failed, at its ``--until-epochs``: the
  daemon acts on the job's end only once it is recorded) before the end was: **finish** stopping it (end what is left of its fleet,
  mark it stopped, write its report) and nothing else: a finished job is never trained
  again;
- a run whose job finished (``ended.outcome == "done"``): the **next** run; the finished
  run's files (state, worker logs, samples, its snapshots, the default report) are moved,
  not deleted, to ``runs/<its id>/`` first (:func:`archive`);
- anything else (a daemon killed or crashed, Ctrl-C, ``--duration`` reached, a lost job):
  **continue** it: the same state, token, coordinator address and snapshots, the fleet
  adopted, the simulated clock going on where it is. A start whose identity differs (another
  job file, market or epoch count) is refused with the flag to change, since its workers
  and its report would mix two runs.

``cloud/`` (the local driver's instance records) is the machine's "cloud account": it is
never moved, so instances of any earlier run stay visible to recovery. Snapshots are kept
per run (``snapshots/<run id>``, or ``<snapshot.url>/<job.id>/<run id>``): a run never
resumes from another run's snapshots, a finished one's least of all.

A run never writes out of its work directory: a start is refused when the directory holds
a symbolic link leading out of it or to nothing (:func:`no_way_out`), and the files a start
creates itself are opened without following links.

Rule: read the state only with :meth:`provisioner.daemon.state.State.read_only` before the
run's lock is held and the start decided; :func:`archive` is the only move.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from enum import StrEnum
from pathlib import Path
from typing import Any, Mapping

from provisioner.daemon.outcome import FINAL, Verdict, stopping, verdict
from provisioner.daemon.run.lock import private_dirs
from provisioner.errors import UserError


@dataclass(frozen=True)
class Workdir:
    """The paths of a local run's work directory."""

    root: Path

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def state(self) -> Path:
        return self.root / "state.sqlite"

    @property
    def token(self) -> Path:
        return self.root / "token"

    @property
    def cloud(self) -> Path:
        return self.root / "cloud"

    @property
    def workers(self) -> Path:
        return self.root / "workers"

    @property
    def samples(self) -> Path:
        return self.root / "samples"

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def model(self) -> Path:
        """The trained model rank 0 writes at the end (``--output`` of every local worker)."""
        return self.root / "model.pt"


@dataclass(frozen=True)
class RunIdentity:
    """What makes two starts the same run (each field names the flag that sets it)."""

    job: str  # job.id
    job_file: str  # job.job_file
    until_epochs: int | None  # --until-epochs
    market: str  # --trace paths, or the generator's --seed and --outages-per-hour
    until_steps: int | None = None  # --until-steps

    def as_meta(self) -> dict[str, Any]:
        return asdict(self)


FLAGS = {"job": "job.id", "job_file": "job.job_file", "until_epochs": "--until-epochs",
         "until_steps": "--until-steps",
         "market": "--trace/--seed/--outages-per-hour"}


class StartKind(StrEnum):
    FRESH = "fresh"
    CONTINUE = "continue"
    NEXT = "next"  # the run found there finished: archived, then a fresh one
    FINISH = "finish"  # the run found there ended but was not stopped: stop it, nothing more


@dataclass(frozen=True)
class Start:
    kind: StartKind
    previous_id: str | None = None  # the run continued or archived
    ring: Mapping[str, Any] | None = None  # FINISH: the ring's stats that ended it

    def run_id(self) -> str:
        """The id of the run this start runs: the continued (or finished) one's, else a new
        one."""
        if self.kind in (StartKind.CONTINUE, StartKind.FINISH) and self.previous_id:
            return self.previous_id
        return new_run_id()


def new_run_id() -> str:
    """``20261124T093235Z-fd46a1``: sortable by start, unique enough for one machine."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def ring_end(ring: Mapping[str, Any], run_meta: Mapping[str, Any]) -> Verdict | None:
    """The run's end as the ring's last recorded stats decide it (the verdict the daemon acts
    on: the job done, lost or failed, or the run's ``--until-epochs`` reached), None while
    they say it goes on."""
    identity = run_meta.get("identity") or {}
    return verdict(ring, interrupted=False, crash_loop=None,
                   until_epochs=identity.get("until_epochs"), elapsed_s=0.0, duration_s=None,
                   until_steps=identity.get("until_steps"))


def decide_start(run_meta: Mapping[str, Any] | None, has_state: bool,
                 identity: RunIdentity, where: str,
                 ring: Mapping[str, Any] | None = None) -> Start:
    """Fresh, continue, next or finish (see the module docstring); ``ring`` is the ring's
    last stats the state recorded (its ``ring`` meta). Raises UserError naming the flag when
    the run found there is another run."""
    if not has_state:
        return Start(StartKind.FRESH)
    meta = dict(run_meta or {})
    ended = meta.get("ended") or {}
    if stopping(ended) or (not ended and meta.get("id") and ring_end(ring or {}, meta)):
        return Start(StartKind.FINISH, meta.get("id"), ring=ring)
    if ended.get("outcome") in FINAL:
        return Start(StartKind.NEXT, meta.get("id"))
    theirs = meta.get("identity") or {}
    for name, flag in FLAGS.items():
        if name in theirs and theirs[name] != getattr(identity, name):
            raise UserError(f"{where} holds an unfinished run started with {flag} "
                            f"{theirs[name]!r} (this start: {getattr(identity, name)!r}); "
                            f"start with the same {flag} to continue it, or pick another "
                            f"--workdir")
    return Start(StartKind.CONTINUE, meta.get("id"))


def no_way_out(root: Path, flag: str) -> None:
    """Refuse a work directory holding a symbolic link that leads out of it (or nowhere: a
    dangling link would make the run create its target, wherever it points). Reads only.
    Raises UserError naming the link, where it points and the fix."""
    root = Path(root)
    if not root.is_dir():
        return
    base = root.resolve()
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            p = Path(folder) / name
            if not p.is_symlink():
                continue
            target = p.resolve(strict=False)
            if target == base or base in target.parents:
                if target.exists():
                    continue
                why = "a link to nothing (the run would create it)"
            else:
                why = f"a link out of the work directory, to {target}"
            raise UserError(f"{flag} {root}: {p} is {why}; a run writes only inside its work "
                            f"directory: remove the link (or put the file itself there), or "
                            f"give another {flag}")


def archive(wd: Workdir, run_id: str | None, report: Path | None) -> Path:
    """Move the finished run's files to ``runs/<run_id>/`` (a rename: nothing is deleted).
    ``report`` is moved only when it is inside the work directory. Returns the folder."""
    name = run_id or f"run-{int(os.path.getmtime(wd.state))}"
    dest = wd.runs / name
    k = 1
    while dest.exists():
        k += 1
        dest = wd.runs / f"{name}.{k}"
    private_dirs(dest)
    moving = [(p, p.name) for p in (wd.workers, wd.samples, wd.model,
                                    *wd.root.glob("state.sqlite*"))]
    if run_id:
        moving.append((wd.snapshots / run_id, "snapshots"))
    if report is not None and report.resolve().parent == wd.root.resolve():
        moving.append((report, report.name))
    for p, to in moving:
        if p.exists():
            os.replace(p, dest / to)
    return dest
