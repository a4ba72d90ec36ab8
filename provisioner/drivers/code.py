"""The user's code: a folder packed into one deterministic tar.gz that travels with a cloud run.

Design: ``provision run --job train.py --code DIR`` (``[job] code``; default on a cloud run:
the job file's folder) packs DIR once, before anything starts, and the daemon ships the archive
through the run's content-addressed artifacts beside its wheel
(:func:`provisioner.drivers.artifacts.ship`); every launch carries its URL, its SHA-256 and
the job's path inside it (``SPOTRING_CODE``, ``SPOTRING_CODE_SHA256``, ``SPOTRING_JOB``).
A worker's boot fetches it, checks the hash, unpacks it into a folder of its own, installs
its ``requirements.txt`` into the workers' venv and runs the job from there (cwd: the job's
folder, so ``import helper`` next to ``train.py`` works as with ``python train.py``).

What goes in (:func:`list_files`): in a git work tree, what git would commit, ``git ls-files
--cached --others --exclude-standard`` (every ``.gitignore``, ``.git/info/exclude``);
elsewhere a walk of DIR honouring its top-level ``.gitignore`` (with the ``pathspec``
package when it is installed, else the subset of :func:`ignored`). ``.git`` never goes in. A
symlink that stays inside DIR travels as a link; one that leads out of it (or nowhere) is
refused, naming it: its target is not part of the code. The archive is deterministic
(:func:`write_archive`: sorted names, mtime 0, uid/gid 0, modes 0644/0755, gzip mtime 0), so
one folder gives one SHA-256 and a second run with the same code uploads nothing.

A git URL and ref (``--code git+https://host/repo@REF``, also ``git+ssh://`` and
``git+file://``) is resolved by the daemon, never by a worker: :func:`code_root` clones it
into a temporary folder on the daemon's host (with this host's git credentials, no prompt),
checks out REF and packs what that commit holds; the job is then a path inside the
repository (``--job src/train.py``). A branch moves: give a tag or a commit to pin the code.

Pure parts (:func:`ignored`, :func:`job_in_code`, :func:`check_size`, :func:`parse_git`)
take data and return data; the I/O (listing, reading, writing, cloning) is at the edges of
:func:`pack` and :func:`code_root`.

Rule for callers: call :func:`pack` once per run with the checked flags; it raises
:class:`~provisioner.errors.UserError` (one line naming ``--code`` or ``--job``, exit 2) and
changes nothing in DIR.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import logging
import os
import re
import subprocess
import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

from provisioner.errors import UserError

log = logging.getLogger(__name__)

#: The most bytes of files a packed folder may hold (``[job] code_max_mb`` overrides): code,
#: not data sets; a data set belongs in a bucket the job reads, or in .gitignore.
DEFAULT_MAX_MB = 100
#: The name of the archive in the run's artifacts (``<artifacts>/<sha256>/code.tar.gz``).
ARCHIVE_NAME = "code.tar.gz"
#: Top-level names a worker imports from its image: a module of the code with one of these
#: names would shadow spotring's own on the worker (its cwd is first on sys.path).
RESERVED = ("trainer", "provisioner", "pricing", "spotring_examples")
#: A job path inside the code, as SPOTRING_JOB carries it (provisioner/drivers/boot.py): no
#: component starts with a dot, so no ``..`` and no hidden folder.
_JOB_PATH = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_.-]*\.py$")


@dataclass(frozen=True)
class Entry:
    """One member of the archive: a file (``link`` None) or a symlink to ``link`` (relative,
    inside the code)."""

    name: str  # posix path relative to the code's root
    size: int = 0
    executable: bool = False
    link: str | None = None


@dataclass(frozen=True)
class Packed:
    """A packed folder: the archive, its SHA-256 (hex), the job's path inside it."""

    path: Path
    sha256: str
    job: str
    files: int
    size: int


# -- what goes in (pure) --------------------------------------------------------------------------

def parse_gitignore(text: str) -> list[str]:
    """The patterns of a ``.gitignore`` (blank lines and ``#`` comments dropped; a trailing
    unescaped space trimmed)."""
    out = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        out.append(line.replace("\\#", "#"))
    return out


def ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    """Whether ``rel`` (posix, relative to the root) is ignored by ``patterns``: the subset of
    gitignore used without ``pathspec``. Last match wins; ``!pat`` re-includes; ``pat/``
    matches folders only; a pattern with a ``/`` elsewhere is anchored at the root and matched
    against the whole path (``*``, ``?``, ``[...]`` as fnmatch, where ``*`` also crosses
    ``/``; ``**/`` may match nothing); one without matches any single name of the path's
    last component. Not supported: escapes other than ``\\#``, and a negated folder pattern
    re-including below an ignored folder (git cannot either)."""
    name = rel.rsplit("/", 1)[-1]
    verdict = False
    for pat in patterns:
        negate = pat.startswith("!")
        body = pat[1:] if negate else pat
        dir_only = body.endswith("/")
        body = body.rstrip("/")
        if not body or (dir_only and not is_dir):
            continue
        if "/" in body:
            body = body.lstrip("/")
            hit = fnmatch.fnmatchcase(rel, body) or (
                body.startswith("**/") and fnmatch.fnmatchcase(rel, body[3:]))
        else:
            hit = fnmatch.fnmatchcase(name, body)
        if hit:
            verdict = not negate
    return verdict


def job_in_code(job: Path, root: Path, flag: str = "--job") -> str:
    """The job file's path inside the code (posix), as SPOTRING_JOB carries it. Raises
    UserError when it is outside ``root`` or has a name a worker's boot refuses."""
    try:
        rel = job.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise UserError(f"{flag} {job}: not inside the code folder {root}; give --code the "
                        f"folder that holds the job file") from None
    if not _JOB_PATH.match(rel):
        raise UserError(f"{flag} {job}: its path in the code ({rel!r}) must be letters, "
                        f"digits, '_', '-', '.' with no part starting with '.'; rename it")
    return rel


def check_size(entries: list[Entry], max_bytes: int, root: Path) -> int:
    """The total size of ``entries``; raises UserError (naming the largest files) when it is
    over ``max_bytes``."""
    total = sum(e.size for e in entries)
    if total > max_bytes:
        big = sorted(entries, key=lambda e: -e.size)[:3]
        names = ", ".join(f"{e.name} ({e.size / 1e6:.1f} MB)" for e in big)
        raise UserError(f"--code {root}: {total / 1e6:.1f} MB of files, over the "
                        f"{max_bytes / 1e6:.0f} MB limit ([job] code_max_mb); the largest: "
                        f"{names}; put data in a bucket or in .gitignore")
    return total


def check_reserved(entries: list[Entry], job: str, root: Path) -> None:
    """Refuse a module beside the job named like one of spotring's own packages (it would
    shadow it on the worker, where the job's folder is first on sys.path)."""
    folder = str(PurePosixPath(job).parent)
    prefix = "" if folder == "." else folder + "/"
    for e in entries:
        if not e.name.startswith(prefix):
            continue
        top = e.name[len(prefix):].split("/", 1)[0]
        stem = top[:-3] if top.endswith(".py") else top
        if stem in RESERVED and (top.endswith(".py") or "/" in e.name[len(prefix):]):
            raise UserError(f"--code {root}: {e.name} beside the job would shadow spotring's "
                            f"own '{stem}' on the workers; rename it")


# -- listing (I/O) --------------------------------------------------------------------------------

