"""``provision revoke ID``: revoke one local instance now (demos and tests).

Design: the local driver's state directory is shared by processes; this command leaves a
request there that the running daemon's driver carries out on its simulated clock: a notice
(SIGTERM, the worker drains at its step boundary, SIGKILL when the window ends) or, with
``--kill``, a kill without notice. Only the local driver has this verb: a real cloud revokes
on its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from provisioner.errors import UserError


def register(sub: Any) -> None:
    p = sub.add_parser("revoke", help="revoke a local instance (notice, or --kill)",
                       description="Revoke one instance of the local driver: a notice then a "
                       "kill when the notice window ends, or --kill at once.")
    p.add_argument("instance_id", metavar="ID", help="instance id (see `provision status`)")
    p.add_argument("--kill", action="store_true", help="kill without notice")
    p.add_argument("--window", type=float, metavar="S",
                   help="notice window in simulated seconds (default local.notice_window_s)")
    p.add_argument("--workdir", default="spotring-run", help="the run's work directory")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from provisioner.drivers.local import LocalDriver

    cloud = Path(args.workdir) / "cloud"
    if not (cloud / "instances").is_dir():
        raise UserError(f"--workdir {args.workdir}: no local run there (start one with "
                        f"`provision run --workdir {args.workdir}`)")
    if args.window is not None and args.window < 0:
        raise UserError(f"--window {args.window}: must be >= 0")
    driver = LocalDriver(cloud, lambda spec: [])
    if not driver.request_revoke(args.instance_id, hard=args.kill, window_s=args.window):
        raise UserError(f"{args.instance_id}: no live local instance with that id in "
                        f"{args.workdir} (see `provision status --workdir {args.workdir}`)")
    print(f"{'kill' if args.kill else 'notice'} requested for {args.instance_id}; the running "
          f"daemon delivers it within one notice period")
    return 0
