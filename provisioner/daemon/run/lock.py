"""One run per work directory or state file: an exclusive ``flock`` held for the run's life,
and a journal of what a run's start created, so a start that fails leaves nothing behind.

Design: :class:`RunLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on a lock file
(``WORKDIR/.lock`` for a local run, ``STATE_PATH.lock`` for a cloud run). The kernel drops a
flock when its holder dies, however it dies, so a crashed daemon never leaves a stale lock:
the next run takes it at once and adopts the fleet. The holder writes its pid into the file
for the refusal message (informative only: the lock is the flock, never the pid). The lock
file is not deleted at the end of a run (deleting a lock file races with a process that
opened it and is about to lock it); it is removed only by :meth:`Created.undo` when this
very start created it and failed.

:class:`Created` records the folders and files a start creates before its commit point
(the workdir, the lock file, a fresh token file); :meth:`Created.undo` removes exactly those,
newest first, and only folders left empty: "nothing changed" for bad input, and never a
file that was there before.

Private by default: a run's files hold its token, its model's weights and its costs, so
what a run creates is its owner's alone whatever the umask: folders 0700 and files 0600
(:data:`DIR_MODE`, :data:`FILE_MODE`; :func:`private_files` sets the umask that gives the
same to everything the daemon and its workers create during the run).

Rule: take the lock before anything in the workdir changes and hold it until the run ended;
the lock's descriptor is close-on-exec (Python's default), so a worker that outlives the
daemon never holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from provisioner.errors import UserError


#: Modes of what a run creates (see the module docstring).
DIR_MODE = 0o700
FILE_MODE = 0o600
#: The umask of a run's process: nothing it (or a worker it starts) creates is readable by
#: another user.
PRIVATE_UMASK = 0o077


@contextmanager
def private_files() -> Iterator[None]:
    """Run the body with :data:`PRIVATE_UMASK` (folders 0700, files 0600 whatever the
    caller's umask; workers started meanwhile inherit it), then put the umask back."""
    old = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(old)


def private_dirs(path: Path, made: list[Path] | None = None) -> None:
    """``mkdir -p path`` with every folder it makes 0700 (an existing one is left as it
    is); each folder it makes is appended to ``made``, outermost first, as it is made (so
    a caller undoing a failed start knows them even when a later one fails)."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(d, DIR_MODE)  # mkdir's mode passes through the umask
        if made is not None:
            made.append(d)


class Created:
    """What a start created (see the module docstring)."""

    def __init__(self) -> None:
        self._paths: list[tuple[Path, bool]] = []  # (path, is_dir), in creation order

    def mkdirs(self, path: Path) -> None:
        """``mkdir -p path``, recording each folder it made (those made before a failure
        too)."""
        made: list[Path] = []
        try:
            private_dirs(path, made)
        finally:
            self._paths.extend((d, True) for d in made)

    def file(self, path: Path) -> None:
        """Record a file this start has just created."""
        self._paths.append((path, False))

    def undo(self) -> None:
        """Remove what was recorded, newest first; folders only when empty."""
        for path, is_dir in reversed(self._paths):
            try:
                path.rmdir() if is_dir else path.unlink()
            except OSError:
                pass
        self._paths.clear()


def writable_folder(path: Path, flag: str) -> None:
    """Raise UserError naming ``flag`` when files cannot be created in ``path`` (or, when it
    does not exist yet, in its nearest existing parent). Leaves nothing behind: the probe
    file is removed at once."""
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        raise UserError(f"{flag} {path}: {p} is not a folder; pick a writable folder")
    probe = p / f".spotring-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write in {p} ({exc.strerror}); pick a "
                        f"writable folder") from None
    os.close(fd)
    probe.unlink()


def held_by(path: Path) -> int | None:
    """The pid of the process holding the flock on ``path`` now, None when nobody does.

    Reads ``/proc/locks`` (Linux), so it never takes the lock itself: a check made while a
    daemon is starting cannot make that start fail. Where ``/proc/locks`` is unreadable it
    falls back to taking and dropping the lock at once.
    """
    try:
        inode = os.stat(path).st_ino
    except OSError:
        return None
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return _probe(path)
    for line in lines:
        parts = line.split()
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue  # a waiter, or a POSIX lock
        if parts[5].rsplit(":", 1)[-1] == str(inode):
            return int(parts[4]) if parts[4].isdigit() else -1
    return None


def _probe(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return RunLock(path, "").holder() or -1
    finally:
        os.close(fd)  # closing drops the lock, if it was taken
    return None


class RunLock:
    """An exclusive lock on ``path`` held while a run lives (see the module docstring).

    ``what`` names the thing locked in messages, e.g. ``"--workdir spotring-run"``.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self._fd: int | None = None

    def acquire(self, created: Created) -> None:
        """Take the lock (creating the lock file and its folder, recorded in ``created``).

        Raises UserError when another run holds it (naming its pid) or when the folder is
        not writable.
        """
        try:
            created.mkdirs(self.path.parent)
            existed = self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                         FILE_MODE)
            if not existed:
                os.fchmod(fd, FILE_MODE)
        except OSError as exc:
            raise UserError(f"{self.what}: cannot write there ({exc.strerror}); pick a "
                            f"writable folder") from None
        if not existed:
            created.file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{self.what}: cannot lock {self.path} ({exc.strerror})") \
                    from None
            holder = self.holder()
            raise UserError(f"{self.what} is in use by another `provision run`"
                            + (f" (pid {holder})" if holder else "")
                            + "; stop it first, or pick another one") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def holder(self) -> int | None:
        """The pid written by the lock's holder (None when unreadable)."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock (the file stays; see the module docstring)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