def _git_files(root: Path) -> list[str] | None:
    """What git would commit under ``root`` (relative to it), or None when ``root`` is not in
    a git work tree (or git is missing)."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=60)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                               "--exclude-standard"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    names = {n for n in done.stdout.decode("utf-8", "surrogateescape").split("\0") if n}
    return sorted(names)


def _matcher(root: Path):  # -> Callable[[str, bool], bool]
    path = root / ".gitignore"
    patterns = parse_gitignore(path.read_text(errors="replace")) if path.is_file() else []
    try:
        import pathspec  # optional: the full gitignore grammar
    except ImportError:
        return lambda rel, is_dir: ignored(rel, is_dir, patterns)
    spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    return lambda rel, is_dir: spec.match_file(rel + ("/" if is_dir else ""))


def _walk_files(root: Path) -> list[str]:
    """A walk of ``root`` honouring its top-level .gitignore; symlinks are listed, never
    followed; ``.git`` is skipped."""
    skip = _matcher(root)
    out: list[str] = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        pre = "" if base == "." else base + "/"
        keep = []
        for d in sorted(dirs):
            rel = pre + d
            if d == ".git" or skip(rel, True):
                continue
            if (Path(folder) / d).is_symlink():
                out.append(rel)  # a link: checked like a file, not walked
            else:
                keep.append(d)
        dirs[:] = keep
        out.extend(pre + f for f in files if not skip(pre + f, False))
    return sorted(out)


def list_files(root: Path) -> list[str]:
    """The paths (posix, relative to ``root``) that go into the archive (module docstring)."""
    names = _git_files(root)
    if names is None:
        return _walk_files(root)
    return [n for n in names if not n.startswith(".git/") and n != ".git"]


def entries_of(root: Path, names: list[str]) -> list[Entry]:
    """Each listed path as an :class:`Entry`. Raises UserError naming a symlink that leads
    out of ``root`` or nowhere. A listed path that is gone (deleted, still in git's index) or
    a folder (a git submodule) is skipped with a warning."""
    real_root = root.resolve()
    out = []
    for name in sorted(set(names)):
        path = root / name
        if path.is_symlink():
            target = Path(os.path.realpath(path))
            try:
                inside = target.relative_to(real_root)
            except ValueError:
                raise UserError(f"--code {root}: {name} is a symlink to {os.readlink(path)}, "
                                f"outside the folder; copy what it points to into the folder, "
                                f"or add {name} to .gitignore") from None
            if not target.exists():
                raise UserError(f"--code {root}: {name} is a symlink to "
                                f"{os.readlink(path)}, which does not exist; remove it or "
                                f"add it to .gitignore")
            rel_parent = Path(os.path.realpath(path.parent)).relative_to(real_root)
            link = os.path.relpath(inside, rel_parent).replace(os.sep, "/")
            out.append(Entry(name, 0, False, link))
        elif path.is_file():
            st = path.stat()
            out.append(Entry(name, st.st_size, bool(st.st_mode & 0o111)))
        elif path.is_dir():
            log.warning("code: %s is a folder git lists as one entry (a submodule?): not "
                        "packed", name)
        else:
            log.warning("code: %s is listed but gone: not packed", name)
    return out


# -- the archive ----------------------------------------------------------------------------------

def write_archive(root: Path, entries: list[Entry], out: Path) -> str:
    """Write ``entries`` of ``root`` to ``out`` as a deterministic tar.gz (module docstring);
    returns its SHA-256 (hex)."""
    with open(out, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for e in sorted(entries, key=lambda x: x.name):
                    info = tarfile.TarInfo(e.name)
                    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                    if e.link is not None:
                        info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.link, 0o777
                        tar.addfile(info)
                        continue
                    data = (root / e.name).read_bytes()
                    info.size, info.mode = len(data), 0o755 if e.executable else 0o644
                    tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256()
    with open(out, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_code(job: str, code: str | None) -> Path | None:
    """The folder to pack for ``job`` (an existing path or a module name): ``code`` when
    given, else the job file's folder; None for a module job without ``code`` (nothing
    travels). Raises UserError naming ``--code`` when it is not a folder, or when a module job
    is given one (the job must be a file inside it)."""
    if code is None:
        return Path(job).resolve().parent if job.endswith(".py") else None
    if is_git(code):
        raise UserError(f"--code {code}: a git source is packed by code_root, not a folder")
    folder = Path(code).expanduser()
    if not folder.is_dir():
        raise UserError(f"--code {code}: not a folder; give the folder of your training code "
                        f"(default: the job file's folder)")
    if not job.endswith(".py"):
        raise UserError(f"--code {code}: the job {job} is a module name; with --code give "
                        f"the job as its .py file inside the folder, e.g. --job "
                        f"{folder / 'train.py'}")
    return folder.resolve()


def pack(root: Path, job: Path, out_dir: Path, *, max_mb: float = DEFAULT_MAX_MB) -> Packed:
    """Pack the code folder ``root`` holding the job file ``job`` into ``out_dir``.

    Returns the :class:`Packed` archive. Raises UserError (one line naming the flag and the
    fix) when the job is not a listed file of the folder, a symlink leads out of it, the
    files are over ``max_mb`` MB, or a module would shadow spotring's own. Reads ``root``
    only.
    """
    root = root.resolve()
    rel = job_in_code(job, root)
    entries = entries_of(root, list_files(root))
    if not any(e.name == rel and e.link is None for e in entries):
        raise UserError(f"--job {job}: not among the files packed from {root} (ignored by "
                        f".gitignore?); a worker could not run it")
    size = check_size(entries, int(max_mb * 1_000_000), root)
    check_reserved(entries, rel, root)
    out = out_dir / ARCHIVE_NAME
    sha = write_archive(root, entries, out)
    log.info("code: packed %d files (%.1f MB) of %s, sha256 %s", len(entries), size / 1e6,
             root, sha[:12])
    return Packed(out, sha, rel, len(entries), size)


# -- a git URL and ref ----------------------------------------------------------------------------

#: How a git source is written: ``git+<url>@<ref>``.
GIT_PREFIX = "git+"
_GIT_SCHEMES = ("https", "ssh", "file", "http")
_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}$")


@dataclass(frozen=True)
class GitSource:
    """A repository URL and the ref (tag, branch or commit) to pack."""

    url: str
    ref: str


def is_git(spec: str | None) -> bool:
    """True when ``spec`` names a git source rather than a folder."""
    return bool(spec) and spec.startswith(GIT_PREFIX)  # type: ignore[union-attr]


def parse_git(spec: str, flag: str = "--code") -> GitSource:
    """``git+<scheme>://host/path@REF`` -> :class:`GitSource` (the ``@`` of a user in the
    host part is not the ref's). Raises UserError naming ``flag`` and the fix."""
    fix = f"write it {GIT_PREFIX}https://host/owner/repo@REF (a tag, branch or commit)"
    rest = spec[len(GIT_PREFIX):]
    scheme, sep, tail = rest.partition("://")
    if not sep or scheme not in _GIT_SCHEMES:
        raise UserError(f"{flag} {spec}: not a git URL this host can fetch; {fix}")
    host, slash, path = tail.partition("/")
    where, at, ref = path.rpartition("@")
    if (not host and scheme != "file") or not slash or not at or not where:
        raise UserError(f"{flag} {spec}: no @REF after the repository path; {fix}")
    if not _REF.match(ref) or ".." in ref:
        raise UserError(f"{flag} {spec}: the ref {ref!r} is not a tag, branch or commit name; "
                        f"{fix}")
    return GitSource(f"{scheme}://{host}/{where}", ref)


