"""The ``provision`` command line: ``run | plan | prices | simulate | status | revoke``.

Design: this module only builds the parser and maps errors to exit codes; each subcommand
lives in ``provisioner/commands/<name>.py`` with ``register(subparsers)``, so commands are
added without touching each other. User errors (bad config, no credentials, bad trace) print
one line to stderr and exit 2 with no traceback; interrupted runs exit 130.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from pricing.errors import CredentialsError as PricingCredentialsError
from pricing.errors import TraceFormatError
from provisioner.commands import COMMANDS
from provisioner.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provision",
        description="spotring: train on cheap, unreliable spot GPUs. "
        "Prices and risk, a cost/throughput optimiser, cloud drivers and an elastic ring.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"provisioner.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"provisioner.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except (UserError, PricingCredentialsError, TraceFormatError) as exc:
        print(f"provision {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"provision {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
