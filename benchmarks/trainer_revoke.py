"""Benchmark: what a revocation costs the ring, with notice, killed, and hung (issue 3).

Design. One spotring ring of ``--workers`` (default 4) trains examples/digits.py around an
in-process coordinator; one metrics line per step and worker. Three workers are then taken
away one after the other, each once the ring is steady again:

1. notice: SIGTERM (what the local driver, AWS ``spot/instance-action`` and GCP
   ``preempted`` turn into); the worker must finish its step and leave at the boundary;
2. kill: SIGKILL; survivors see the broken collective, discard the step and re-form;
3. hang: SIGSTOP (a vanished VM); found by heartbeats / the collective timeout.

Figures (one JSON line on stdout): ``steps_lost_notice`` (goal 0) and ``steps_lost_kill``
(goal <= 1): the coordinator's count of discarded steps across that reconfiguration;
``kill_recover_ms``: SIGKILL -> the first step completed by a survivor in the new
generation (goal <= 1000 on loopback); ``hang_detect_s``: SIGSTOP -> the first step completed
in the generation without the hung worker (bounded by ``--heartbeat-timeout`` and
``--collective-timeout``, which are reported too); ``step_ms``: the steady median step time
before the first revocation (the baseline the pauses compare with). ``--nccl-double`` runs
every worker with the NCCL double of tests/fakes/nccl.py (NCCL's failure semantics on CPU:
every generation is an NCCL one; issue 29).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from _common import DEFAULT_JOB, Ring, digits_env, emit, setup_logging, steps_by_number, wait_for

log = logging.getLogger("benchmarks.revoke")


def _first_after(ring: Ring, names: list[str], t0: float, generation: int) -> dict | None:
    """The earliest step record of any of ``names`` after ``t0`` in a generation > given."""
    best = None
    for n in names:
        for r in ring.metrics(n):
            if r["t"] > t0 and r["generation"] > generation and (best is None or r["t"] < best["t"]):
                best = r
    return best


def _generation(ring: Ring) -> int:
    plan = ring.coordinator.plan()
    return plan.generation if plan else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4, help="at least 4 (3 are taken away)")
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--settle-steps", type=int, default=8, help="steps between events")
    ap.add_argument("--heartbeat-timeout", type=float, default=2.0)
    ap.add_argument("--collective-timeout", type=float, default=3.0)
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--device", default="cpu",
                    help="every worker's --device (cpu, cuda, cuda:N; default cpu); workers "
                    "sharing one GPU reduce over gloo with CUDA tensors")
    ap.add_argument("--nccl-double", action="store_true",
                    help="workers with the NCCL double (NCCL's failure semantics on CPU)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.workers < 4:
        ap.error("--workers: at least 4")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-revoke-"))
    names = [f"w{k}" for k in range(args.workers)]
    extra = ["--collective-timeout", str(args.collective_timeout), "--no-rejoin"]
    env = digits_env(args.global_batch, 100 * args.settle_steps)
    out: dict = {"benchmark": "trainer_revoke", "workers": args.workers, "device": args.device,
                 "nccl_double": args.nccl_double,
                 "heartbeat_timeout_s": args.heartbeat_timeout,
                 "collective_timeout_s": args.collective_timeout}
    with Ring(workdir, args.job, env, initial_world=args.workers,
              heartbeat_timeout_s=args.heartbeat_timeout, device=args.device,
              nccl_double=args.nccl_double) as ring:
        for n in names:
            ring.add_worker(n, extra=extra)
        ring.wait_step(2 * args.settle_steps, args.timeout)
        recs = steps_by_number(ring.metrics(names[0]))
        times = [recs[s]["t"] for s in sorted(recs)][-args.settle_steps:]
        out["step_ms"] = round(statistics.median(b - a for a, b in zip(times, times[1:])) * 1e3, 1)

        survivors = list(names)

        def take_away(victim: str, sig: int, what: str) -> tuple[float, float, int]:
            """Send ``sig``; return (seconds to the first new-generation step, when, lost)."""
            survivors.remove(victim)
            gen = _generation(ring)
            lost0 = int(ring.coordinator.stats().get("steps_lost", 0))
            t0 = time.time()
            os.kill(ring.procs[victim].pid, sig)
            wait_for(lambda: _first_after(ring, survivors, t0, gen) is not None, args.timeout,
                     f"a step after the {what} of {victim}")
            first = _first_after(ring, survivors, t0, gen)
            assert first is not None
            step_now = ring.step()
            ring.wait_step(step_now + args.settle_steps, args.timeout)
            lost = int(ring.coordinator.stats().get("steps_lost", 0)) - lost0
            log.info("%s of %s: first step of generation %d after %.3fs, %d steps lost", what,
                     victim, first["generation"], first["t"] - t0, lost)
            return first["t"] - t0, t0, lost

        _, _, out["steps_lost_notice"] = take_away(names[-1], signal.SIGTERM, "notice")
        code = ring.procs[names[-1]].wait(timeout=args.timeout)
        out["notice_exit_code"] = code
        dt, _, out["steps_lost_kill"] = take_away(names[-2], signal.SIGKILL, "kill")
        out["kill_recover_ms"] = round(dt * 1e3, 1)
        dt, _, out["steps_lost_hang"] = take_away(names[-3], signal.SIGSTOP, "hang")
        out["hang_detect_s"] = round(dt, 3)
        out["events"] = [f"{e['kind']}:{e['name']}" for e in ring.coordinator.events()]
    out["workdir"] = str(workdir)
    emit(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
