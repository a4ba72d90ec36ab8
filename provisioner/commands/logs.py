"""``provision logs [RUN] [-f] [--worker ID]``: a run's daemon log, and a worker's,
like ``sky logs`` and ``docker logs``.

Design: the files are the run's own (:mod:`provisioner.daemon.run.target`: ``WORKDIR/daemon.log``
of a detached run, ``WORKDIR/cloud/logs/<ID>.log`` of a local worker); this command only
reads them. ``-f`` follows while the run's daemon holds its lock
(:func:`provisioner.daemon.run.lock.held_by`, read from ``/proc/locks``: following never takes the
lock) and ends, after printing what is left, when the daemon exits, as ``sky logs`` ends with
its job; Ctrl-C ends it sooner (exit 130, quietly). With two files each line is prefixed with
where it comes from.
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


def register(sub: Any) -> None:
    p = sub.add_parser("logs", help="print (-f: follow) a run's daemon log, or a worker's",
                       description="Print the daemon log of a run (started with `provision "
                       "run --detach`) and, with --worker, a local worker's log. -f follows "
                       "until the daemon exits.")
    add_run_flags(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until "
                   "the daemon exits (Ctrl-C to stop)")
    p.add_argument("--worker", metavar="ID", help="also (with --worker only: just) this local "
                   "worker's log (ids: `provision status`)")
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
    if args.worker:
        if not target.local:
            raise UserError(f"--worker {args.worker}: a cloud worker's log is on its VM "
                            f"(journalctl -u spotring-worker there; see docs/deploy.md)")
        wlog = target.workers_logs / f"{Path(args.worker).name}.log"
        if not wlog.is_file():
            known = sorted(p.stem for p in target.workers_logs.glob("*.log"))
            raise UserError(f"--worker {args.worker}: no such worker log in "
                            f"{target.workers_logs}" + (f" (workers: {', '.join(known[-5:])})"
                                                        if known else ""))
        files.append((args.worker, wlog))
    elif args.no_daemon:
        raise UserError("--no-daemon: give --worker ID too (the log to print instead)")
    if not any(p.exists() for _, p in files):
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

    whole("--lines", args.lines, 0, 10_000_000, "e.g. -n 50 (the last 50 lines)")
    target, files = _files(args)
    prefix = len(files) > 1
    offsets: dict[Path, int] = {}
    for name, path in files:
        text, offsets[path] = _tail(path, args.lines)
        _emit(sys.stdout, name, text, prefix)
    if not args.follow:
        return 0
    if held_by(target.lock) is None:
        print(f"(no daemon runs {target.what}: nothing to follow)", file=sys.stderr)
        return 0
    while True:
        running = held_by(target.lock) is not None
        for name, path in files:
            offsets[path] = _more(path, offsets.get(path, 0), name, prefix)
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
