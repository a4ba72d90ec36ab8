"""``provision completion bash|zsh|fish``: the shell code that makes TAB complete ``provision``.

Design: completion is argcomplete's: the printed code calls ``provision`` back with
``_ARGCOMPLETE`` set, and :func:`provisioner.cli.main` answers from the same parser that parses
real command lines, so commands, flags, choices and file paths complete without a second list
to keep in step. This command only prints argcomplete's shell code for the named shell.

Use: ``eval "$(provision completion bash)"`` in ``~/.bashrc`` (``zsh``: ``~/.zshrc``;
fish: ``provision completion fish | source``).
"""

from __future__ import annotations

import argparse
from typing import Any

from provisioner.errors import UserError

SHELLS = ("bash", "zsh", "fish")


def register(sub: Any) -> None:
    p = sub.add_parser("completion", help="print shell code for TAB completion",
                       description="Print the code that makes TAB complete provision's "
                       "commands, flags and paths. Add to ~/.bashrc: "
                       'eval "$(provision completion bash)"; for zsh the same with zsh in '
                       "~/.zshrc; fish: provision completion fish | source.")
    p.add_argument("shell", choices=SHELLS, help="the shell to print code for")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        import argcomplete
    except ImportError:
        raise UserError("shell completion needs argcomplete: pip install argcomplete") from None
    print(argcomplete.shellcode(["provision"], shell=args.shell))
    return 0
