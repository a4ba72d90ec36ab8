"""The cloud workers' shipped logs and exit reports, as the daemon and ``provision logs`` read
them from the run's artifacts store.

Design: a cloud worker has no channel to the daemon before it joins the ring (and a boot that
fails never joins), so its lines travel through the one place both already reach: the run's
artifacts store (``[cloud] artifacts``: S3, GCS or a folder; the worker role may already
read it for the wheel, and writes only under ``logs/`` and ``exits/``). The shipper is a few
lines of bash in each worker boot script (terraform/*/templates/worker-*.tftpl, the block
"log shipping"), started before anything can fail and using only the cloud's CLI (the boot
may fail before Python or spotring is there):

- every :data:`SHIP_S` seconds, and once more when the boot script exits and when the
  instance shuts down, the new lines of each source go to a numbered chunk object
  ``logs/<instance id>/<unit>/<seq>`` (S3 and GCS have no append; ``<seq>`` is 8 digits, so
  the keys sort in order). Sources: ``boot`` (the boot script's own output) and each worker
  unit ``spotring-worker@<gpu>`` (its journal, read with a cursor);
- a boot that exits non-zero writes ``exits/<instance id>/boot``, and a worker unit that
  systemd marked failed (it is not restarted: a job error, exit 2, or a refused join, 4)
  writes ``exits/<instance id>/<unit>``: the exit code on the first line, then the source's
  last lines (:func:`parse_report`);
- lines holding the ring token are never shipped (the shipper drops them; the boot never
  prints it).

Nothing here or in the daemon deletes these objects: the lines of revoked and terminated
workers stay with the run's artifacts (a bucket lifecycle rule is the operator's choice).

Rule for callers: read through :class:`StoreLogs` (the :class:`ShippedLogs` Protocol; tests use
it over a folder or moto S3); :func:`explain` is the one wording of an exit code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from provisioner.drivers.artifacts import ArtifactStore

log = logging.getLogger(__name__)

#: Seconds between two chunks of one source (the shipper's loop; the boot's exit and the
#: instance's shutdown ship at once): a failed boot's lines reach the daemon within a round.
SHIP_S = 5
#: Lines of a source an exit report carries (and a join-deadline event quotes).
REPORT_LINES = 20
LOGS, EXITS = "logs", "exits"
BOOT = "boot"
#: The worker's exit code for an error of the job (the user's code; trainer.worker.decision).
WORKER_JOB_EXIT = 2

#: Each boot exit code's line of docs/deploy.md "Boot exit codes" (meaning; fix): the text
#: a failed boot's event quotes (tests/provisioner/drivers/test_shiplog.py compares them).
BOOT_EXITS: dict[int, tuple[str, str]] = {
    10: ("`worker_python` is older than 3.11 (or missing)", "an image with Python 3.11+ (Images)"),
    11: ("the metadata service did not answer (instance id, zone)",
         "IMDS enabled (AWS), the VM's metadata server"),
    20: ("`SPOTRING_JOB` (or `job_module`) is not a module name, or not importable on the image",
         "`--job` a module, present on the image"),
    21: ("`SPOTRING_MODE` is not `ring` or `hybrid`", "the daemon's `[job] mode`"),
    22: ("`SPOTRING_ZONE` is not a group name", "the daemon's mode choice"),
    23: ("`SPOTRING_GPUS`/`SPOTRING_DEVICE` unusable, or fewer GPUs than the launch says",
         "the image's NVIDIA driver"),
    24: ("the wheel is not in this deployment's artifacts, or there is none",
         "`[cloud] artifacts`, `spotring_wheel`"),
    25: ("the wheel cannot be fetched, its SHA-256 differs, or pip refuses it",
         "the artifacts bucket, the role's read grant"),
    26: ("the ring token cannot be read",
         "the role/service account's grant on the parameter/secret"),
    27: ("the image's Python has no torch (or no pip)", "an image with PyTorch and pip"),
    28: ("the index opt-in (`spotring_index_requirement`) failed",
         "the pinned version and hashes"),
    30: ("`SPOTRING_CODE` is not in this deployment's artifacts, cannot be fetched or unpacked, "
         "or the job is not a file of it", "`[cloud] artifacts`, the role's read grant"),
    31: ("the code's SHA-256 is not `SPOTRING_CODE_SHA256` (changed after the daemon shipped it)",
         "run again: the daemon packs and ships it anew"),
    32: ("pip could not install the code's `requirements.txt`",
         "the requirements (pinned versions the workers can reach)"),
}
#: Boot codes that say the run's job or code (the user's input), not the offering or its
#: image, is wrong: launching elsewhere cannot help.
JOB_BOOT_EXITS = frozenset({20, 30, 31, 32})


class Failure(str, Enum):
    """What an exit report means for the run."""

    BOOT = "boot"  # the instance or its image: try another offering (the capacity path)
    JOB = "job"  # the user's job or code: no launch can succeed until it is fixed


@dataclass(frozen=True)
class ExitReport:
    """One shipped exit: which instance and unit, its code, its last lines."""

    instance_id: str
    unit: str
    code: int
    lines: tuple[str, ...]

    @property
    def failure(self) -> Failure:
        """:attr:`Failure.JOB` for a job error (a worker's exit 2, a boot's 20, 30-32)."""
        if self.unit == BOOT:
            return Failure.JOB if self.code in JOB_BOOT_EXITS else Failure.BOOT
        return Failure.JOB if self.code == WORKER_JOB_EXIT else Failure.BOOT


def chunk_key(instance_id: str, unit: str, seq: int) -> str:
    """The key of chunk ``seq`` of ``unit``'s lines on ``instance_id``."""
    return f"{LOGS}/{instance_id}/{unit}/{seq:08d}"


