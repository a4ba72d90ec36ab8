"""What every ``provision`` command does the same way: JSON out, pipes, Ctrl-C, global flags.

Design: the command modules stay argparse and wiring; the conventions users expect of any
command-line tool live here once, so no command re-implements (or forgets) them:

* ``--json`` output goes through :func:`print_json`: one document, non-finite floats
  (``inf``, ``nan``) written as ``null``, and ``allow_nan=False`` so that a value missed by
  that rule fails loudly instead of printing ``Infinity``, which is not JSON.
* :func:`guarded` runs the whole command: Ctrl-C ends it with exit code 130 and prints
  nothing (the shell already shows ``^C``); a reader that closes the pipe early
  (``provision prices --json | head -1``) ends it with 141, like a tool killed by SIGPIPE,
  with no traceback: the recipe of the Python docs' "Note on SIGPIPE", stdout pointed at
  /dev/null so the interpreter's last flush has nowhere to fail. A BrokenPipeError of any
  other pipe or socket is a real error and keeps its traceback.
* Global flags (``-v``, ``--log-level``, ``--json``) are accepted before or after the
  command name: :func:`add_global_flags` adds them to the top parser and to every command's
  parser; :func:`merge_global_flags` folds the two into one value each.
* Bad input is ONE line naming the flag and the fix, exit code 2: :class:`ArgumentParser`
  makes argparse's own errors (a missing argument, ``--events 1e9`` for a whole number) one
  line too, and :func:`bounded`, :func:`whole` and :func:`one_of` check what argparse
  cannot (every number finite and within a bound that names the fix; a value from a known
  set), before anything changes.
* :func:`missing_extra` turns the ImportError of an optional cloud SDK (boto3, the Google
  clients, which the ``spotring[aws]`` and ``spotring[gcp]`` extras install) into the one
  line that names the extra.

Rule for commands: print ``--json`` output only with :func:`print_json`; declare ``--json``
with :func:`add_json_flag` (so ``provision --json CMD`` and ``provision CMD --json`` mean the
same); return one of the ``EXIT_*`` codes. A command may catch KeyboardInterrupt to drain
what it started, then return :data:`EXIT_INTERRUPTED` (or re-raise).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from typing import Any, Callable, Iterable, NoReturn

from provisioner.errors import UserError

EXIT_OK = 0
EXIT_USAGE = 2
"""Bad input the user can fix: one line on stderr naming the field and the fix."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), as shells report a program ended by it."""
EXIT_BROKEN_PIPE = 141
"""stdout closed by its reader (128 + SIGPIPE), as shells report ``yes | head -1``'s ``yes``."""

#: Optional SDKs -> the extra that installs them (pyproject.toml [project.optional-dependencies]).
EXTRAS = {"boto3": "aws", "botocore": "aws", "google": "gcp"}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# --- JSON -------------------------------------------------------------------------------------

def finite(value: Any) -> Any:
    """``value`` with every non-finite float (``inf``, ``-inf``, ``nan``) replaced by None,
    through dicts, lists and tuples (tuples become lists, as JSON has them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(value)`` with ``allow_nan=False``: valid JSON or an
    error, never ``Infinity``/``NaN``. Keyword arguments go to ``json.dumps``."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def print_json(value: Any, **kwargs: Any) -> None:
    """Print ``value`` as one JSON document on stdout (see :func:`dumps`)."""
    print(dumps(value, **kwargs))


# --- bad input --------------------------------------------------------------------------------

class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, ``PROG: error: MESSAGE (see PROG
    --help)``, exit code 2 (argparse prints its whole usage first)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def bounded(flag: str, value: float | None, low: float, high: float, fix: str, *,
            low_open: bool = False) -> None:
    """Nothing when ``value`` is None or a finite number within ``[low, high]`` (``(low,
    high]`` with ``low_open``). Raises UserError naming ``flag``, the bound and ``fix``."""
    if value is None:
        return
    ok = (isinstance(value, (int, float)) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        side = f"> {low:g}" if low_open else f">= {low:g}"
        raise UserError(f"{flag} {value:g}: must be a finite number {side} and <= {high:g}; "
                        f"{fix}")


def whole(flag: str, value: int | None, low: int, high: int, fix: str) -> None:
    """Nothing when ``value`` is None or a whole number within ``[low, high]``. Raises
    UserError naming ``flag``, the bound and ``fix``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{flag} {value}: must be a whole number from {low} to {high}; {fix}")


def one_of(flag: str, value: str, allowed: Iterable[str], fix: str = "") -> str:
    """``value`` when it is one of ``allowed`` (compared without case; returned as
    ``allowed`` spells it). Raises UserError naming ``flag``, a few of ``allowed`` and
    ``fix``."""
    known = {a.lower(): a for a in allowed}
    hit = known.get(value.strip().lower())
    if hit is None:
        shown = sorted(known.values())
        names = ", ".join(shown[:12]) + (f" (and {len(shown) - 12} more)" if len(shown) > 12
                                         else "")
        raise UserError(f"{flag} {value}: not one of {names}" + (f"; {fix}" if fix else ""))
    return hit


