"""``provision down [RUN]``: terminate the fleet a run left (``--on-exit keep``).

Design: argparse only; the work is :func:`provisioner.daemon.run.down.down` (the run's lock
taken as a daemon takes it, the instances ended through the daemon's write-ahead actuator
and driver). Refused with one line, exit 2, while a daemon holds the run.
"""

from __future__ import annotations

import argparse
from typing import Any

from provisioner.clio import add_json_flag, add_run_flags, print_json, run_ref


def register(sub: Any) -> None:
    p = sub.add_parser("down", help="terminate the fleet a stopped run kept (--on-exit keep)",
                       description="Terminate every instance a run left running after its "
                       "daemon stopped (`provision run --on-exit keep`, or a daemon that "
                       "died), through its driver, and record it in the run's state. Refused "
                       "while a daemon runs it (stop it first: provision stop RUN).")
    add_run_flags(p)
    add_json_flag(p, help="JSON instead of a line")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from provisioner.daemon.run.down import down
    from provisioner.daemon.run.target import resolve

    target = resolve(run_ref(args), args.config)
    done = down(target)
    if args.json:
        print_json({"job": done.job, "terminated": list(done.terminated),
                    "spend_usd": round(done.spend_usd, 6), "state": str(target.state)})
        return 0
    if not done.terminated:
        print(f"nothing to terminate: no instance of {done.job} is left ({target.what})")
    else:
        print(f"terminated {len(done.terminated)} instance(s) of {done.job}: "
              f"{', '.join(done.terminated)}; spend ${done.spend_usd:.4f} ({target.what})")
    return 0
