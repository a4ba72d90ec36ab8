"""``provision run``: the daemon, on the embedded local cloud (default) or on AWS/GCP.

Design: argparse only. Flags are checked here and become one frozen
:class:`provisioner.daemon.run.options.RunOptions`; the run itself is a
:class:`provisioner.daemon.run.session.RunSession` on the local environment (no ``--config``,
or ``[cloud] driver = "local"``) or the cloud one, shown in this terminal by
:mod:`provisioner.commands.run_terminal` (the session never prints).

Rule: bad flags are a UserError (one line, exit 2) before anything starts: every number is
finite and within a bound that names the flag and the fix (:func:`check_flags`, with
:func:`provisioner.clio.bounded`); the job
(``--job``, else ``job.job_file``) is checked without importing it
(:func:`provisioner.daemon.run.jobspec.check_job`) and handed on as ``job.job_file``, with
the code folder that travels with a cloud run as ``job.code`` (:func:`code_folder`); the metrics
address is decided once (:func:`metrics_endpoint`). ``--detach`` re-runs the same command
line in its own session (:mod:`provisioner.daemon.run.detach`).

Exit codes (:mod:`provisioner.daemon.outcome`): 0 the job done or a limit reached, 2 bad
input, 3 the job was lost, 4 the job failed, 130 Ctrl-C or SIGTERM (after draining).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from provisioner.clio import bounded, whole
from provisioner.config import load_settings, parse_settings
from provisioner.errors import UserError

if TYPE_CHECKING:
    from provisioner.daemon.run.options import RunOptions

log = logging.getLogger(__name__)

#: Bounds of the flags (a typo such as ``--speed inf`` or ``--outages-per-hour 1e9`` is refused
#: before anything starts, instead of a run that never ends or a market that fills memory).
MAX_SPEED = 1_000_000.0  # as local.speed
MAX_OUTAGES_PER_HOUR = 60.0  # an outage a minute per offering: a stress test, not a market
MAX_LOCAL_WORKERS = 64  # each local worker is a torch process on this machine
MAX_EPOCHS = 1_000_000
MAX_STEPS = 10**12
MAX_DURATION_S = 365 * 86400.0  # a simulated year


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run the provisioning daemon (default: the local main job)",
                       description="Run the daemon. With no --config: the embedded local cloud "
                       "trains the job (--job; default the packaged examples/digits.py) on "
                       "worker processes while prices and revocations come from a trace or "
                       "the built-in generator. --detach runs it in the background (see "
                       "`provision list`, `provision logs`, `provision down`).")
    p.add_argument("--job", metavar="FILE|MODULE", help="the job to train: a .py file or a "
                   "module defining make_job(seed) (default job.job_file, the packaged "
                   "spotring_examples.digits); a cloud run's workers import it by module name")
    p.add_argument("--code", metavar="DIR|git+URL@REF", help="a cloud run: the folder of your "
                   "code, packed (as git would commit it, or honouring its .gitignore), shipped "
                   "with the run and unpacked on every worker, its requirements.txt installed; "
                   "--job is a .py file inside it (default job.code, else the job file's "
                   "folder); git+https://host/repo@REF: this host clones REF and packs it "
                   "(--job: the path inside the repository)")
    p.add_argument("--detach", "-d", action="store_true", help="start in the background (own "
                   "session, output to WORKDIR/daemon.log, or STATE_PATH.log for a cloud "
                   "run); prints the pid and how to follow it")
    p.add_argument("--config", help="TOML settings (default: the embedded local cloud)")
    p.add_argument("--trace", action="extend", nargs="+", metavar="PATH",
                   help="price/availability trace files or folders; default: the "
                   "built-in generator")
    p.add_argument("--speed", type=float, help="the most simulated seconds per real second "
                   "(default local.speed, 60), for the built-in market and a --trace alike; "
                   "with the packaged example the clock follows the ring: where this machine "
                   "trains slower than the reference (local.reference_samples_per_s) it runs "
                   "slower in proportion, so the market meets the job at the same samples on "
                   "any machine")
    p.add_argument("--until-epochs", type=int, metavar="N", help="train N epochs: the job "
                   "ends there by itself (its on_finish runs; refused for a job that would "
                   "train past it)")
    p.add_argument("--until-steps", type=int, metavar="N", help="stop the run at step N "
                   "(stopped at the limit: the job's on_finish does not run)")
    p.add_argument("--duration", metavar="T", help="stop after T simulated time (e.g. 90m, 2h)")
    p.add_argument("--report", metavar="DIR", help="report directory (default WORKDIR/report)")
    p.add_argument("--workdir", help="state, worker logs, report (local run; default "
                   "local.state_dir, ./spotring-run)")
    p.add_argument("--on-exit", choices=("keep", "terminate"),
                   help="what happens to the fleet at exit (local default: terminate)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port "
                   "(default [metrics] port; 0: any free port)")
    p.add_argument("--metrics-host", metavar="ADDR", help="address the metrics listen on "
                   "(default [metrics] host, 127.0.0.1; 0.0.0.0 for a remote Prometheus)")
    p.add_argument("--seed", type=int, default=7, help="seed of the built-in generator")
    p.add_argument("--outages-per-hour", type=float, metavar="R",
                   help="built-in generator: capacity outages per offering per simulated hour "
                   "(default 0.3; 0 = revocations only from `provision revoke`)")
    p.add_argument("--max-size", type=int, help="most workers (local default 3; overrides "
                   "fleet.max_size)")
    p.add_argument("--name", metavar="NAME", help="a name for the run: `provision status/"
                   "logs/stop/down NAME` find it, even once stopped")
    p.add_argument("--no-dashboard", action="store_true", help="log lines instead of the "
                   "live dashboard")
    p.add_argument("--record-samples", action="store_true",
                   help="workers record the sample ids of every step (exactly-once check)")
    p.set_defaults(handler=run)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds (at most a simulated year).
    Raises UserError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--duration {text!r}: expected a positive time such as 90s, 15m, 2h")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not seconds <= MAX_DURATION_S:
        raise UserError(f"--duration {text!r}: at most 365d (a simulated year); give a "
                        f"shorter time such as 6h")
    return seconds


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag finite and within its bound (see the constants above). Raises
    UserError naming the flag and the fix."""
    bounded("--speed", args.speed, 0, MAX_SPEED, "e.g. --speed 60 (one real minute is one "
            "simulated hour)", low_open=True)
    bounded("--outages-per-hour", args.outages_per_hour, 0, MAX_OUTAGES_PER_HOUR,
            "e.g. 0.3 (the default) or 1 for a busy market")
    bounded("--until-epochs", args.until_epochs, 1, MAX_EPOCHS, "e.g. --until-epochs 30")
    bounded("--until-steps", args.until_steps, 1, MAX_STEPS, "e.g. --until-steps 1000")
    bounded("--max-size", args.max_size, 1, MAX_LOCAL_WORKERS if args.config is None
            else 10_000, "the most workers at once, e.g. --max-size 3"
            + (" (each local worker is a process on this machine)" if args.config is None
               else ""))
    bounded("--metrics-port", args.metrics_port, 0, 65535, "a free TCP port, or 0 for any")
    whole("--seed", args.seed, 0, 2**32 - 1, "e.g. --seed 7 (the default)")