# --- naming a run --------------------------------------------------------------------------

RUN_HELP = ("the run: its --name, a run id or pid of `provision list`, its work directory or "
            "state file (default: ./spotring-run, or the one run on this machine)")


def add_run_flags(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """The one way a command names a run: ``RUN`` (see :data:`RUN_HELP`) and ``--config
    FILE`` for a cloud run; ``--workdir DIR`` and ``--state FILE`` are kept, unlisted, as
    older spellings of ``RUN``. Read them back with :func:`run_ref`."""
    if positional:
        parser.add_argument("run", nargs="?", metavar="RUN", help=RUN_HELP)
    parser.add_argument("--config", metavar="FILE", help="a cloud run's settings (its "
                        "daemon.state_path and driver)")
    parser.add_argument("--workdir", dest="run_workdir", help=argparse.SUPPRESS)
    parser.add_argument("--state", dest="run_state", help=argparse.SUPPRESS)


def run_ref(args: argparse.Namespace) -> str | None:
    """The run the command line names (None: the default). Raises UserError when it names
    two."""
    given = [v for v in (getattr(args, "run", None), getattr(args, "run_workdir", None),
                         getattr(args, "run_state", None)) if v]
    if len(set(given)) > 1:
        raise UserError(f"RUN: named twice ({', '.join(given)}); give one")
    return given[0] if given else None


# --- global flags -----------------------------------------------------------------------------

def add_json_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """Declare ``--json`` on a command. Its default is SUPPRESS so a command's parser does not
    reset a ``--json`` given before the command name (``provision --json CMD``)."""
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=help)


def has_json_flag(parser: argparse.ArgumentParser) -> bool:
    """Whether the command's parser declares ``--json``."""
    return "--json" in parser._option_string_actions  # noqa: SLF001 - argparse has no public view


def add_global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Add ``-v`` and ``--log-level`` (and, on the top parser, ``--json``) to ``parser``.

    On a command's parser (``top=False``) the flags write to their own destinations with
    SUPPRESS defaults, so flags before the command name are not overwritten by the command's
    defaults; :func:`merge_global_flags` combines them after parsing.
    """
    group = parser if top else parser.add_argument_group("global options (also before the "
                                                          "command)")
    suffix = "" if top else "_here"
    group.add_argument("-v", "--verbose", action="count", dest="verbose" + suffix,
                       default=0 if top else argparse.SUPPRESS,
                       help="more logging: -v info, -vv debug")
    group.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                       dest="log_level" + suffix, default=None if top else argparse.SUPPRESS,
                       help=f"{', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]} (wins over -v)")
    if top:
        group.add_argument("--json", action="store_true", default=False,
                           help="JSON output, for the commands that have it")


def merge_global_flags(args: argparse.Namespace) -> argparse.Namespace:
    """Fold the flags given after the command name into those given before it: ``-v`` counts
    add up, the last ``--log-level`` wins. Returns ``args`` (changed in place)."""
    ns = vars(args)
    ns["verbose"] = ns.get("verbose", 0) + ns.pop("verbose_here", 0)
    if "log_level_here" in ns:
        ns["log_level"] = ns.pop("log_level_here")
    return args


def log_level(args: argparse.Namespace) -> int:
    """The logging threshold the flags ask for: ``--log-level``, else WARNING/INFO/DEBUG by
    the number of ``-v``."""
    if getattr(args, "log_level", None):
        return getattr(logging, args.log_level)
    return [logging.WARNING, logging.INFO, logging.DEBUG][min(getattr(args, "verbose", 0), 2)]


# --- errors and exits -------------------------------------------------------------------------

def missing_extra(exc: ImportError) -> str | None:
    """If ``exc`` is an optional cloud SDK that is not installed, the one line that says which
    extra installs it; else None (a real bug: let it raise)."""
    root = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(root)
    if extra is None:
        return None
    return (f"this needs the {extra.upper()} SDK ({exc.name} is not installed): "
            f"pip install 'spotring[{extra}]'")


def guarded(run: Callable[[], int]) -> int:
    """Run a command and return its exit code, ending quietly on Ctrl-C (130) or a closed
    stdout pipe (141). ``run`` is the whole command, parsing included."""
    try:
        code = run()
        sys.stdout.flush()  # inside the try: a closed pipe shows up here, not at exit
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        fd = _stdout_fd()
        if fd is not None and not _reader_gone(fd):
            raise  # another pipe or socket broke (a worker, a cloud API): a real error
        if fd is not None:
            _to_devnull(fd)
        return EXIT_BROKEN_PIPE


def _stdout_fd() -> int | None:
    try:
        return sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or replaced stdout (tests)
        return None


def _reader_gone(fd: int) -> bool:
    """Whether ``fd`` is a pipe whose reading end was closed (poll reports an error on it)."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _to_devnull(fd: int) -> None:
    """Point ``fd`` (stdout) at /dev/null so the interpreter's final flush of the buffered
    output succeeds silently (Python docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
