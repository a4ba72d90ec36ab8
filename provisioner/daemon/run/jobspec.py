"""Which job a run trains (``provision run --job``, else ``[job] job_file``), checked before
anything starts.

Design: a job is a ``.py`` file or an importable module defining ``make_job(seed)``
(:mod:`trainer.job`). :func:`check_job` reads the file's syntax tree (``ast``) instead of
importing it: importing a job runs the user's code and torch (seconds on a busy machine),
and the daemon never needs the job itself; its workers do. So a missing file, a module not
found, a syntax error or a file with no ``make_job`` is one line naming the flag and the
fix, before the work directory, the lock or a port is touched. An error inside
``make_job`` still shows up where it happens, in the workers (the daemon stops a run whose
workers keep failing before they join, naming the log).

A path is resolved to an absolute one (the workers start in their own sessions, from any
folder); a module name stays a name. A cloud worker runs on another machine: a path there is
a file of the code that travels with the run (``--code``, default the file's folder:
:mod:`provisioner.drivers.code`), and a module name that this host cannot import is accepted
(a module of the workers' image; the daemon host need not install it).

Rule for callers: call :func:`check_job` once, with the flag or setting the value came from,
and pass on what it returns.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from provisioner.errors import UserError

#: The job of a run with no ``--job`` and no ``[job] job_file``: the packaged example.
DEFAULT_JOB = "spotring_examples.digits"

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_FIX = ("give a .py file or an importable module defining make_job(seed) (for example "
        "examples/digits.py, or the packaged spotring_examples.digits)")


def is_path(spec: str) -> bool:
    """True when ``spec`` names a file rather than a module."""
    return spec.endswith(".py") or "/" in spec or Path(spec).is_file()


def defines_make_job(source: str, filename: str) -> bool:
    """True when the module's top level defines or imports ``make_job``. Raises SyntaxError."""
    tree = ast.parse(source, filename=filename)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "make_job":
            return True
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "make_job" for t in node.targets):
            return True
        if isinstance(node, (ast.AnnAssign,)) and isinstance(node.target, ast.Name) \
                and node.target.id == "make_job":
            return True
        if isinstance(node, ast.ImportFrom) and any(
                (a.asname or a.name) == "make_job" or a.name == "*" for a in node.names):
            return True
    return False


def _check_source(path: Path, flag: str, spec: str) -> None:
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{flag} {spec}: cannot read {path} ({exc}); {_FIX}") from None
    try:
        ok = defines_make_job(source, str(path))
    except SyntaxError as exc:
        raise UserError(f"{flag} {spec}: not valid Python ({path}, line {exc.lineno}: "
                        f"{exc.msg}); fix the file") from None
    if not ok:
        raise UserError(f"{flag} {spec}: {path} defines no make_job(seed); add `def "
                        f"make_job(seed: int) -> Job` returning a trainer.job.Job (see "
                        f"examples/digits.py)")


def check_job(spec: str, flag: str, *, cloud: bool = False) -> str:
    """The job to run: an absolute ``.py`` path or a module name (see the module docstring).

    Raises UserError naming ``flag`` (``--job`` or ``job.job_file``) and the fix.
    """
    spec = spec.strip()
    if not spec:
        raise UserError(f"{flag}: empty; {_FIX}")
    if is_path(spec):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UserError(f"{flag} {spec}: no such file (from {Path.cwd()}); {_FIX}")
        _check_source(path, flag, spec)
        return str(path.resolve())
    if not _MODULE.match(spec):
        raise UserError(f"{flag} {spec!r}: neither a file nor a module name; {_FIX}")
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):  # a parent package missing or failing to import
        found = None
    if found is None:
        if cloud:
            return spec
        raise UserError(f"{flag} {spec}: no such module importable here (nor a file); "
                        f"{_FIX}")
    if found.origin and found.origin.endswith(".py"):
        _check_source(Path(found.origin), flag, spec)
    return spec
