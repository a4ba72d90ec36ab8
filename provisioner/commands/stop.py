"""``provision stop [RUN]``: stop a run's daemon as Ctrl-C in its terminal would, from
anywhere (a detached run has no terminal).

Design: the daemon that runs ``RUN`` is the holder of its lock
(:func:`provisioner.daemon.run.lock.held_by`, read from ``/proc/locks``: asking never takes
the lock); it gets SIGINT, drains, stops its fleet (terminated, or kept with ``--on-exit
keep``), writes its report and exits. ``stop`` waits for that (until the lock is free), then
says how the run ended, read from its state; ``--no-wait`` returns at once. A run no daemon
runs is said so (exit 0: there is nothing left to stop); its kept fleet, if any, is ended by
``provision down``.

Rule: only ever signal the lock's holder, and only SIGINT (the daemon's own clean stop).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

from provisioner.clio import add_run_flags, bounded, run_ref
from provisioner.errors import UserError

#: How often the wait looks whether the daemon has let go of the run's lock.
POLL_S = 0.2
#: The longest ``--timeout``: a draining fleet takes minutes, not days.
MAX_TIMEOUT_S = 86_400.0


def register(sub: Any) -> None:
    p = sub.add_parser("stop", help="stop a run's daemon as Ctrl-C would (it drains first)",
                       description="Stop the daemon of a run as Ctrl-C in its "
                       "terminal would: it drains, terminates its fleet (or keeps it with "
                       "--on-exit keep), writes its report and exits. Waits for that unless "
                       "--no-wait.")
    add_run_flags(p)
    p.add_argument("--no-wait", action="store_true", help="return once the daemon was asked")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="give up waiting after S seconds (default 600; the daemon goes on "
                   "stopping)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from provisioner.daemon.run.lock import held_by
    from provisioner.daemon.run.target import resolve

    bounded("--timeout", args.timeout, 0, MAX_TIMEOUT_S, "e.g. --timeout 600", low_open=True)
    target = resolve(run_ref(args), args.config)
    pid = held_by(target.lock)
    if pid is None:
        print(f"no daemon runs {target.what}: nothing to stop"
              + (f" (a fleet it kept: provision down {target.root})" if target.local else ""))
        return 0
    if pid <= 0:
        raise UserError(f"{target.what}: its lock is held but its holder is unknown (no "
                        f"/proc/locks here); stop it where it runs (Ctrl-C)")
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        print(f"no daemon runs {target.what}: it exited just now")
        return 0
    except PermissionError:
        raise UserError(f"{target.what}: its daemon (pid {pid}) belongs to another user; stop "
                        f"it as that user") from None
    if args.no_wait:
        print(f"asked the daemon of {target.what} (pid {pid}) to stop; it drains, stops its "
              f"fleet and exits (provision logs {target.root} -f follows it)")
        return 0
    deadline = time.monotonic() + args.timeout
    while held_by(target.lock) == pid:
        if time.monotonic() > deadline:
            raise UserError(f"{target.what}: its daemon (pid {pid}) is still stopping after "
                            f"--timeout {args.timeout:g} s; it goes on (provision logs "
                            f"{target.root} -f), or give a longer --timeout")
        time.sleep(POLL_S)
    print(f"stopped {target.what} (pid {pid}): {_ended(target)}")
    return 0


def _ended(target: Any) -> str:
    """How the run ended, as its state says."""
    from provisioner.daemon.state import State

    try:
        st = State.read_only(target.state)
    except UserError:
        return "its state is not there"
    try:
        ended = (st.get_meta("run") or {}).get("ended") or {}
    finally:
        st.close()
    if not ended:
        return "it exited without recording an end (its log says why)"
    fleet = ("its fleet kept: provision down " + str(target.root) if ended.get("fleet_kept")
             else "its fleet terminated")
    return f"{ended.get('reason') or ended.get('outcome')}, {fleet}"
