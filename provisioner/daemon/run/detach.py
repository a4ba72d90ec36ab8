"""``provision run --detach``: the same daemon, in the background, as ``sky launch -d`` or
``docker run -d`` start theirs.

Design: :func:`detach` runs the very command line the user typed again
(``python -m provisioner ...``) in a new session (``start_new_session``: no controlling
terminal, so closing the terminal or its Ctrl-C never reaches it), stdin from /dev/null and
stdout and stderr appended to the run's log file (:mod:`provisioner.daemon.run.target`:
``WORKDIR/daemon.log``, or ``STATE_PATH.log``). The child knows it is the detached daemon by
``SPOTRING_DETACHED_LOG`` in its environment (set to its log), so it runs in the foreground
of its own session and names its log in the registry.

The parent waits until the child has committed its run (its entry is in
:mod:`provisioner.daemon.run.registry`: every check passed, the lock held) or exited. A
child that exits first failed its checks: the log file and folders this start made are
removed (bad input changes nothing), and its exit code and last lines are returned
(:class:`Detached`) for the command to show. Otherwise the result holds the pid and the
lines that say where the run is and how to follow, inspect and stop it; the command prints
them and exits 0 while the daemon runs on.

Rule: the checks that need no lock (flags, config, job) run in the parent before the child
starts (``provision run`` makes them before calling here), so the common mistakes never
reach the background.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from provisioner.daemon.run import registry
from provisioner.daemon.run.lock import FILE_MODE, Created, held_by
from provisioner.daemon.run.target import Target
from provisioner.errors import UserError

#: How long the parent waits for the child to commit its run. A start binds the coordinator
#: and imports torch: seconds alone, minutes on a machine other work saturates.
COMMIT_WAIT_S = 300.0
POLL_S = 0.2
ENV = "SPOTRING_DETACHED_LOG"  # as provisioner.commands.run.DETACHED_ENV


@dataclass(frozen=True)
class Detached:
    """What ``--detach`` did: the child's exit code when it exited before committing its
    run (with its last lines), or its pid and the lines that say how to follow it."""

    code: int
    pid: int | None
    lines: tuple[str, ...]  # for stdout when code is 0, else for stderr


def detach(argv: list[str], target: Target) -> Detached:
    """Start ``provision <argv>`` in the background for ``target``."""
    holder = held_by(target.lock)
    if holder is not None:
        raise UserError(f"{target.what} is in use by another `provision run` (pid {holder}); "
                        f"stop it first, or pick another one")
    created = Created()
    try:
        created.mkdirs(target.log.parent)
        existed = target.log.exists()
        fd = os.open(target.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                     FILE_MODE)
        if not existed:
            os.fchmod(fd, FILE_MODE)
        out = os.fdopen(fd, "ab")
    except OSError as exc:
        created.undo()
        raise UserError(f"{target.what}: cannot write the log {target.log} "
                        f"({exc.strerror}); pick a writable folder") from None
    if not existed:
        created.file(target.log)
    start_offset = out.tell()
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out.write(f"--- {stamp} provision {' '.join(argv)}\n".encode())
    out.flush()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "provisioner", *argv], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, ENV: str(target.log), "PYTHONUNBUFFERED": "1"})
    finally:
        out.close()
    code = _wait_commit(proc)
    if code is not None:
        text = _read_from(target.log, start_offset)
        lines = [ln for ln in text.splitlines()[1:] if ln.strip()]
        if code != 0:
            created.undo()  # the child failed its checks: leave nothing behind
        return Detached(code, None, tuple(lines[-20:]))
    return Detached(0, proc.pid, tuple(started_lines(proc.pid, target)))


def _wait_commit(proc: subprocess.Popen) -> int | None:
    """None once the child registered its run; its exit code if it exited first."""
    deadline = time.monotonic() + COMMIT_WAIT_S
    entry = registry.runs_dir() / f"{proc.pid}.json"
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code
        if entry.exists():
            return None
        time.sleep(POLL_S)
    return None  # still starting: it goes on in the background


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def started_lines(pid: int, target: Target) -> list[str]:
    """What the person reads once the run is in the background: where, and the next
    commands."""
    where = f"--workdir {target.root}" if target.local else f"--config {target.config}"
    ref = str(target.root) if target.local else f"--config {target.config}"
    return [f"started in the background: pid {pid}",
            f"  {'workdir' if target.local else 'state'}: "
            f"{target.root if target.local else target.state}",
            f"  log:     {target.log}",
            f"follow:  provision logs {ref} -f",
            f"status:  provision status {where}   (all runs: provision list)",
            f"stop:    kill -INT {pid}   (drains, then terminates the fleet unless "
            f"--on-exit keep; then `provision down {ref}`)"]
