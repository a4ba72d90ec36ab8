"""``python -m trainer coordinator|worker|export``: what the daemon host and each instance run,
and the trained model out of a durable snapshot.

Design: argument parsing and exit codes only; the work is in :mod:`trainer.control.coordinator` and
:mod:`trainer.worker.loop`. Bad input (missing token file, bad address, a job that fails to build)
prints one line naming the flag or file and the fix, exit code 2; an unreachable coordinator
exits 3 after a bounded retry; a refused join exits 4; a job whose every member was lost
exits 5. SIGTERM on a worker is a notice: it finishes its step and leaves at the boundary.

Rule for callers: the token file holds the job's shared secret; it is read, never printed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any


def _token(path: str) -> bytes:
    from trainer.protocol.admission import read_token_file, token_file_warning

    try:
        token = read_token_file(Path(path))
        warning = token_file_warning(Path(path))
        if warning:
            logging.getLogger("trainer").warning(warning)
        return token
    except OSError as e:
        print(f"error: --token-file {path}: {e.strerror}; create it with a secret "
              "(e.g. `(umask 077; head -c 32 /dev/urandom | base64 > token)`)", file=sys.stderr)
    except ValueError as e:
        print(f"error: --token-file {e}", file=sys.stderr)
    raise SystemExit(2)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 10.0.0.5:29400")
    return host, int(port)


def _mode(text: str) -> str:
    """``--mode`` (or ``$SPOTRING_MODE``): empty or one of the modes a provisioner chooses."""
    from trainer.job import CHOSEN_MODES  # a worker imports it next anyway

    if text and text not in CHOSEN_MODES:
        raise argparse.ArgumentTypeError(f"{text!r}: use {' or '.join(CHOSEN_MODES)} (from "
                                         "--mode or $SPOTRING_MODE)")
    return text


def _fault(text: str) -> tuple[str, int]:
    action, sep, step = text.partition("@")
    if action not in ("kill", "stop", "term", "freeze") or not sep or not step.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected kill@STEP, stop@STEP, term@STEP or freeze@STEP")
    return action, int(step)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer",
                                description="spotring elastic training ring")
    p.add_argument("--log-level", default=os.environ.get("SPOTRING_LOG", "INFO"))
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("coordinator", help="serve the membership of one job; exits when the "
                       "job is over (done 0, lost 3, failed 4); Ctrl-C stops it")
    c.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; give the "
                   "private address workers dial, or 0.0.0.0 for every interface)")
    c.add_argument("--port", type=int, default=29400)
    c.add_argument("--token-file", required=True)
    c.add_argument("--heartbeat-timeout", type=float, default=5.0,
                   help="seconds without a heartbeat before a member is dropped (default 5)")
    c.add_argument("--initial-world", type=int, default=1,
                   help="workers to wait for before the first generation (default 1)")
    c.add_argument("--snapshot-url", default=None, metavar="DIR|s3://B/P|gs://B/P",
                   help="keep durable snapshots there (default: none; every member lost at "
                   "once then loses the job)")
    c.add_argument("--snapshot-every-s", type=float, default=300.0, metavar="S",
                   help="a snapshot at least this often (default 300)")
    c.add_argument("--snapshot-every-steps", type=int, default=0, metavar="N",
                   help="and every N steps (default 0: by time only)")
    c.add_argument("--snapshot-keep", type=int, default=3, metavar="N",
                   help="the newest N snapshots are kept (default 3)")
    c.add_argument("--linger", type=float, default=LINGER_S, metavar="S",
                   help="once the job is over (done, lost or failed), keep serving this many "
                   f"seconds so every worker reads the end, then exit (default {LINGER_S:g}; "
                   "exit code 0 done, 3 lost, 4 failed)")
    w = sub.add_parser("worker", help="train in the ring (SIGTERM: leave at the next step)")
    w.add_argument("--coordinator", type=_address, required=True, metavar="HOST:PORT")
    w.add_argument("--token-file", required=True)
    w.add_argument("--job", required=True, help="module name or .py path defining make_job")
    w.add_argument("--name", default=None, help="worker name (cloud instance id); "
                   "default: hostname-pid")
    w.add_argument("--slowdown", type=float, default=1.0,
                   help="compute F times slower (sleeps (F-1) x batch x the running median "
                   "of measured compute s/sample; emulation)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--metrics-file", type=Path, default=None)
    w.add_argument("--record-samples", type=Path, default=None)
    w.add_argument("--record-digests", action="store_true",
                   help="put the state's digests (parameters, buffers, optimiser, scheduler, "
                        "extra state) in every metrics line (tests: members compared per step)")
    w.add_argument("--collective-timeout", type=float, default=10.0,
                   help="seconds a collective or group forming may block (default 10)")
    w.add_argument("--connect-timeout", type=float, default=60.0,
                   help="seconds to keep retrying an unreachable coordinator (default 60)")
    w.add_argument("--notice-url", default=None,
                   help="cloud metadata URL to poll for revocation notices (AWS or GCP)")
    w.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                   help="torch intra-op threads (default: OMP_NUM_THREADS or 1; one worker "
                   "per core avoids oversubscription)")
    w.add_argument("--boot-idle", action="store_true",
                   help="boot, build the job and profile under SCHED_IDLE (only CPU the ring "
                   "leaves idle), then return to normal priority before asking to join")
    w.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N",
                   help="where to compute (default auto: a GPU when this host has one; "
                   "several workers on one host take one GPU each by LOCAL_RANK)")
    w.add_argument("--bucket-mb", type=float, default=25.0, metavar="MB",
                   help="gradient bucket size: reductions overlap the backward pass bucket "
                   "by bucket (default 25, as DDP)")
    w.add_argument("--output", type=Path, default=None, metavar="PATH",
                   help="where rank 0 writes the trained model (a state_dict that torch.load "
                   "reads) at the end and on request")
    w.add_argument("--loader-workers", type=int, default=None, metavar="N",
                   help="input pipeline worker processes (default: the job's, else 0 for an "
                   "in-memory TensorDataset and 2 for other datasets)")
    w.add_argument("--coordinator-grace", type=float, default=600.0, metavar="S",
                   help="a coordinator that stops answering is waited for this long (the "
                   "ring trains on in its generation meanwhile); then the worker exits 3 "
                   "(default 600)")
    w.add_argument("--zone", default=os.environ.get("SPOTRING_ZONE", ""),
                   help="the zone this worker runs in (default $SPOTRING_ZONE): the hybrid "
                   "mode all-reduces inside a zone and uses parameter servers across zones")
    w.add_argument("--mode", default=os.environ.get("SPOTRING_MODE", ""), type=_mode,
                   metavar="ring|hybrid",
                   help="the training mode the provisioner chose for the run (default "
                   "$SPOTRING_MODE): a job whose Job.mode is 'auto' (the default) trains in "
                   "it, else in the ring; a job that names its mode keeps it")
    w.add_argument("--ring-host", default=None, metavar="ADDR",
                   help="address this worker's ring connections listen on and advertise "
                   "(default: its address facing the coordinator)")
    w.add_argument("--no-rejoin", action="store_true",
                   help="exit instead of joining again after being dropped")
    w.add_argument("--resume", type=Path, default=None, metavar="CKPT",
                   help="start from this checkpoint: a spotring snapshot (file or directory) "
                   "or your own torch.save'd dict (model, optimizer, scheduler, step/epoch; "
                   "read with weights_only=True); a joiner still takes the ring's state")
    w.add_argument("--fault", type=_fault, action="append", default=[],
                   help=argparse.SUPPRESS)  # test aid: kill|stop|term|freeze @STEP
    e = sub.add_parser("export", help="write the trained model out of a durable snapshot: "
                       "a state_dict torch.load reads")
    e.add_argument("snapshot", type=Path, help="a snapshot file (step-...) or a snapshot "
                   "directory (its newest complete snapshot)")
    e.add_argument("-o", "--output", type=Path, required=True, metavar="PATH",
                   help="where to write the model (refused when it exists)")
    e.add_argument("--extra", default=None, metavar="NAME",
                   help="write the job's extra state NAME instead (e.g. an EMA's weights)")
    return p


def _export(args: argparse.Namespace) -> int:
    """``python -m trainer export SNAPSHOT -o model.pt``: nothing is overwritten."""
    import torch

    from trainer.errors import SnapshotError
    from trainer.state import export

    if args.output.exists():
        print(f"error: -o {args.output}: already exists; name a new file (nothing you own "
              "is overwritten)", file=sys.stderr)
        return 2
    try:
        tree = export.read_snapshot(args.snapshot)
        sd = export.model_of(tree, args.extra)
    except SnapshotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(f".{args.output.name}.{os.getpid()}.tmp")
    torch.save(sd, tmp)
    os.replace(tmp, args.output)
    print(f"wrote {args.extra or 'the model'} of step {tree.get('step')} (epoch "
          f"{(tree.get('cursor') or ['?'])[0]}) to {args.output}")
    return 0


def _coordinator(args: argparse.Namespace) -> int:
    from trainer.control.coordinator import Coordinator
    from trainer.state.snapshot import SnapshotSettings

    snapshot = None
    if args.snapshot_url:
        try:
            snapshot = SnapshotSettings(args.snapshot_url, every_s=args.snapshot_every_s,
                                        every_steps=args.snapshot_every_steps,
                                        keep=args.snapshot_keep)
        except ValueError as e:
            print(f"error: {e} (the --snapshot-* flags)", file=sys.stderr)
            return 2
    coord = Coordinator(args.host, args.port, _token(args.token_file),
                        heartbeat_timeout_s=args.heartbeat_timeout,
                        initial_world=args.initial_world, snapshot=snapshot)
    try:
        coord.start()
    except OSError as e:
        print(f"error: --host {args.host} --port {args.port}: cannot listen there "
              f"({e.strerror or e}); choose a free port or an address of this machine",
              file=sys.stderr)
        return 2
    print(f"coordinator listening on {coord.address[0]}:{coord.address[1]}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        outcome = serve_until_over(coord.outcome, stop, linger_s=args.linger)
    except KeyboardInterrupt:
        outcome = None
    coord.stop()
    if outcome is None:
        return 0
    st = coord.stats()
    print(f"the job is over ({outcome.value}) at step {st.get('step')}, epoch "
          f"{st.get('epoch')}: coordinator exiting", flush=True)
    return OUTCOME_EXIT.get(outcome.value, 0)


#: Seconds a standalone coordinator keeps serving once the job is over: the members read
#: the end from it at their next step boundary (milliseconds away); a worker slowed down by
#: a loaded machine gets seconds more.
LINGER_S = 5.0
#: The standalone coordinator's exit code per outcome (the daemon's codes: lost 3, failed 4).
OUTCOME_EXIT = {"done": 0, "lost": 3, "failed": 4}


def serve_until_over(outcome: Any, stop: threading.Event, *, linger_s: float = LINGER_S,
                     poll_s: float = 0.5) -> Any:
    """Wait until ``stop`` is set (returns None) or ``outcome()`` is no longer running;
    then serve ``linger_s`` more (``stop`` cuts it short) and return that outcome."""
    from trainer.protocol.messages import JobOutcome

    while not stop.wait(poll_s):
        o = outcome()
        if o is not JobOutcome.RUNNING:
            stop.wait(linger_s)
            return o
    return None


def _worker(args: argparse.Namespace) -> int:
    if args.boot_idle:  # before the heavy imports: they are most of a joiner's boot
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    from trainer.errors import CoordinatorUnreachable, DeviceError, JobError
    from trainer.worker.config import WorkerConfig
    from trainer.worker.decision import EXIT_JOB, EXIT_UNREACHABLE
    from trainer.worker.loop import Worker
    from trainer.worker.notice import NoticePoller

    if args.slowdown < 1.0:
        print(f"error: --slowdown {args.slowdown}: must be >= 1", file=sys.stderr)
        return 2
    if args.collective_timeout <= 0:
        print("error: --collective-timeout must be positive", file=sys.stderr)
        return 2
    if not 0 < args.bucket_mb < 1e5:
        print(f"error: --bucket-mb {args.bucket_mb}: must be a positive number of MB "
              "(default 25)", file=sys.stderr)
        return 2
    if not 0 < args.coordinator_grace < 1e7:
        print(f"error: --coordinator-grace {args.coordinator_grace}: must be a positive "
              "number of seconds", file=sys.stderr)
        return 2
    if args.loader_workers is not None and args.loader_workers < 0:
        print(f"error: --loader-workers {args.loader_workers}: must be >= 0", file=sys.stderr)
        return 2
    until: dict[str, int | None] = {}
    for var, key in (("SPOTRING_UNTIL_STEPS", "until_steps"),
                     ("SPOTRING_UNTIL_EPOCHS", "until_epochs")):
        raw = os.environ.get(var, "").strip()
        if raw and (not raw.isdigit() or int(raw) < 1):
            print(f"error: ${var}={raw!r}: must be a positive integer (or unset)",
                  file=sys.stderr)
            return 2
        until[key] = int(raw) if raw else None
    import torch

    torch.set_num_threads(max(1, args.threads))
    host, port = args.coordinator
    cfg = WorkerConfig(
        host=host, port=port, token=_token(args.token_file), job=args.job,
        name=args.name or f"{socket.gethostname()}-{os.getpid()}", seed=args.seed,
        slowdown=args.slowdown, metrics_file=args.metrics_file,
        record_samples=args.record_samples, collective_timeout_s=args.collective_timeout,
        connect_budget_s=args.connect_timeout, faults=tuple(args.fault),
        rejoin=not args.no_rejoin, boot_idle=args.boot_idle, ring_host=args.ring_host,
        device=args.device, bucket_mb=args.bucket_mb, output=args.output,
        loader_workers=args.loader_workers, coordinator_grace_s=args.coordinator_grace,
        zone=args.zone, mode=args.mode, record_digests=args.record_digests,
        resume=args.resume, **until)
    worker = Worker(cfg)
    if args.notice_url:
        NoticePoller(args.notice_url, worker.give_notice).start()
    try:
        code = worker.run()
        if code == EXIT_JOB and worker.failure:
            print(f"error: {worker.failure}", flush=True)
    except (JobError, DeviceError) as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_JOB
    except CoordinatorUnreachable as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_UNREACHABLE
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)  # broken groups may hold threads blocked in gloo; do not join them


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.cmd == "coordinator":
        return _coordinator(args)
    if args.cmd == "export":
        return _export(args)
    return _worker(args)


if __name__ == "__main__":
    sys.exit(main())
