"""How a run ends, and what it lost: pure decisions over the ring's stats.

Design: two small pure parts, no I/O.

- :func:`verdict` turns what the daemon sees (a stop request, workers that never join, the
  ring's ``outcome``, the epoch, step and time limits) into a :class:`Verdict`: the reason shown,
  the exit code, and whether the job is over (its fleet is then terminated whatever
  ``--on-exit`` says: a lost or failed job has nothing left to keep). A lost or failed job
  never exits 0.
- :class:`Ledger` carries the ring's figures across coordinator lives. The coordinator
  lives inside the daemon; a daemon restarted on the same state starts a new one, whose
  counters start again. The ledger (kept in the state's meta, updated with every metrics
  record by :func:`advance`) adds up the steps lost by earlier lives and what each restart
  cost: nothing when the new coordinator adopted the running ring (``stats()["adopted"]``),
  ``last step seen - S`` when it resumed from a snapshot at step S, everything when it had
  to start again from step 0. :func:`totals` gives the report's figures, including for a
  lost job the steps trained since the newest snapshot (gone with the members) and the
  money spent on every lost step.

- :func:`end_record` and :func:`recorded` write and read a run's end as the state keeps it
  (the ``run`` meta's ``ended``). The end is recorded BEFORE anything is stopped, with
  ``stopped = False``, and marked ``stopped`` once the fleet is kept or terminated, so a
  daemon killed while stopping leaves a run its next start finishes stopping instead of
  continuing (:func:`provisioner.daemon.run.workdir.decide_start`).

Exit codes: :data:`EXIT_OK` (done, or a limit reached), 2 (bad input, including workers
that never join: a broken job file), :data:`EXIT_LOST` (the ring lost every holder of the
state with no snapshot to resume from), :data:`EXIT_FAILED` (the job itself failed),
:data:`EXIT_INTERRUPTED` (130: Ctrl-C or SIGTERM, after draining).

Rule: nothing is reported that did not happen; a figure the daemon can only bound (the
steps a restart cost when the ring died while the daemon was down) is a lower bound, the
last step the daemon recorded, and documented so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from provisioner.clio import EXIT_INTERRUPTED as EXIT_INTERRUPTED_CLI

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_LOST = 3
EXIT_FAILED = 4
#: Ctrl-C or SIGTERM: the fleet drained and kept or terminated as asked, then 128 + SIGINT
#: like other tools (the CLI's convention, :data:`provisioner.clio.EXIT_INTERRUPTED`).
EXIT_INTERRUPTED = EXIT_INTERRUPTED_CLI


@dataclass(frozen=True)
class Verdict:
    """Why the run stops, its exit code, and whether the job is over."""

    reason: str
    outcome: str  # done | lost | failed | interrupted | limit | duration | workers-failing
    # | job-error
    exit_code: int
    job_over: bool
    failure: str | None = None  # the one line for stderr when the run did not succeed


def verdict(stats: Mapping[str, Any], *, interrupted: bool, crash_loop: str | None,
            until_epochs: int | None, elapsed_s: float, duration_s: float | None,
            duration_text: str | None = None, until_steps: int | None = None,
            job_error: str | None = None) -> Verdict | None:
    """The run's end, or None while it should go on (see the module docstring). A limit
    that cuts the run (``until_epochs``, ``until_steps``: the job did not end there by
    itself; ``duration_s``) says "stopped at the limit". ``job_error``: a cloud worker
    reported that the job itself fails (its ``job-error`` event): the run launches no more
    and ends, outcome ``job-error``, exit 2 (bad input: the job must be fixed)."""
    if interrupted:
        return Verdict("interrupted", "interrupted", EXIT_INTERRUPTED, False)
    if job_error:
        return Verdict("the job failed on a worker", "job-error", EXIT_BAD_INPUT, True,
                       job_error)
    if crash_loop:
        return Verdict("workers failing", "workers-failing", EXIT_BAD_INPUT, True, crash_loop)
    outcome = str(stats.get("outcome") or ("done" if stats.get("finished") else "running"))
    why = str(stats.get("failure") or "").strip()
    if outcome == "lost" or (outcome == "done" and stats.get("lost")):
        line = "the job was lost: " + (why or "no member holding its state was left, and no "
                                       "snapshot to resume from")
        return Verdict("the job was lost", "lost", EXIT_LOST, True, line)
    if outcome == "failed":
        return Verdict("the job failed", "failed", EXIT_FAILED, True,
                       "the job failed: " + (why or "a worker reported the job's error"))
    if outcome == "done":
        return Verdict("the job finished", "done", EXIT_OK, True)
    if until_epochs and int(stats.get("epoch") or 0) >= until_epochs:
        return Verdict(f"stopped at the limit: {until_epochs} epochs (--until-epochs "
                       f"{until_epochs}; the job did not end there by itself)", "limit",
                       EXIT_OK, True)
    if until_steps and int(stats.get("step") or 0) >= until_steps:
        return Verdict(f"stopped at the limit: step {until_steps} (--until-steps "
                       f"{until_steps}; the job's on_finish did not run)", "limit", EXIT_OK,
                       True)
    if duration_s is not None and elapsed_s >= duration_s:
        return Verdict(f"stopped at the limit: --duration {duration_text or duration_s} (the "
                       f"run's time; the same command goes on)", "duration", EXIT_OK, False)
    return None


#: Outcomes after which a run is over for good: a start on its place begins the next run
#: (the job finished; or the run was cut at its --until-epochs/--until-steps: the work asked
#: for is done). ``duration`` is a pause: the same command goes on.
FINAL = ("done", "limit")


def end_record(v: Verdict, t: float, *, fleet_kept: bool, stopped: bool) -> dict[str, Any]:
    """The ``ended`` record of a run (the ``run`` meta), plain data."""
    return {"outcome": v.outcome, "reason": v.reason, "t": t, "fleet_kept": fleet_kept,
            "exit_code": v.exit_code, "failure": v.failure, "job_over": v.job_over,
            "stopped": stopped}


def recorded(ended: Mapping[str, Any]) -> Verdict:
    """The :class:`Verdict` an ``ended`` record holds (a record older than ``job_over`` reads
    it from its outcome)."""
    outcome = str(ended.get("outcome") or "done")
    over = ended.get("job_over")
    if over is None:
        over = outcome in ("done", "lost", "failed", "workers-failing", "job-error")
    return Verdict(str(ended.get("reason") or outcome), outcome,
                   int(ended.get("exit_code") or 0), bool(over), ended.get("failure"))


def stopping(ended: Mapping[str, Any] | None) -> bool:
    """True when a run's end was recorded but its stop never completed (its daemon was killed
    while stopping it) and the run must not go on: its job is over, or it ended for good."""
    if not ended or ended.get("stopped", True):
        return False
    v = recorded(ended)
    return v.job_over or v.outcome in FINAL


@dataclass(frozen=True)
class Ledger:
    """The ring's figures across coordinator lives (see the module docstring)."""

    lives: int = 1  # coordinators started in this run
    lost_before: int = 0  # steps lost under earlier coordinators
    restart_lost: int = 0  # steps lost at restarts (resumed from a snapshot, or from 0)
    last_step: int = 0  # the newest committed step seen
    live_lost: int = 0  # steps_lost of the current coordinator, as last seen
    settled: bool = True  # False until the current coordinator shows how it went on

    def as_meta(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_meta(cls, data: Mapping[str, Any] | None) -> "Ledger":
        if not data:
            return cls()
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


def restarted(ledger: Ledger) -> Ledger:
    """The ledger when a new coordinator starts for the same run (a daemon restart)."""
    return replace(ledger, lives=ledger.lives + 1,
                   lost_before=ledger.lost_before + ledger.live_lost, live_lost=0,
                   settled=False)


def advance(ledger: Ledger, stats: Mapping[str, Any]) -> Ledger:
    """The ledger after one look at the current coordinator's ``stats()``."""
    step = int(stats.get("step") or 0)
    out = replace(ledger, live_lost=int(stats.get("steps_lost") or 0))
    if not out.settled:
        resumed = stats.get("resumed_from")
        if stats.get("adopted"):
            cost = 0
        elif resumed is not None:
            cost = max(0, out.last_step - int(resumed))
        elif int(stats.get("generation") or 0) >= 1 and step > 0:
            cost = out.last_step  # no member and no snapshot: it started again from step 0
        else:  # not formed yet, or a generation published (one that resumes from a
            return out  # snapshot says so once formed) that has not trained: nothing known
        out = replace(out, settled=True, restart_lost=out.restart_lost + cost, last_step=step)
    return replace(out, last_step=step) if out.settled else out


def totals(ledger: Ledger, stats: Mapping[str, Any], spend: float) -> dict[str, Any]:
    """The report's figures of loss: ``steps_lost`` (every step computed and thrown away),
    ``money_lost_usd`` (spend x lost / computed), ``resumed_from``, ``daemon_restarts``."""
    led = advance(ledger, stats)
    step = int(stats.get("step") or 0)
    lost = led.lost_before + led.restart_lost + led.live_lost
    durable = step
    snap = stats.get("snapshot") or None
    if stats.get("outcome") == "lost" or stats.get("lost"):
        kept = int(snap.get("step") or 0) if isinstance(snap, Mapping) else 0
        lost += max(0, step - kept)  # the state since the newest snapshot went with them
        durable = kept
    computed = lost + durable
    return {
        "steps_lost": lost,
        "money_lost_usd": round(spend * lost / computed, 6) if computed else 0.0,
        "resumed_from": stats.get("resumed_from"),
        "snapshot_step": snap.get("step") if isinstance(snap, Mapping) else None,
        "daemon_restarts": led.lives - 1,
        "restart_steps_lost": led.restart_lost,
        "adopted": bool(stats.get("adopted")),
    }
