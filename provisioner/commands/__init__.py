"""Subcommands of ``provision``: one module each, exposing ``register(subparsers)``.

Each module adds its parser with ``set_defaults(handler=run)`` where ``run(args) -> int``.
"""

COMMANDS = ("prices", "plan", "simulate", "run", "status", "list", "logs", "down", "revoke",
            "completion")