def run(args: argparse.Namespace) -> int:
    with quiet_libraries(args):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    check_flags(args)
    duration = parse_duration(args.duration) if args.duration else None
    if args.config is None:
        fleet: dict[str, Any] = {"max_size": args.max_size or 3, "markets": ["spot"]}
        settings = parse_settings({"fleet": fleet}, origin="<built-in local defaults>")
    else:
        settings = load_settings(args.config)
        if args.max_size is not None:  # the flag overrides the config's fleet.max_size
            fleet = {**settings.fleet.model_dump(), "max_size": args.max_size}
            settings = parse_settings({**settings.model_dump(exclude={"fleet"}),
                                       "fleet": fleet}, origin=f"{args.config} with --max-size")
    cloud = settings.cloud.driver != "local"
    job, code = job_and_code(args, settings, cloud)
    settings = settings.model_copy(update={"job": settings.job.model_copy(
        update={"job_file": job, "code": code})})
    options = options_from(args, settings, duration)
    if args.detach and not os.environ.get(DETACHED_ENV):
        from provisioner.daemon.run.detach import detach
        from provisioner.daemon.run.target import from_settings

        import sys

        done = detach(list(args.argv), from_settings(settings, args.config, args.workdir))
        for line in done.lines:
            print(line, file=sys.stderr if done.code else sys.stdout, flush=True)
        return done.code
    return run_session(options, dashboard=not args.no_dashboard)


def job_and_code(args: argparse.Namespace, settings: Any, cloud: bool) -> tuple[str, str | None]:
    """The job (``--job``, else ``job.job_file``) checked, and the code that travels with it
    (:func:`code_folder`). With a git source (``--code git+URL@REF``, a cloud run) the job is
    its path inside the repository, checked when the daemon clones it. Raises UserError
    naming the flag or setting."""
    from provisioner.daemon.run.jobspec import check_job
    from provisioner.drivers.code import check_git_job, is_git, parse_git

    spec, flag = ((args.job, "--job") if args.job is not None
                  else (settings.job.job_file, "job.job_file"))
    given, name = ((args.code, "--code") if args.code is not None
                   else (settings.job.code, "job.code"))
    if cloud and is_git(given):
        parse_git(given, name)
        return check_git_job(spec, flag), given
    job = check_job(spec, flag, cloud=cloud)
    return job, code_folder(job, args.code, settings, cloud)


