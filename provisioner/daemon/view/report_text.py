"""The report a person reads: ``report.md`` from the run's figures and events.

Design: pure text from plain data. Every figure of ``report.json`` has one row in
:data:`FIELDS`: a label, how its value reads (a percentage as a percentage, money in USD,
hours and seconds named, counts as counts, nothing as "none") and what it means, written
once. The first paragraph says what happened in words; savings are claimed only for work
done (a run that trained nothing claims none, a lost job is called lost and claims none). The
events come complete and in time order, or say how many earlier ones were left out.

Rule: a figure added to :func:`provisioner.daemon.view.report.figures` gets its row here
(``tests/provisioner/daemon/test_report.py`` checks that every figure has one).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from provisioner.daemon.state import Event
from provisioner.daemon.view.status import describe, metrics_text, number

#: The most events ``report.md`` lists (the newest); it says how many earlier ones it left
#: out (every event stays in the state: ``provision status RUN --events N``).
MAX_EVENTS = 500


def _usd(v: Any) -> str:
    return f"${v:,.4f}" if isinstance(v, (int, float)) else "none"


def _pct(v: Any) -> str:
    return f"{v:.1f}%" if isinstance(v, (int, float)) else "none claimed"


def _hours(v: Any) -> str:
    return f"{v:,.2f} h" if isinstance(v, (int, float)) else "none"


def _seconds(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return "none"
    return f"{v:,.0f} s ({v / 3600:.2f} h)" if v >= 3600 else f"{v:,.1f} s"


def _count(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else \
        ("none" if v is None else str(v))


def _text(v: Any) -> str:
    return "none" if v in (None, "") else str(v)


def _yes(v: Any) -> str:
    return "yes" if v else "no"


def _step(v: Any) -> str:
    return "none" if v is None else f"step {v:,}" if isinstance(v, int) else str(v)


def _metrics(v: Any) -> str:
    if not v:
        return "none (the job's evaluate returned nothing)"
    return (f"{metrics_text(v['values'])} (measured at step {v.get('step')}, epoch "
            f"{v.get('epoch')}, {v.get('hours', 0):.2f} h into the run)")


#: figure -> (label, how it reads, what it means).
FIELDS: dict[str, tuple[str, Callable[[Any], str], str]] = {
    "run": ("run", _text, "the run's id (its work directory or state file holds one run)"),
    "name": ("name", _text, "the run's --name, if it was given one"),
    "job": ("job", _text, "what the workers trained (--job, else job.job_file)"),
    "outcome": ("outcome", _text, "done: the job finished; limit: stopped at --until-steps; "
                "lost: every member holding the state and every snapshot gone; failed: the "
                "job's own error; interrupted: Ctrl-C or provision stop; duration: --duration "
                "reached; workers-failing: workers exited before any joined; job-error: a cloud "
                "worker reported the job's own error (not relaunched)"),
    "outcome_text": ("why it stopped", _text, "the run's end in words"),
    "failure": ("failure", _text, "why the job did not succeed (none when it did)"),
    "simulated_hours": ("length", _hours, "the run's time from its first start to its end "
                        "(simulated on the local cloud)"),
    "epochs": ("epochs", _count, "epochs the ring finished"),
    "samples": ("samples", _count, "training samples the ring computed and kept"),
    "job_metrics": ("job's metrics", _metrics, "everything the job's evaluate() returned, "
                    "at the step and time it was measured"),
    "accuracy": ("accuracy", lambda v: number(v) if v is not None else "none",
                 "the job's held-out accuracy, if its evaluate returns one"),
    "spend_usd": ("spend", _usd, "Σ over instances of the price in force × the time held"),
    "cost_per_1m_samples_usd": ("cost per 1M samples", _usd, "spend / samples × 1,000,000"),
    "on_demand_usd": ("on-demand baseline", _usd, "the same instance-time at on-demand "
                      "prices, less the replacements' boots an on-demand fleet never needs "
                      "(docs/daemon.md, \"Savings\")"),
    "saved_vs_on_demand_pct": ("saved vs on-demand", _pct, "1 - spend / on-demand baseline; "
                               "claimed only for a job that trained and was not lost"),
    "checkpoint_restart_usd": ("checkpoint-restart baseline", _usd, "the same spot fleet "
                               "stopping the job on each revocation of a member (survivors "
                               "idle through the replacement's boot; half a checkpoint "
                               "interval redone after a kill)"),
    "saved_vs_checkpoint_restart_pct": ("saved vs checkpoint-restart", _pct,
                                        "1 - spend / checkpoint-restart baseline; claimed "
                                        "only for a job that trained and was not lost"),
    "checkpoint_restart_hours_lost": ("time checkpoint-restart would lose", _hours,
                                      "the boots it waits through and the work it redoes"),
    "median_boot_s": ("median boot", _seconds, "an instance's launch to its first join of "
                      "the ring, median over the instances that joined (run's seconds)"),
    "steps_lost": ("steps lost", _count, "steps computed and thrown away: at most one per "
                   "member killed without notice, what daemon restarts cost, and for a lost "
                   "job everything since its newest snapshot"),
    "money_lost_usd": ("money spent on lost steps", _usd, "spend × steps lost / steps "
                       "computed"),
    "resumed_from": ("resumed from", _step, "the snapshot step the ring last resumed from"),
    "snapshot_step": ("newest snapshot", _step, "the step of the newest durable snapshot"),
    "daemon_restarts": ("daemon restarts", _count, "times the daemon started again on this "
                        "run (its workers trained on meanwhile)"),
    "restart_steps_lost": ("steps lost to restarts", _count, "the part of steps lost that "
                           "daemon restarts cost (0 when the new daemon adopted the ring)"),
    "adopted": ("ring adopted", _yes, "whether the last daemon took the running ring over"),
    "instance_hours": ("instance-hours", _hours, "Σ over instances of the time held"),
    "launches": ("launches", _count, "instances launched"),
    "notices": ("notices", _count, "revocations with notice (the worker drained first)"),
    "kills": ("kills", _count, "revocations without notice"),
    "joins": ("joins", _count, "workers that joined the ring"),
    "members_drained": ("members drained", _count, "members that left the ring at a step "
                        "boundary (a notice, a smaller plan, the end)"),
    "members_lost": ("members lost", _count, "members the ring lost without a drain (a kill, "
                     "a crash, a hang)"),
    "events_total": ("events", _count, "events the run recorded (the time line below)"),
}


def summary(fig: Mapping[str, Any]) -> str:
    """What the run did and what it saved, in words (savings only for work done)."""
    outcome = fig.get("outcome") or "unknown"
    said = {"done": "The job finished", "lost": "The job was LOST",
            "failed": "The job FAILED", "limit": "The run stopped at its limit",
            "interrupted": "The run was interrupted", "duration": "The run reached --duration",
            "workers-failing": "The workers kept failing",
            "job-error": "The job failed on a worker"}.get(outcome, f"Outcome {outcome}")
    out = (f"{said} ({fig.get('outcome_text') or outcome}) after {_hours(fig.get('simulated_hours'))}"
           f": {_count(fig.get('samples'))} samples, {_count(fig.get('epochs'))} epochs"
           + (f", {metrics_text(fig['job_metrics']['values'])}" if fig.get("job_metrics")
              else "")
           + f"; {fig.get('notices', 0)} notices and {fig.get('kills', 0)} kills survived, "
           f"{fig.get('steps_lost', 0)} steps lost. Spend {_usd(fig.get('spend_usd'))}")
    if outcome == "lost":
        out += "; no savings claimed: the job was lost."
    elif not fig.get("samples"):
        out += "; no savings claimed: the run trained nothing."
    else:
        out += (f": {_pct(fig.get('saved_vs_on_demand_pct'))} less than on-demand "
                f"({_usd(fig.get('on_demand_usd'))}) and "
                f"{_pct(fig.get('saved_vs_checkpoint_restart_pct'))} less than "
                f"checkpoint-restart on the same spot fleet "
                f"({_usd(fig.get('checkpoint_restart_usd'))}).")
    if fig.get("failure"):
        out += f" Why: {fig['failure']}"
    return out


def markdown(title: str, fig: Mapping[str, Any], events: Sequence[Event], total_events: int,
             t0: float, decision: str | None, notes: Sequence[str]) -> str:
    """``report.md``: the title, the summary, every figure with its meaning, the plots, the
    last decision and the events (the newest :data:`MAX_EVENTS`, in time order)."""
    md = [f"# {title}", "", summary(fig), "", "| figure | value | meaning |", "|---|---|---|"]
    for key, value in fig.items():
        label, read, meaning = FIELDS.get(key, (key, _text, ""))
        md.append(f"| {label} | {read(value)} | {meaning} |")
    md += ["", "![price](price.png)", "![fleet](fleet.png)", "![throughput](throughput.png)",
           "![cost](cost.png)", "![events](events.png)", "", "## Last decision", "", "```",
           decision or "(none)", "```", "", "## Events", ""]
    shown = list(events)[-MAX_EVENTS:]
    if total_events > len(shown):
        md.append(f"({total_events - len(shown):,} earlier events are not listed here; the "
                  f"state holds all {total_events:,}: provision status RUN --events "
                  f"{total_events})")
        md.append("")
    md += [f"- {(e.t - t0) / 3600:7.3f} h  {describe(e)}" for e in shown]
    md += [""] + [f"note: {n}" for n in notes]
    return "\n".join(md) + "\n"