def exit_key(instance_id: str, unit: str) -> str:
    """The key of ``unit``'s exit report on ``instance_id``."""
    return f"{EXITS}/{instance_id}/{unit}"


def parse_report(instance_id: str, unit: str, text: str) -> ExitReport:
    """The report a shipper wrote: the exit code on the first line, then the last lines (a
    first line that is not a number reads as code -1: the report still counts)."""
    first, _, rest = text.partition("\n")
    try:
        code = int(first.strip())
    except ValueError:
        code, rest = -1, text
    lines = tuple(ln for ln in rest.splitlines() if ln.strip())[-REPORT_LINES:]
    return ExitReport(instance_id, unit, code, lines)


def explain(report: ExitReport) -> str:
    """One line: the exit code and what it means (the docs table's line for a boot)."""
    if report.unit == BOOT:
        meaning, fix = BOOT_EXITS.get(report.code, (
            "an unexpected failure of the boot script", "its last lines below"))
        return f"boot exit {report.code}: {meaning} (fix: {fix}; docs/deploy.md, Boot exit codes)"
    if report.code == WORKER_JOB_EXIT:
        return (f"{report.unit} exit {report.code}: the job failed (an import or the job's own "
                f"error; not restarted); fix the job and start the run again")
    return f"{report.unit} exit {report.code}: the worker failed and systemd stopped it"


def last_error(lines: Sequence[str]) -> str:
    """The most telling of ``lines``: the last ``error`` line, else the last line."""
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


class ShippedLogs(Protocol):
    """What the daemon reads of the workers' shipped lines."""

    def reports(self, instance_id: str) -> list[ExitReport]:
        """The exit reports ``instance_id`` shipped (none: nothing failed, or not yet)."""
        ...

    def tail(self, instance_id: str, unit: str = BOOT, n: int = REPORT_LINES) -> list[str]:
        """The last ``n`` shipped lines of ``unit`` on ``instance_id`` ([] when none)."""
        ...


class StoreLogs:
    """:class:`ShippedLogs` over an :class:`~provisioner.drivers.artifacts.ArtifactStore`."""

    def __init__(self, store: "ArtifactStore") -> None:
        self.store = store

    def reports(self, instance_id: str) -> list[ExitReport]:
        out = []
        prefix = f"{EXITS}/{instance_id}/"
        for key in self.store.list(prefix):
            unit = key[len(prefix):]
            if "/" in unit:
                continue
            try:
                text = self.store.read(key).decode(errors="replace")
            except KeyError:
                continue
            out.append(parse_report(instance_id, unit, text))
        return out

    def units(self, instance_id: str) -> dict[str, list[str]]:
        """unit -> its chunk keys in order, of ``instance_id``."""
        prefix = f"{LOGS}/{instance_id}/"
        out: dict[str, list[str]] = {}
        for key in self.store.list(prefix):
            unit, _, seq = key[len(prefix):].rpartition("/")
            if unit and "/" not in unit and seq.isdigit():
                out.setdefault(unit, []).append(key)
        return out

    def lines(self, instance_id: str, unit: str | None = None) -> list[tuple[str, str]]:
        """(unit, line) of every shipped line of ``instance_id`` (of ``unit`` alone when
        given), the boot's first, each unit in its order."""
        units = self.units(instance_id)
        names = sorted(units, key=lambda u: (u != BOOT, u))
        out: list[tuple[str, str]] = []
        for name in names if unit is None else [u for u in names if u == unit]:
            for key in units[name]:
                try:
                    text = self.store.read(key).decode(errors="replace")
                except KeyError:
                    continue
                out.extend((name, ln) for ln in text.splitlines())
        return out

    def tail(self, instance_id: str, unit: str = BOOT, n: int = REPORT_LINES) -> list[str]:
        keys = self.units(instance_id).get(unit, [])
        got: list[str] = []
        for key in reversed(keys):  # the newest chunks until n lines
            try:
                got = self.store.read(key).decode(errors="replace").splitlines() + got
            except KeyError:
                continue
            if len(got) >= n:
                break
        return [ln for ln in got if ln.strip()][-n:]

    def instances(self) -> list[str]:
        """The instance ids that shipped lines (``logs/<id>/<unit>/<seq>``)."""
        found = set()
        for key in self.store.list(f"{LOGS}/"):
            parts = key.split("/")
            if len(parts) >= 4:
                found.add("/".join(parts[1:-2]))
        return sorted(found)
