"""The ``provision`` command line: ``prices | plan | simulate | run | status | list | logs |
down | revoke | completion``.

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


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, less the line that repeats the ``COMMAND`` metavar above the command list,
    with the commands aligned with the options, ``PATH...`` for ``PATH [PATH ...]`` and no
    line broken inside a hyphenated word, so the help of ``provision`` and of its commands
    fits 80 columns and reads well."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap  # argparse's own wrap, but never inside "cheapest-first" or a path

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False,
                             break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False)

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.nargs == argparse.ONE_OR_MORE:
            return "%s..." % self._metavar_formatter(action, default_metavar)(1)
        return super()._format_args(action, default_metavar)

    def _format_action(self, action: argparse.Action) -> str:
        text = super()._format_action(action)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            text = text.split("\n", 1)[1]
        return text

    def _iter_indented_subactions(self, action: argparse.Action):  # type: ignore[override]
        yield from getattr(action, "_get_subactions", list)()


def build_parser(prog: str = "provision") -> argparse.ArgumentParser:
    parser = clio.ArgumentParser(
        prog=prog, formatter_class=_HelpFormatter, add_help=False,
        usage="%(prog)s [-h] [--version] [-v] [--log-level LEVEL] [--json] COMMAND ...",
        # no epilog: with ten commands the help fits 80x24 only so (test_cli_conventions);
        # the exit codes are in this module's docstring and the README
        description="spotring: training on cheap, unreliable spot GPUs. Flags go anywhere.")
    # -h and --version in the usage line only: with twelve commands the help fits 80x24
    # only so (test_cli_conventions)
    parser.add_argument("-h", "--help", action="help", help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", help=argparse.SUPPRESS,
                        version=f"%(prog)s (spotring) {version()}")
    clio.add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", prog=prog)
    for name in COMMANDS:
        module = importlib.import_module(f"provisioner.commands.{name}")
        module.register(sub)
    for command in {id(c): c for c in sub.choices.values()}.values():  # an alias: once
        command.formatter_class = _HelpFormatter
        clio.add_global_flags(command, top=False)
    return parser


def _dispatch(argv: Sequence[str] | None, prog: str) -> int:
    parser = build_parser(prog)
    if "_ARGCOMPLETE" in os.environ:  # TAB pressed: answer from this parser and exit
        import argcomplete

        argcomplete.autocomplete(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = clio.merge_global_flags(parser.parse_args(argv))
    args.argv = argv  # the command line as typed (`provision run --detach` runs it again)
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
