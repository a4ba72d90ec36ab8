"""``provision logs [RUN] [-f] [--worker ID]``: a run's daemon log, and a worker's,
like ``sky logs`` and ``docker logs``.

Design: the files are the run's own (:mod:`provisioner.daemon.run.target`: ``WORKDIR/daemon.log``
of a detached run, ``WORKDIR/cloud/logs/<ID>.log`` of a local worker); a cloud worker's lines
are the chunks its boot's shipper put in the run's artifacts (``[cloud] artifacts`` of the
run's ``--config``: ``logs/<instance id>/<unit>/<seq>``, :mod:`provisioner.drivers.shiplog`),
kept after the instance was revoked or terminated, each line prefixed with its unit (``boot``,
``spotring-worker@<gpu>.service``). This command only reads them. ``-f`` follows while the run's daemon holds its lock
(:func:`provisioner.daemon.run.lock.held_by`, read from ``/proc/locks``: following never takes the
lock) and ends, after printing what is left, when the daemon exits (its process gone too: it
prints its end after releasing the lock), as ``sky logs`` ends with its job; Ctrl-C ends it
sooner (exit 130, quietly). With two files each line is prefixed with where it comes from.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from provisioner.clio import add_run_flags, run_ref, whole
from provisioner.errors import UserError

#: How often ``-f`` looks for new lines (a person reading; cheap on a busy machine).
FOLLOW_POLL_S = 0.25
#: How often ``-f`` lists a cloud worker's shipped chunks (its shipper sends one every
#: :data:`provisioner.drivers.shiplog.SHIP_S` seconds; a listing is a paid request).
SHIPPED_POLL_S = 5.0
#: How long ``-f`` waits, after the daemon released its run's lock, for its process to end
#: (it prints its last lines then); a process still there after it is not waited for.
EXIT_WAIT_S = 30.0


def register(sub: Any) -> None:
    p = sub.add_parser("logs", help="print (-f: follow) a run's daemon log, or a worker's",
                       description="Print the daemon log of a run (started with `provision "
                       "run --detach`) and, with --worker, a local worker's log. -f follows "
                       "until the daemon exits.")
    add_run_flags(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until "
                   "the daemon exits (Ctrl-C to stop)")
    p.add_argument("--worker", metavar="ID", help="also (with --no-daemon: just) this worker's "
                   "log: a local worker's file, or a cloud instance's shipped lines, also after "
                   "it was revoked or terminated (ids: `provision status`)")
    p.add_argument("--no-daemon", action="store_true", help="with --worker: only the worker's "
                   "log")
    p.add_argument("-n", "--lines", type=int, metavar="N", help="start with the last N lines "
                   "of each file (default: all)")
    p.set_defaults(handler=run)


def _files(args: argparse.Namespace) -> tuple[Any, list[tuple[str, Path]]]:
    from provisioner.daemon.run.target import resolve

    target = resolve(run_ref(args), args.config)
    files: list[tuple[str, Path]] = []
    if not args.no_daemon:
        files.append(("daemon", target.log))
    if args.worker and not target.local:  # its shipped lines (_Shipped), after the daemon's
        if args.no_daemon or not target.log.exists():
            files.clear()
    elif args.worker:
        wlog = target.workers_logs / f"{Path(args.worker).name}.log"
        if not wlog.is_file():
            known = sorted(p.stem for p in target.workers_logs.glob("*.log"))
            raise UserError(f"--worker {args.worker}: no such worker log in "
                            f"{target.workers_logs}" + (f" (workers: {', '.join(known[-5:])})"
                                                        if known else ""))
        files.append((args.worker, wlog))
    elif args.no_daemon:
        raise UserError("--no-daemon: give --worker ID too (the log to print instead)")
    if files and not any(p.exists() for _, p in files):
        raise UserError(f"{target.log}: no daemon log; a run writes one when started with "
                        f"`provision run --detach` (a foreground run's output is in its "
                        f"terminal); --worker ID prints a worker's")
    return target, files


def _tail(path: Path, lines: int | None) -> tuple[str, int]:
    """The text to print first and the offset after it."""
    try:
        data = path.read_bytes()
    except OSError:
        return "", 0
    text = data.decode(errors="replace")
    if lines is not None:
        text = "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""
    return text, len(data)


def _emit(out: TextIO, name: str, text: str, prefix: bool) -> None:
    if not text:
        return
    if prefix:
        text = "".join(f"[{name}] {ln}" for ln in text.splitlines(keepends=True))
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def run(args: argparse.Namespace) -> int:
    from provisioner.daemon.run.lock import held_by
    from provisioner.drivers.local import proc_start

    whole("--lines", args.lines, 0, 10_000_000, "e.g. -n 50 (the last 50 lines)")
    target, files = _files(args)
    shipped = _Shipped(target, args.worker) if args.worker and not target.local else None
    prefix = len(files) > 1 or shipped is not None
    offsets: dict[Path, int] = {}
    for name, path in files:
        text, offsets[path] = _tail(path, args.lines)
        _emit(sys.stdout, name, text, prefix)
    if shipped is not None:
        shipped.emit(args.lines)
    if not args.follow:
        return 0
    first = held_by(target.lock)
    if first is None:
        print(f"(no daemon runs {target.what}: nothing to follow)", file=sys.stderr)
        return 0
    last = time.monotonic()
    # the daemon (pid, kernel start time), read while it holds the lock (no pid without
    # /proc/locks: then following ends with the lock, as before)
    holder = (first, proc_start(first)) if first > 0 else None
    freed: float | None = None  # when its lock was first seen released
    while True:
        pid = held_by(target.lock)
        if pid is not None:
            if pid > 0 and (holder is None or holder[0] != pid):
                holder = (pid, proc_start(pid))
            freed = None
        elif freed is None:
            freed = time.monotonic()
        # the daemon releases its lock, then prints its end ("stopped: ..."): following ends
        # once its process is gone too (at most EXIT_WAIT_S after the lock; a zombie is
        # gone), so those lines are printed (on a loaded machine a poll found the lock free
        # before the print)
        running = pid is not None or (
            holder is not None and holder[1] is not None and freed is not None
            and time.monotonic() - freed < EXIT_WAIT_S and proc_start(holder[0]) == holder[1])
        for name, path in files:
            offsets[path] = _more(path, offsets.get(path, 0), name, prefix)
        if shipped is not None and (not running or time.monotonic() - last >= SHIPPED_POLL_S):
            shipped.emit(None)
            last = time.monotonic()
        if not running:
            return 0  # the daemon exited: its last lines are printed
        time.sleep(FOLLOW_POLL_S)


def _more(path: Path, offset: int, name: str, prefix: bool) -> int:
    """Print what ``path`` gained since ``offset`` (whole lines); returns the new offset."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return offset
    end = data.rfind(b"\n") + 1
    if end:
        _emit(sys.stdout, name, data[:end].decode(errors="replace"), prefix)
    return offset + end


