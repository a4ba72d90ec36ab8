"""The ``provision`` command line: ``prices | plan | simulate | run | status | revoke | completion``.

Design: this module only builds the parser and maps outcomes to exit codes; each command
lives in ``provisioner/commands/<name>.py`` with ``register(subparsers)``, so commands are
added without touching each other, and the conventions every command shares (``--json``,
pipes, Ctrl-C, global flags) are :mod:`provisioner.clio`'s. Exit codes: 0 done; 2 bad input
(one line on stderr naming the field and the fix, no traceback: a bad config, trace or flag,
no credentials, a cloud SDK whose extra is not installed); 130 Ctrl-C; 141 stdout closed by
its reader. ``python -m provisioner`` is the same program.

Rule: building the parser imports no heavy module (torch, scipy, the cloud SDKs): ``--help``,
``--version`` and TAB completion run it on every call.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Sequence

from pricing.errors import CredentialsError as PricingCredentialsError
from pricing.errors import TraceFormatError
from provisioner import clio
from provisioner.commands import COMMANDS
from provisioner.errors import UserError


def version() -> str:
    """The installed distribution's version ("unknown" when run from a bare source tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("spotring")
    except PackageNotFoundError:
        return "unknown"


def build_parser(prog: str = "provision") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="spotring: train on cheap, unreliable spot GPUs. "
        "Prices and risk, a cost/throughput optimiser, cloud drivers and an elastic ring.",
        epilog=f"`{prog} COMMAND --help` tells more. Exit codes: 0 done, 2 bad input "
        "(one line says what to fix), 130 interrupted.")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s (spotring) {version()}")
    clio.add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        module = importlib.import_module(f"provisioner.commands.{name}")
        module.register(sub)
    for command in sub.choices.values():
        clio.add_global_flags(command, top=False)
    return parser


def _dispatch(argv: Sequence[str] | None, prog: str) -> int:
    parser = build_parser(prog)
    if "_ARGCOMPLETE" in os.environ:  # TAB pressed: answer from this parser and exit
        import argcomplete

        argcomplete.autocomplete(parser)
    args = clio.merge_global_flags(parser.parse_args(argv))
    logging.basicConfig(level=clio.log_level(args), format=clio.LOG_FORMAT)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return clio.EXIT_USAGE
    command = sub_parser(parser, args.command)
    if args.json and not clio.has_json_flag(command):
        print(f"{prog} {args.command}: error: --json: this command has no JSON output",
              file=sys.stderr)
        return clio.EXIT_USAGE
    try:
        return int(handler(args) or 0)
    except (UserError, PricingCredentialsError, TraceFormatError) as exc:
        print(f"{prog} {args.command}: error: {exc}", file=sys.stderr)
        return clio.EXIT_USAGE
    except ImportError as exc:
        message = clio.missing_extra(exc)
        if message is None:
            raise
        print(f"{prog} {args.command}: error: {message}", file=sys.stderr)
        return clio.EXIT_USAGE


def sub_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of command ``name``."""
    for action in parser._subparsers._group_actions:  # noqa: SLF001 - argparse has no public view
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action.choices[name]
    raise KeyError(name)


def main(argv: Sequence[str] | None = None, prog: str = "provision") -> int:
    """Run ``provision`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    return clio.guarded(lambda: _dispatch(argv, prog))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
