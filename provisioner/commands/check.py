"""``provision check --job FILE|MODULE``: build the job once here, as ``provision run`` does
before it launches anything, and nothing else.

Design: argparse only: the job is checked from its syntax tree
(:func:`provisioner.daemon.run.jobspec.check_job`), then built in a child process with the
environment a worker gets (``make_job`` and one batch through the model, forward and
backward: :func:`provisioner.daemon.run.jobcheck.build`), and the limits a run would give it
(``--until-epochs``, ``--until-steps``) are checked against what it trains
(:func:`provisioner.daemon.run.jobcheck.limits`). It prints what it found; a job that fails
is one line naming it and the cause, exit 2. With ``--code DIR`` (or a ``.py`` job and
``[job] code``) the folder is packed as a cloud run packs it (:func:`provisioner.drivers.
code.pack`), unpacked into a temporary folder and the job built from there, started in its
folder as a worker starts it: a helper the packing leaves out fails here, not on the fleet
(its ``requirements.txt`` is not installed: this host's packages are used).
"""

from __future__ import annotations

import argparse
from typing import Any

from provisioner.clio import add_json_flag, bounded, print_json


def register(sub: Any) -> None:
    p = sub.add_parser("check", help="build the job once, as run does first (make_job, a "
                       "batch)", description="Build the job as `provision run` does "
                       "before it launches anything: make_job with the workers' environment "
                       "and one batch through the model; check --until-epochs/--until-steps "
                       "against what it trains. Nothing is started.")
    p.add_argument("--job", metavar="FILE|MODULE", help="the job (default job.job_file of "
                   "--config, else the packaged spotring_examples.digits)")
    p.add_argument("--code", metavar="DIR|git+URL@REF", help="build the job from DIR (or the "
                   "git ref, cloned here) packed as a cloud run ships it (--job a .py file "
                   "inside it; default job.code)")
    p.add_argument("--config", metavar="FILE", help="settings (for job.job_file)")
    p.add_argument("--until-epochs", type=int, metavar="N", help="the epochs a run would "
                   "give it")
    p.add_argument("--until-steps", type=int, metavar="N", help="the steps a run would give "
                   "it")
    add_json_flag(p, help="JSON: what the build found")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from provisioner.commands.run import MAX_EPOCHS, MAX_STEPS
    from provisioner.config import load_settings, parse_settings
    from provisioner.daemon.run.jobcheck import build, limit_env, limits
    from provisioner.daemon.run.jobspec import check_job
    from provisioner.drivers.code import check_git_job, is_git

    bounded("--until-epochs", args.until_epochs, 1, MAX_EPOCHS, "e.g. --until-epochs 30")
    bounded("--until-steps", args.until_steps, 1, MAX_STEPS, "e.g. --until-steps 1000")
    settings = load_settings(args.config) if args.config else parse_settings({})
    code = args.code if args.code is not None else settings.job.code
    job = args.job if args.job is not None else settings.job.job_file
    flag = "--job" if args.job is not None else "job.job_file"
    spec = check_git_job(job, flag) if is_git(code) else check_job(job, flag)
    env = {"OMP_NUM_THREADS": "1", **limit_env(args.until_epochs, args.until_steps)}
    if code is None:
        facts = build(spec, env)
    else:
        facts = build_packed(spec, code, env, settings.job.code_max_mb)
    notes = limits(facts, spec, args.until_epochs, args.until_steps)
    if args.json:
        from dataclasses import asdict

        print_json({"job": spec, **asdict(facts), "steps_per_epoch": facts.steps_per_epoch,
                    "notes": notes})
        return 0
    for line in (facts.text(spec), *notes):
        print(line)
    return 0


def build_packed(spec: str, code: str, env: dict[str, str], max_mb: float) -> Any:
    """Build the job ``spec`` from the folder ``code`` packed and unpacked as a worker gets
    it. Raises UserError naming ``--code`` or ``--job``."""
    import tarfile
    import tempfile
    from pathlib import Path

    from provisioner.daemon.run.jobcheck import build
    from provisioner.drivers.code import code_root, is_git, pack, resolve_code

    if not is_git(code):
        code = str(resolve_code(spec, code))
    with tempfile.TemporaryDirectory(prefix="spotring-check-") as tmp, code_root(
            code, spec) as (root, job_file, _origin):
        packed = pack(root, job_file, Path(tmp), max_mb=max_mb)
        unpacked = Path(tmp) / "code"
        with tarfile.open(packed.path) as tar:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.11.4+
            tar.extractall(unpacked, **safe)
        job = unpacked / packed.job
        return build(str(job), env, cwd=str(job.parent))