def _git(args: list[str], spec: str, what: str) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=600,
                              env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"--code {spec}: git could not {what} ({exc}); this host needs git "
                        f"and read access to the repository") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise UserError(f"--code {spec}: git could not {what} ({last}); check the URL, the "
                        f"ref and this host's access to the repository")
    return done.stdout.strip()


def clone_git(src: GitSource, dest: Path, spec: str) -> str:
    """Clone ``src`` into ``dest`` (absent) and check out its ref; returns the commit.
    Raises UserError naming ``--code``."""
    _git(["clone", "--quiet", "--no-checkout", "--", src.url, str(dest)], spec,
         f"clone {src.url}")
    _git(["-C", str(dest), "checkout", "--quiet", "--detach", f"{src.ref}^{{commit}}"], spec,
         f"check out {src.ref}")
    return _git(["-C", str(dest), "rev-parse", "HEAD"], spec, "read the commit")


def check_git_job(job: str, flag: str = "--job") -> str:
    """``job`` as a path inside a git source's repository. Raises UserError naming
    ``flag``."""
    rel = job.strip().removeprefix("./")
    if not _JOB_PATH.match(rel):
        raise UserError(f"{flag} {job}: with --code {GIT_PREFIX}URL@REF the job is the .py "
                        f"file's path inside the repository, e.g. {flag} src/train.py")
    return rel


@contextmanager
def code_root(code: str, job: str) -> Iterator[tuple[Path, Path, str]]:
    """The folder to pack, the job file in it, and a note on where it came from: ``code`` a
    folder as is; a git source cloned into a temporary folder (removed on exit) with
    ``job`` a path inside it. Raises UserError naming ``--code`` or ``--job``."""
    if not is_git(code):
        yield Path(code), Path(job), str(code)
        return
    src = parse_git(code)
    with tempfile.TemporaryDirectory(prefix="spotring-git-") as tmp:
        repo = Path(tmp) / "repo"
        commit = clone_git(src, repo, code)
        job_file = repo / check_git_job(job)
        if not job_file.is_file():
            raise UserError(f"--job {job}: no such file in {src.url} at {src.ref} (commit "
                            f"{commit[:12]}); give the job's path inside the repository")
        yield repo, job_file, f"{src.url}@{src.ref} (commit {commit[:12]})"
