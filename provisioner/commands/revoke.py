"""``provision revoke [RUN] ID``: revoke one local instance now (demos and tests).

Design: the local driver's state directory is shared by processes; this command leaves a
request there that the running daemon's driver carries out on its simulated clock: a notice
(SIGTERM, the worker drains at its step boundary, SIGKILL when the window ends) or, with
``--kill``, a kill without notice. Only the local driver has this verb: a real cloud revokes
on its own. The run is named as every command names one (``RUN``, default ./spotring-run or
the one run on this machine; :func:`provisioner.clio.add_run_flags`).
"""

from __future__ import annotations

import argparse
from typing import Any

from provisioner.clio import RUN_HELP, add_run_flags, bounded, run_ref
from provisioner.errors import UserError

#: The longest notice window a request may ask for (simulated seconds): a day.
MAX_WINDOW_S = 86_400.0


def register(sub: Any) -> None:
    p = sub.add_parser("revoke", help="revoke a local instance (notice, or --kill)",
                       description="Revoke one instance of a local run: a notice then a kill "
                       "when the notice window ends, or --kill at once.")
    p.add_argument("ids", nargs="+", metavar="[RUN] ID", help="the instance id (see `provision "
                   f"status`), after the run it belongs to: {RUN_HELP}")
    add_run_flags(p, positional=False)
    p.add_argument("--kill", action="store_true", help="kill without notice")
    p.add_argument("--window", type=float, metavar="S",
                   help="notice window in simulated seconds (default local.notice_window_s)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from provisioner.daemon.run.target import resolve
    from provisioner.drivers.local import LocalDriver

    bounded("--window", args.window, 0, MAX_WINDOW_S, "e.g. --window 120 (AWS gives 120 s)")
    if len(args.ids) > 2:
        raise UserError(f"{' '.join(args.ids)}: give the instance id, after the run it "
                        f"belongs to if not the default (provision revoke [RUN] ID)")
    ref, instance = (args.ids[0], args.ids[1]) if len(args.ids) == 2 else (None, args.ids[0])
    if ref is not None and run_ref(args) is not None:
        raise UserError(f"{ref}: the run is named twice (and by --workdir); give one")
    target = resolve(ref or run_ref(args), args.config)
    cloud = target.root / "cloud"
    if not target.local or not (cloud / "instances").is_dir():
        raise UserError(f"{target.what}: no local run there (provision revoke works on the "
                        f"local cloud; a real cloud revokes on its own)")
    driver = LocalDriver(cloud, lambda spec: [])
    if not driver.request_revoke(instance, hard=args.kill, window_s=args.window):
        raise UserError(f"{instance}: no live local instance with that id in {target.root} "
                        f"(see `provision status {target.root}`)")
    print(f"{'kill' if args.kill else 'notice'} requested for {instance}; the running "
          f"daemon delivers it within one notice period")
    return 0
