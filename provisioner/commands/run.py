"""``provision run``: the daemon, on the embedded local cloud (default) or on AWS/GCP.

Design: argparse only. Flags are checked here; the run itself is
:class:`provisioner.daemon.local.LocalRun` (no ``--config``, or ``[cloud] driver =
"local"``) or :func:`provisioner.daemon.cloud.run_cloud`, both wired by
:mod:`provisioner.daemon.wiring`.

Rule: bad flags are a UserError (one line, exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import logging
import re
from typing import Any

from provisioner.clio import EXIT_INTERRUPTED
from provisioner.config import load_settings, parse_settings
from provisioner.errors import UserError

log = logging.getLogger(__name__)



def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run the provisioning daemon (default: the local main job)",
                       description="Run the daemon. With no --config: the embedded local cloud "
                       "trains examples/digits.py on worker processes while prices and "
                       "revocations come from a trace or the built-in generator.")
    p.add_argument("--config", help="TOML settings (default: the embedded local cloud)")
    p.add_argument("--trace", action="extend", nargs="+", metavar="PATH",
                   help="price/availability trace files or folders; default: the "
                   "built-in generator")
    p.add_argument("--speed", type=float, help="simulated seconds per real second "
                   "(default local.speed, 60)")
    p.add_argument("--until-epochs", type=int, metavar="N", help="stop after N epochs")
    p.add_argument("--duration", metavar="T", help="stop after T simulated time (e.g. 90m, 2h)")
    p.add_argument("--report", metavar="DIR", help="report directory (default WORKDIR/report)")
    p.add_argument("--workdir", help="state, worker logs, report (local run; default "
                   "local.state_dir, ./spotring-run)")
    p.add_argument("--on-exit", choices=("keep", "terminate"),
                   help="what happens to the fleet at exit (local default: terminate)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--seed", type=int, default=7, help="seed of the built-in generator")
    p.add_argument("--outages-per-hour", type=float, metavar="R",
                   help="built-in generator: capacity outages per offering per simulated hour "
                   "(default 0.3; 0 = revocations only from `provision revoke`)")
    p.add_argument("--max-size", type=int, help="most workers (local default 3)")
    p.add_argument("--no-dashboard", action="store_true", help="log lines instead of the "
                   "live dashboard")
    p.add_argument("--record-samples", action="store_true",
                   help="workers record the sample ids of every step (exactly-once check)")
    p.set_defaults(handler=run)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds. Raises UserError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--duration {text!r}: expected a positive time such as 90s, 15m, 2h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "verbose", 0):
        # a coalesced run skipped on a busy machine is expected (max_instances=1), not news
        logging.getLogger("apscheduler").setLevel(logging.ERROR)
    if args.speed is not None and not args.speed > 0:
        raise UserError(f"--speed {args.speed}: must be > 0")
    if args.until_epochs is not None and args.until_epochs < 1:
        raise UserError(f"--until-epochs {args.until_epochs}: must be >= 1")
    if args.config is None:
        fleet: dict[str, Any] = {"max_size": args.max_size or 3, "markets": ["spot"]}
        settings = parse_settings({"fleet": fleet}, origin="<built-in local defaults>")
    else:
        settings = load_settings(args.config)
    duration = parse_duration(args.duration) if args.duration else None
    if settings.cloud.driver == "local":
        from provisioner.daemon.local import LocalRun

        local = LocalRun(settings, args, duration)
        code = local.run()
        return EXIT_INTERRUPTED if local.interrupted else code
    from provisioner.daemon.cloud import run_cloud

    return run_cloud(settings, args, duration)
