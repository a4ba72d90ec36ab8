"""Exceptions of the pricing package.

Design: SDK and parsing errors are translated into these at the edge (the sources), so
callers handle one family of exceptions whatever the cloud. Every message names what was
wrong and what would fix it.
"""

from __future__ import annotations


class PricingError(Exception):
    """Base class of every error raised by the pricing package."""


class CredentialsError(PricingError):
    """No usable cloud credentials; the message says how to configure them."""


class SourceError(PricingError):
    """A price source failed (API error, unreachable endpoint)."""


class TraceFormatError(PricingError):
    """A trace file is unreadable or malformed; the message names file, line and problem."""

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}")


class StoreError(PricingError):
    """The SQLite price store could not be opened or written."""
