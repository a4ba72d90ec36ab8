"""``provision status``: the fleet, the cost so far and the recent events, from the state file.

Design: read-only over :class:`provisioner.daemon.state.State` (:meth:`State.read_only`: the
file is opened ``mode=ro``, and it reads while a daemon writes); it never writes to the file
it reads, and makes no cloud call. "Now" is the newest time the daemon recorded (the daemon's
clock may be simulated), so the cost is the spend up to that moment. ``--json`` is plain JSON
(no ``Infinity``: :func:`provisioner.clio.print_json`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from provisioner.clio import add_json_flag, print_json


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="fleet, cost so far and recent events of a run",
                       description="Show the fleet, the cost so far and recent events from "
                       "the daemon's state file.")
    p.add_argument("--config", help="settings (its daemon.state_path is read)")
    p.add_argument("--state", help="state file (default: WORKDIR/state.sqlite)")
    p.add_argument("--workdir", default="spotring-run", help="the local run's work directory")
    p.add_argument("--events", type=int, default=12, help="recent events shown")
    add_json_flag(p, help="JSON instead of tables")
    p.set_defaults(handler=run)


def _state_path(args: argparse.Namespace) -> Path:
    if args.state:
        return Path(args.state)
    if args.config:
        from provisioner.config import load_settings

        return Path(load_settings(args.config).daemon.state_path)
    return Path(args.workdir) / "state.sqlite"


def run(args: argparse.Namespace) -> int:
    from provisioner.daemon.state import State
    from provisioner.daemon.view.status import summary

    path = _state_path(args)
    state = State.read_only(path)
    try:
        doc = summary(state, events=args.events)
    finally:
        state.close()
    if args.json:
        print_json(doc, indent=2)
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    ring = doc["ring"]
    con.print(f"[b]{doc['job'].get('id', '?')}[/b] on {doc['job'].get('driver', '?')}: "
              f"{doc['hours']:.2f} h, spend ${doc['spend_usd']:.4f}"
              + (f" (ended: {doc['outcome'] or 'finished'})" if doc["finished"] else "")
              + (f"; ring step {ring.get('step')}, epoch {ring.get('epoch')}, steps lost "
                 f"{ring.get('steps_lost')}" if ring else ""))
    fleet = Table(title=f"fleet ({len(doc['fleet'])})")
    for col in ("id", "offering", "state", "hours"):
        fleet.add_column(col)
    for r in doc["fleet"]:
        fleet.add_row(r["id"], r["offering"], r["state"], f"{r['hours']:.2f}")
    con.print(fleet)
    ev = Table(title="recent events")
    for col in ("hours", "event", "instance", "detail"):
        ev.add_column(col)
    for e in doc["events"]:
        ev.add_row(f"{e['hours']:.3f}", e["kind"], e["instance"] or "", (e["detail"] or "")[:90])
    con.print(ev)
    return 0
