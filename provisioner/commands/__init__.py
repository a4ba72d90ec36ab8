"""Subcommands of ``provision``: one module each, exposing ``register(subparsers)``.

Each module adds its parser with ``set_defaults(handler=run)`` where ``run(args) -> int``.
``run_terminal`` is not a command: it is what ``provision run`` shows in its terminal.
"""

COMMANDS = ("prices", "plan", "simulate", "run", "check", "status", "list", "logs", "stop",
            "down", "revoke", "completion")
