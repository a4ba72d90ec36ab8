"""The runs on this machine: what ``provision list`` shows, and how ``provision logs`` and
``provision down`` find a run by its id or pid.

Design: one small JSON file per running daemon under the user's state folder,
``$XDG_STATE_HOME/spotring/runs/`` (default ``~/.local/state/spotring/runs/``;
``SPOTRING_STATE_HOME`` replaces ``$XDG_STATE_HOME/spotring``, for tests). A daemon writes its
entry (:func:`register`) once its run is committed (the lock held, the state opened) and
removes it at exit (:func:`unregister`). One file each, written whole and renamed into place:
no lock is shared between daemons, and a daemon that crashed leaves one stale file, which
:func:`entries` deletes when it reads it: an entry counts only while its pid is alive AND
has the kernel start time recorded with it (a recycled pid is another process).

A run started with ``--name NAME`` is also remembered under ``names/NAME.json`` (where its
files are), kept after its daemon exits, so ``provision status/logs/down/stop NAME`` find a
stopped run by its name too (:func:`named`); a name is another run's only while that run's
state is there (:func:`check_name`).

The registry is an index, never the truth: the run's own files (its state, its log, its
lock) say what a run is; an entry only says where they are.

Rule for callers: never write an entry for another process; read entries only through
:func:`entries` (which prunes) and :func:`find`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from provisioner.daemon.run.lock import FILE_MODE, private_dirs
from provisioner.drivers.local import proc_start
from provisioner.errors import UserError


def home() -> Path:
    """The user's spotring state folder (see the module docstring)."""
    explicit = os.environ.get("SPOTRING_STATE_HOME")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "spotring"


def runs_dir() -> Path:
    return home() / "runs"


@dataclass(frozen=True)
class Entry:
    """One running daemon: where its files are."""

    pid: int
    start: str | None  # the kernel start time of ``pid`` (/proc/PID/stat field 22)
    run_id: str  # the run's id (local runs) or the job id (cloud runs)
    driver: str  # local | aws | gcp
    workdir: str  # the local run's work directory, or the cloud state file's folder
    state: str  # the state file
    log: str | None  # the daemon's log file (detached runs), else None
    lock: str  # the lock file the daemon holds
    job: str  # job.job_file
    started: str  # ISO time (UTC) the daemon registered
    config: str | None = None
    name: str | None = None  # --name

    @property
    def alive(self) -> bool:
        return self.pid > 0 and proc_start(self.pid) == self.start

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Entry":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


def _path(pid: int) -> Path:
    return runs_dir() / f"{pid}.json"


def register(*, run_id: str, driver: str, workdir: Path, state: Path, lock: Path, job: str,
             log: Path | None = None, config: str | None = None,
             name: str | None = None) -> Entry | None:
    """Write this process's entry; returns it (None when the folder is not writable: the
    registry is a convenience, a run never fails for it)."""
    pid = os.getpid()
    entry = Entry(pid, proc_start(pid), run_id, driver, str(workdir), str(state),
                  str(log) if log else None, str(lock), job,
                  datetime.now(timezone.utc).isoformat(timespec="seconds"), config, name)
    path = _path(pid)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        private_dirs(path.parent)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(asdict(entry)))
        os.replace(tmp, path)
    except OSError:
        return None
    return entry


def unregister() -> None:
    """Remove this process's entry (nothing when there is none)."""
    try:
        _path(os.getpid()).unlink()
    except OSError:
        pass


def entries() -> list[Entry]:
    """The live runs, oldest first; entries of dead daemons are deleted on the way."""
    out = []
    for p in sorted(runs_dir().glob("*.json")):
        try:
            entry = Entry.from_json(json.loads(p.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours: leave it
        if entry.alive:
            out.append(entry)
        else:
            p.unlink(missing_ok=True)
    return sorted(out, key=lambda e: (e.started, e.pid))


def find(ref: str) -> Entry | None:
    """The live run whose pid, name or run id (or a unique prefix of it) is ``ref``.

    Raises UserError when a prefix matches several runs."""
    runs = entries()
    for e in runs:
        if ref in (str(e.pid), e.run_id, e.name):
            return e
    hits = [e for e in runs if e.run_id.startswith(ref)]
    if len(hits) > 1:
        raise UserError(f"{ref}: matches {len(hits)} runs ("
                        + ", ".join(e.run_id for e in hits) + "); give more of the id or "
                        "the pid (see `provision list`)")
    return hits[0] if hits else None


# -- names ----------------------------------------------------------------------------------
# ``--name`` outlives the daemon: ``provision status/logs/down NAME`` find a stopped run too.
# One small file per name under ``names/``, pointing at the run's files.

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def names_dir() -> Path:
    return home() / "names"


def check_name(name: str | None, state: Path) -> None:
    """Raise UserError when ``name`` is malformed or names another run whose state is still
    there (a run keeps its own name; a name whose run is gone can be taken)."""
    if name is None:
        return
    if not NAME.match(name):
        raise UserError(f"--name {name!r}: use letters, digits, '.', '_' or '-' (at most 64, "
                        f"starting with a letter or digit), e.g. --name digits-try2")
    known = named(name)
    if known is not None and Path(known["state"]) != Path(state).resolve() and \
            Path(known["state"]).exists():
        raise UserError(f"--name {name}: already the name of the run in {known['workdir']}; "
                        f"pick another name (or run there with --workdir {known['workdir']})")


def remember(name: str | None, *, driver: str, workdir: Path, state: Path,
             config: str | None) -> None:
    """Write ``name``'s file (nothing when the folder is not writable: a convenience)."""
    if name is None:
        return
    data = {"name": name, "driver": driver, "workdir": str(Path(workdir).resolve()),
            "state": str(Path(state).resolve()), "config": config}
    path = names_dir() / f"{name}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        private_dirs(path.parent)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


def named(name: str) -> dict[str, Any] | None:
    """Where the run called ``name`` is (its ``--name``), or None."""
    if not NAME.match(name):
        return None
    try:
        data = json.loads((names_dir() / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "state" in data else None