def code_folder(job: str, flag: str | None, settings: Any, cloud: bool) -> str | None:
    """The code folder that travels with the run (``--code``, else ``job.code``, else the
    job file's folder on a cloud run), absolute; None when nothing travels. Raises UserError
    naming the flag or setting: a local run's workers read the job on this host, so there
    ``--code`` is refused."""
    from provisioner.drivers.code import resolve_code

    given, name = (flag, "--code") if flag is not None else (settings.job.code, "job.code")
    if not cloud:
        if given is not None:
            raise UserError(f"{name} {given}: a local run's workers read the job on this host; "
                            f"--code is for a cloud run ([cloud] driver aws or gcp): drop it")
        return None
    try:
        folder = resolve_code(job, given)
    except UserError as exc:
        raise UserError(str(exc).replace("--code", name, 1)) from None
    return str(folder) if folder is not None else None


#: Loggers whose warnings are the run's ordinary news (a member lost on a kill, a coalesced
#: round on a busy machine): the dashboard and the report say what happened, so their lines
#: would only fill stderr. ``-v`` or ``--log-level`` brings them back.
LIBRARY_LOGGERS = ("apscheduler", "trainer")


@contextmanager
def quiet_libraries(args: argparse.Namespace) -> Iterator[None]:
    """Stderr stays quiet unless something needs the user: the libraries' warnings are
    silenced for the command's life unless ``-v`` or ``--log-level`` asked for them; the
    daemon's own (a full disk, an error it cannot work around) still show."""
    if getattr(args, "verbose", 0) or getattr(args, "log_level", None):
        yield
        return
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def options_from(args: argparse.Namespace, settings: Any,
                 duration: float | None) -> RunOptions:
    """The run's frozen options from checked flags and settings (the daemon never sees
    ``args``)."""
    from pathlib import Path

    from provisioner.daemon.run.options import RunOptions

    detached = os.environ.get(DETACHED_ENV)
    return RunOptions(settings=settings, config=args.config,
                      workdir=Path(args.workdir) if args.workdir else None,
                      report=Path(args.report) if args.report else None,
                      traces=tuple(args.trace or ()), speed=args.speed, seed=args.seed,
                      outages_per_hour=args.outages_per_hour, until_epochs=args.until_epochs,
                      until_steps=args.until_steps,
                      duration_s=duration, duration_text=args.duration, on_exit=args.on_exit,
                      metrics_endpoint=metrics_endpoint(args, settings),
                      record_samples=bool(args.record_samples), name=args.name,
                      detached_log=Path(detached) if detached else None)


def run_session(options: RunOptions, *, dashboard: bool) -> int:
    """Run the session of ``options`` on its environment (local or cloud), show it in this
    terminal, print its end; returns the exit code."""
    import sys

    from provisioner.commands.run_terminal import Terminal, end_lines
    from provisioner.daemon.run.session import RunSession

    if options.settings.cloud.driver == "local":
        from provisioner.daemon.run.local import LocalEnvironment

        env: Any = LocalEnvironment(options)
    else:
        from provisioner.daemon.run.cloud import CloudEnvironment

        env = CloudEnvironment(options)
    result = RunSession(options, env, Terminal(dashboard)).run()
    out, err = end_lines(result)
    for line in out:
        print(line, flush=True)
    if err:
        print(err, file=sys.stderr, flush=True)
    return result.exit_code


#: Set in the environment of the daemon ``--detach`` starts (its log file's path): that
#: process is the detached daemon, so it runs in the foreground of its own session.
DETACHED_ENV = "SPOTRING_DETACHED_LOG"


def metrics_endpoint(args: argparse.Namespace, settings: Any) -> tuple[str, int] | None:
    """Where /metrics listens: the flags over ``[metrics]``; None when no port is set."""
    port = args.metrics_port if args.metrics_port is not None else settings.metrics.port
    if port is None:
        if args.metrics_host is not None:
            raise UserError(f"--metrics-host {args.metrics_host}: no metrics port; add "
                            f"--metrics-port PORT (or [metrics] port)")
        return None
    host = args.metrics_host if args.metrics_host is not None else settings.metrics.host
    if not host.strip():
        raise UserError("--metrics-host: empty; use 127.0.0.1 (this host only) or 0.0.0.0")
    return host.strip(), port
