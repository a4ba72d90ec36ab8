"""The embedded cloud: an instance is a worker process on this machine.

Design: the local driver implements :class:`~provisioner.drivers.base.CloudDriver` with the
same verbs and the same crash-safety as a real cloud, so the daemon cannot tell it apart:

- *Launch* is idempotent by token. The instance ids are derived from the token
  (``loc-<hash>-<k>``) and the token file is written before any process starts, so a launch
  repeated after a daemon crash starts only the instances that are missing.
- *Instances* are processes started in their own session (they survive the daemon, like VMs)
  and tracked by JSON files in ``state_dir/instances`` holding the pid and the kernel start
  time of the process (so a recycled pid is never mistaken for the worker). ``list`` re-reads
  the files, so a restarted daemon finds every live worker.
- *GPUs*: an instance runs ``gpus_per_instance`` worker processes (one per GPU of a cloud
  instance, here all on the CPU), named ``<id>/<k>`` (:class:`~provisioner.drivers.identity.
  WorkerName`) with ``SPOTRING_LOCAL_RANK=k``; one worker per instance is named ``<id>``. The
  instance is alive while any of its workers runs; a notice or a kill reaches all of them.
- *Instance types* map to a slowdown factor passed to the worker: a small table for the
  ``local.*`` types, otherwise the GPU throughput prior of :mod:`pricing.catalog`
  (V100 = 1.0; anything faster than the reference runs at 1.0 since this machine cannot
  speed up).
- *Revocations* come from an availability feed (a trace or the built-in generator): when
  the feed says fewer instances of an offering are available than are held, the newest
  held ones get a notice (SIGTERM to the worker, which drains at its step boundary) and are
  SIGKILLed when the notice window ends; every ``hard_kill_every``-th revocation comes
  without notice (an immediate SIGKILL), as a missed notice or a crash would. A launch into
  an offering the feed says is full raises :class:`~provisioner.errors.CapacityError`.
  ``revoke`` does the same for one instance on demand; ``provision revoke ID`` (another
  process) calls ``request_revoke``, which leaves a request file in ``state_dir/notices``
  that the daemon's driver carries out on its own (simulated) clock.

A worker outlives the daemon that started it (its own session, no controlling terminal, its
log a file): a daemon killed and restarted on the same ``state_dir`` lists and adopts it.
:func:`running` reads the same records with no side effect at all (nothing created, reaped
or signalled), for checks made before a run may change anything.

Rule for callers: pass an injected ``clock`` (the daemon's simulated time); all windows are
in that clock's seconds, and so is an instance's life (its launch time, the spend): with the
local run's paced clock (:mod:`pricing.sources.pace`) a worker's boot and a notice window are
charged in the job's own time, not in wall time scaled by ``--speed``. One driver object per process; several may share a ``state_dir``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

from pricing.model import Offering
from provisioner.drivers.base import (INTERRUPTION, PREEMPTED, RUNNING, TERMINATED_NOTICE,
                                      Instance, LaunchRequest, LaunchResult, Notice)
from provisioner.drivers.identity import WorkerName
from provisioner.errors import CapacityError, DriverError
from provisioner.timing import LOCAL_NOTICE_WINDOW_S

log = logging.getLogger(__name__)

#: Slowdown of the built-in local instance types (1.0 = the reference GPU, a V100).
LOCAL_TYPES: dict[str, float] = {"local.v100": 1.0, "local.t4": 2.0, "local.k80": 4.0}


def slowdown_for(instance_type: str) -> float:
    """The worker slowdown factor of an instance type (>= 1.0).

    Raises DriverError naming the type when neither the local table nor the catalog knows it.
    """
    if instance_type in LOCAL_TYPES:
        return LOCAL_TYPES[instance_type]
    from pricing import catalog

    spec = catalog.gpu_for(instance_type)
    if spec is None or spec.count <= 0:
        raise DriverError(f"instance type {instance_type!r}: no GPU known; use one of "
                          f"{', '.join(LOCAL_TYPES)} or a GPU type of pricing.catalog")
    try:
        rel = catalog.relative_throughput(spec.model)
    except KeyError as exc:
        raise DriverError(f"instance type {instance_type!r}: {exc}") from None
    return max(1.0, 1.0 / max(rel, 1e-6))


@dataclass(frozen=True)
class WorkerSpec:
    """What the command builder gets to start one worker of an instance: ``name`` is its ring
    name (``--name``), ``gpu`` its index on the instance (None: the instance's only one)."""

    instance_id: str
    offering: Offering
    job_id: str
    slowdown: float
    env: Mapping[str, str]
    gpu: int | None = None

    @property
    def name(self) -> str:
        return str(WorkerName(self.instance_id, self.gpu))


CommandBuilder = Callable[[WorkerSpec], Sequence[str]]
Availability = Callable[[Offering, datetime], "int | None"]


def _locked(method: Callable) -> Callable:
    """Serialise a driver method on the driver's lock (file updates are read-modify-write)."""
    import functools

    @functools.wraps(method)
    def wrapper(self: "LocalDriver", *args: object, **kwargs: object) -> object:
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


def proc_start(pid: int) -> str | None:
    """The kernel start time of ``pid`` (None when gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode()


def procs(rec: dict) -> list[tuple[int, str | None]]:
    """(pid, kernel start time) of every worker process of an instance record (records
    written before instances had several workers hold one ``pid``/``start``)."""
    many = rec.get("procs")
    if isinstance(many, list):
        return [(int(p["pid"]), p.get("start")) for p in many if p.get("pid")]
    return [(int(rec["pid"]), rec.get("start"))] if rec.get("pid") else []


def _any_alive(rec: dict) -> bool:
    return any(proc_start(pid) == start for pid, start in procs(rec))


def running(state_dir: str | Path, job_id: str) -> list[dict]:
    """The records (id, pid, offering, ...) of ``job_id``'s live instances under ``state_dir``;
    reads only (see the module docstring)."""
    out = []
    for p in sorted((Path(state_dir) / "instances").glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if rec.get("job") == job_id and not rec.get("terminated") and _any_alive(rec):
            out.append(rec)
    return out


class LocalDriver:
    """Worker processes on this machine, with trace-driven revocations."""

    name = "local"

    def __init__(self, state_dir: str | Path, command: CommandBuilder, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 availability: Availability | None = None,
                 notice_window_s: float = LOCAL_NOTICE_WINDOW_S,
                 hard_kill_every: int = 0, terminate_grace_s: float = 2.0,
                 gpus_per_instance: int = 1) -> None:
        if not 1 <= gpus_per_instance <= 64:
            raise DriverError(f"gpus_per_instance={gpus_per_instance}: expected 1 to 64 "
                              f"(local.gpus_per_instance)")
        self.gpus_per_instance = gpus_per_instance
        self.dir = Path(state_dir)
        for sub in ("instances", "tokens", "notices", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._command = command
        self._clock = clock
        self._availability = availability
        self.notice_window_s = notice_window_s
        self.hard_kill_every = hard_kill_every
        self.terminate_grace_s = terminate_grace_s
        self._children: dict[int, subprocess.Popen] = {}
        self._reported: set[str] = set()
        self._revocations = 0
        self._lock = threading.RLock()  # the daemon's jobs call the driver from several threads

    # -- files ---------------------------------------------------------------------------------
    def _read(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def _write(self, path: Path, data: dict) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _records(self) -> list[dict]:
        out = []
        for p in sorted((self.dir / "instances").glob("*.json")):
            rec = self._read(p)
            if rec is not None:
                out.append(rec)
        return out

    def _alive(self, rec: dict) -> bool:
        """Is any worker process of the instance running?"""
        if rec.get("terminated"):
            return False
        return any(self._proc_alive(pid, start) for pid, start in procs(rec))

    def _proc_alive(self, pid: int, start: str | None) -> bool:
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            return False
        return proc_start(pid) == start

    # -- CloudDriver -------------------------------------------------------------------------
    @_locked
    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start ``request.count`` workers; the same token never starts one twice."""
        if request.count <= 0:
            return LaunchResult(())
        token_path = self.dir / "tokens" / f"{hashlib.sha1(request.token.encode()).hexdigest()}.json"
        planned = self._read(token_path)
        if planned is None:
            if self._availability is not None:
                now = self._clock()
                avail = self._availability(request.offering, now)
                held = sum(1 for r in self._records() if r["offering"] == request.offering.key
                           and self._alive(r) and not r.get("notice"))
                if avail is not None and held + request.count > avail:
                    if avail - held <= 0:
                        raise CapacityError(request.offering.key,
                                            f"no capacity (available {avail}, held {held})")
                    request = LaunchRequest(request.offering, avail - held, request.job_id,
                                            request.token, request.env)
            digest = hashlib.sha1(request.token.encode()).hexdigest()[:10]
            planned = {"token": request.token, "offering": request.offering.key,
                       "ids": [f"loc-{digest}-{k}" for k in range(request.count)]}
            self._write(token_path, planned)
        out = []
        for iid in planned["ids"]:
            path = self.dir / "instances" / f"{iid}.json"
            rec = self._read(path)
            if rec is None:
                rec = self._spawn(iid, request)
            launched = datetime.fromisoformat(rec["launched_at"])
            if self._alive(rec):
                out.append(Instance(iid, Offering.from_key(rec["offering"]), RUNNING, launched,
                                    {"job": rec["job"], "token": rec["token"]}))
        return LaunchResult(tuple(out))

    def _spawn(self, iid: str, request: LaunchRequest) -> dict:
        """Start the instance's workers (one per GPU) and write its record."""
        n = self.gpus_per_instance
        slowdown = slowdown_for(request.offering.instance_type)
        started = [self._spawn_one(WorkerSpec(iid, request.offering, request.job_id, slowdown,
                                              dict(request.env), k if n > 1 else None))
                   for k in range(n)]
        rec = {"id": iid, "job": request.job_id, "offering": request.offering.key,
               "token": request.token, "pid": started[0][0], "start": started[0][1],
               "procs": [{"pid": pid, "start": start} for pid, start, _ in started],
               "launched_at": self._clock().isoformat(), "slowdown": slowdown,
               "argv": started[0][2]}
        self._write(self.dir / "instances" / f"{iid}.json", rec)
        log.info("local launch %s %s pids=%s slowdown=%.2f", iid, request.offering,
                 ",".join(str(p) for p, _, _ in started), slowdown)
        return rec

    def _spawn_one(self, spec: WorkerSpec) -> tuple[int, str | None, list[str]]:
        argv = list(self._command(spec))
        # SPOTRING_ZONE: the worker's zone (the hybrid mode all-reduces inside a zone), unless
        # the launch names its hybrid group; SPOTRING_LOCAL_RANK: its GPU (trainer.worker.devices)
        env = {**os.environ, "SPOTRING_ZONE": spec.offering.zone, **spec.env,
               "SPOTRING_INSTANCE_ID": spec.instance_id, "SPOTRING_SLOWDOWN": str(spec.slowdown),
               "SPOTRING_LOCAL_RANK": str(spec.gpu or 0)}
        logf = open(self.dir / "logs" / f"{spec.instance_id}.log", "ab")
        try:
            proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise DriverError(f"cannot start worker {argv[0]!r}: {exc.strerror}") from None
        finally:
            logf.close()
        self._children[proc.pid] = proc
        start = None
        for _ in range(100):  # /proc entry appears at once; retry guards a slow fork
            start = proc_start(proc.pid)
            if start is not None or proc.poll() is not None:
                break
            time.sleep(0.001)
        return proc.pid, start, argv

    @_locked
    def list(self, job_id: str) -> list[Instance]:
        """Live workers tagged with ``job_id`` (dead ones are reaped and left out)."""
        self._enforce_deadlines()
        out = []
        for rec in self._records():
            if rec["job"] == job_id and self._alive(rec):
                out.append(Instance(rec["id"], Offering.from_key(rec["offering"]), RUNNING,
                                    datetime.fromisoformat(rec["launched_at"]),
                                    {"job": rec["job"], "token": rec["token"]}))
        return out

    @_locked
    def terminate(self, instance_ids: Sequence[str]) -> None:
        """SIGTERM, then SIGKILL after the grace period; unknown ids are ignored."""
        targets = []
        for iid in instance_ids:
            path = self.dir / "instances" / f"{iid}.json"
            rec = self._read(path)
            if rec is None:
                continue
            alive = self._alive(rec)
            rec["terminated"] = True
            self._write(path, rec)
            self._reported.add(iid)
            if alive:
                self._signal(rec, signal.SIGTERM)
                targets.append(rec)
        left = [p for rec in targets for p in procs(rec)]
        deadline = time.monotonic() + self.terminate_grace_s
        while left and time.monotonic() < deadline:
            left = [(pid, start) for pid, start in left
                    if proc_start(pid) == start and not self._reaped(pid)]
            if left:
                time.sleep(0.02)
        for pid, start in left:
            self._signal_proc(pid, start, signal.SIGKILL)
            self._reaped(pid)

    def _reaped(self, pid: int) -> bool:
        child = self._children.get(pid)
        return child is not None and child.poll() is not None

    def _signal(self, rec: dict, sig: int) -> None:
        """``sig`` to every worker process of the instance (each in its own session)."""
        for pid, start in procs(rec):
            self._signal_proc(pid, start, sig)

    @staticmethod
    def _signal_proc(pid: int, start: str | None, sig: int) -> None:
        if proc_start(pid) != start:
            return
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def can_place(self, offering: Offering) -> bool:
        """Any offering: a local "instance" is a process on this machine."""
        return True

    @_locked
    def notices(self) -> list[Notice]:
        """Revocations from the feed and ``revoke``, deadline kills, and unexpected exits.

        Each notice is delivered once per driver object (a restarted daemon may see a notice
        again; handling one twice is harmless).
        """
        now = self._clock()
        self._take_requests()
        self._revoke_from_feed(now)
        self._enforce_deadlines()
        out: list[Notice] = []
        for rec in self._records():
            iid = rec["id"]
            notice = self._read(self.dir / "notices" / f"{iid}.json")
            if notice is not None and f"notice:{iid}" not in self._reported:
                self._reported.add(f"notice:{iid}")
                if notice["kind"] == PREEMPTED:
                    self._reported.add(iid)  # already gone: no separate exit notice
                deadline = datetime.fromisoformat(notice["deadline"]) if notice["deadline"] else None
                out.append(Notice(iid, notice["kind"], datetime.fromisoformat(notice["time"]),
                                  deadline, notice["source"]))
            if iid not in self._reported and not rec.get("terminated") and not self._alive(rec):
                self._reported.add(iid)
                out.append(Notice(iid, TERMINATED_NOTICE, now, None, "local: process exited"))
        return out

    # -- revocations -----------------------------------------------------------------------------
    @_locked
    def revoke(self, instance_id: str, *, window_s: float | None = None, hard: bool = False,
               source: str = "local: revoke") -> bool:
        """Give ``instance_id`` a notice (SIGTERM, SIGKILL at the window's end) or kill it now.

        Returns False when the instance is unknown, gone or already noticed.
        """
        path = self.dir / "instances" / f"{instance_id}.json"
        rec = self._read(path)
        if rec is None or not self._alive(rec) or rec.get("notice"):
            return False
        now = self._clock()
        window = self.notice_window_s if window_s is None else window_s
        hard = hard or window <= 0
        deadline = None if hard else now + timedelta(seconds=window)
        notice = {"kind": PREEMPTED if hard else INTERRUPTION, "time": now.isoformat(),
                  "deadline": deadline.isoformat() if deadline else None, "source": source}
        self._write(self.dir / "notices" / f"{instance_id}.json", notice)
        rec["notice"] = True
        self._write(path, rec)
        self._signal(rec, signal.SIGKILL if hard else signal.SIGTERM)
        log.info("local %s %s (%s)", "kill" if hard else "notice", instance_id, source)
        return True

    def request_revoke(self, instance_id: str, *, hard: bool = False,
                       window_s: float | None = None) -> bool:
        """Ask the daemon's driver (another process, on its own clock) to revoke an instance.

        Writes a request file the next :meth:`notices` call carries out. Returns False when
        the instance is unknown or already gone.
        """
        rec = self._read(self.dir / "instances" / f"{instance_id}.json")
        if rec is None or not self._alive(rec):
            return False
        self._write(self.dir / "notices" / f"{instance_id}.request",
                    {"hard": hard, "window_s": window_s})
        return True

    def _take_requests(self) -> None:
        for p in sorted((self.dir / "notices").glob("*.request")):
            req = self._read(p) or {}
            p.unlink(missing_ok=True)
            self.revoke(p.stem, hard=bool(req.get("hard")), window_s=req.get("window_s"),
                        source="provision revoke" + (" --kill" if req.get("hard") else ""))

    def _revoke_from_feed(self, now: datetime) -> None:
        if self._availability is None:
            return
        by_offering: dict[str, list[dict]] = {}
        for rec in self._records():
            if self._alive(rec) and not rec.get("notice"):
                by_offering.setdefault(rec["offering"], []).append(rec)
        for key, recs in sorted(by_offering.items()):
            avail = self._availability(Offering.from_key(key), now)
            if avail is None or len(recs) <= avail:
                continue
            recs.sort(key=lambda r: (r["launched_at"], r["id"]), reverse=True)
            for rec in recs[: len(recs) - max(avail, 0)]:
                self._revocations += 1
                hard = self.hard_kill_every > 0 and self._revocations % self.hard_kill_every == 0
                self.revoke(rec["id"], hard=hard,
                            source=f"trace: {key} availability {avail} < held {len(recs)}")

    def _enforce_deadlines(self) -> None:
        now = self._clock()
        for p in (self.dir / "notices").glob("*.json"):
            notice = self._read(p)
            if not notice or not notice.get("deadline") or notice.get("killed"):
                continue
            if datetime.fromisoformat(notice["deadline"]) <= now:
                rec = self._read(self.dir / "instances" / f"{p.stem}.json")
                if rec is not None and self._alive(rec):
                    self._signal(rec, signal.SIGKILL)
                    log.info("local notice window over: killed %s", p.stem)
                notice["killed"] = True
                self._write(p, notice)
