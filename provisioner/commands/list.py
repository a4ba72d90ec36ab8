"""``provision list`` (alias ``runs``): the runs on this machine, like ``sky status``.

Design: the registry (:mod:`provisioner.daemon.run.registry`, pruned of dead daemons as it is
read) says which daemons run and where their files are; each run's progress comes from its
own state file through :func:`provisioner.daemon.view.status.summary`, read-only, the reader
``provision status`` uses. The table fits the terminal, its run names and ids never cut
(:func:`provisioner.daemon.view.tables.runs_lines`); ``--json`` is one document (a list).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from provisioner.clio import add_json_flag, print_json


def register(sub: Any) -> None:
    p = sub.add_parser("list", aliases=["runs"], help="runs on this machine (pid, workdir, "
                       "job, progress)",
                       description="List the daemons running on this machine (started by "
                       "`provision run`, detached or not): pid, work directory, job, when "
                       "started and how far the job got. Entries of daemons that died are "
                       "dropped as they are read.")
    add_json_flag(p, help="JSON instead of a table")
    p.set_defaults(handler=run)


def _progress(state_path: str) -> dict[str, Any]:
    from provisioner.daemon.state import State
    from provisioner.daemon.view.status import summary
    from provisioner.errors import UserError

    try:
        st = State.read_only(state_path)
    except UserError:
        return {}  # starting: its state not written yet
    try:
        return summary(st, events=0)
    except Exception:  # noqa: BLE001 - a state being written; the list shows the rest
        return {}
    finally:
        st.close()


def rows() -> list[dict[str, Any]]:
    """One row per live run (see the module docstring)."""
    from provisioner.daemon.run import registry
    from provisioner.daemon.run.lock import held_by

    out = []
    for e in registry.entries():
        doc = _progress(e.state)
        ring = doc.get("ring") or {}
        out.append({"run": e.run_id, "name": e.name, "pid": e.pid, "alive": e.alive,
                    "holds_lock": held_by(Path(e.lock)) == e.pid,
                    "driver": e.driver, "workdir": e.workdir, "state": e.state, "log": e.log,
                    "started": e.started, "job": e.job, "config": e.config,
                    "epoch": ring.get("epoch"), "step": ring.get("step"),
                    "accuracy": ring.get("accuracy"), "metrics": ring.get("metrics"),
                    "world": ring.get("world"),
                    "fleet": len(doc.get("fleet") or []), "spend_usd": doc.get("spend_usd"),
                    "hours": doc.get("hours")})
    return out


def run(args: argparse.Namespace) -> int:
    import shutil

    from provisioner.daemon.view.tables import runs_lines

    runs = rows()
    if args.json:
        print_json(runs, indent=2)
        return 0
    if not runs:
        print("no runs on this machine (start one: provision run --detach)")
        return 0
    for line in runs_lines(runs, shutil.get_terminal_size((80, 24)).columns):
        print(line)
    return 0
