"""``provision status [RUN]``: the fleet, the cost so far, the progress and the recent events
of a run, from its state file.

Design: read-only over :class:`provisioner.daemon.state.State` (:meth:`State.read_only`: the
file is opened ``mode=ro``, and it reads while a daemon writes); it never writes to the file
it reads, and makes no cloud call. The run is named as every command names one
(:func:`provisioner.clio.add_run_flags`: its ``--name``, id, pid, work directory or state
file; ``--config`` for a cloud run). "Now" is the newest time the daemon recorded (its clock
may be simulated), so the cost is the spend up to that moment. The text fits the terminal
(:func:`provisioner.daemon.view.tables.status_lines`); ``--json`` is plain JSON (no
``Infinity``: :func:`provisioner.clio.print_json`).
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any

from provisioner.clio import add_json_flag, add_run_flags, print_json, run_ref, whole

MAX_EVENTS = 1000


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="fleet, cost so far, progress and recent events of a run",
                       description="Show a run's fleet, cost so far, progress and recent "
                       "events from its state file (read only, while it runs or after).")
    add_run_flags(p)
    p.add_argument("--events", type=int, default=12, metavar="N",
                   help="recent events shown (default 12)")
    add_json_flag(p, help="JSON instead of text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from provisioner.daemon.run.target import resolve
    from provisioner.daemon.state import State
    from provisioner.daemon.view.status import summary
    from provisioner.daemon.view.tables import status_lines

    whole("--events", args.events, 0, MAX_EVENTS, "e.g. --events 12")
    target = resolve(run_ref(args), args.config)
    state = State.read_only(target.state)
    try:
        doc = summary(state, events=args.events)
    finally:
        state.close()
    if args.json:
        print_json(doc, indent=2)
        return 0
    for line in status_lines(doc, shutil.get_terminal_size((80, 24)).columns):
        print(line)
    return 0