class _Shipped:
    """A cloud worker's shipped lines (see the module docstring); :meth:`emit` prints the
    chunks not printed before."""

    def __init__(self, target: Any, worker: str) -> None:
        from provisioner.config import load_settings
        from provisioner.daemon.wiring import shipped_logs

        if target.config is None:
            raise UserError(f"--worker {worker}: a cloud worker's lines are in the run's "
                            f"artifacts; name the run with --config FILE (its [cloud] "
                            f"artifacts)")
        settings = load_settings(target.config)
        logs = shipped_logs(settings)
        if logs is None:
            raise UserError(f"--worker {worker}: [cloud] artifacts is unset in "
                            f"{target.config}, so no worker ships its lines; set it "
                            f"(docs/deploy.md, Logs and failed boots)")
        self.logs, self.target = logs, target
        self.iid = worker.rstrip("/")
        self.seen: set[str] = set()
        if not self.logs.units(self.iid):  # a worker name <instance id>/<gpu>: its instance
            head, _, tail = self.iid.rpartition("/")
            if head and tail.isdigit() and self.logs.units(head):
                self.iid = head
            else:
                raise UserError(f"--worker {worker}: no lines shipped by that instance in "
                                f"{settings.cloud.artifacts}" + self._known())

    def _known(self) -> str:
        from provisioner.daemon.state import State

        try:
            state = State.read_only(self.target.state)
        except Exception:  # noqa: BLE001 - only a hint
            return ""
        try:
            ids = [r.id for r in state.instances()]
        finally:
            state.close()
        return f" (the run's instances: {', '.join(ids[-5:])})" if ids else ""

    def emit(self, lines: int | None) -> None:
        """Print the chunks not printed yet (the last ``lines`` lines of each unit first)."""
        out: list[str] = []
        for unit, keys in sorted(self.logs.units(self.iid).items(),
                                 key=lambda kv: (kv[0] != "boot", kv[0])):
            new = [k for k in keys if k not in self.seen]
            text: list[str] = []
            for key in new:
                try:
                    text += self.logs.store.read(key).decode(errors="replace").splitlines()
                except KeyError:
                    continue
                self.seen.add(key)
            if lines is not None:
                text = text[-lines:] if lines > 0 else []
            out += [f"[{self.iid} {unit}] {ln}\n" for ln in text]
        if out:
            sys.stdout.write("".join(out))
            sys.stdout.flush()
