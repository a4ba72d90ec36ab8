"""The report of a ``provision run``: figures, markdown and PNG plots from the state file.

Design: a function of the :class:`~provisioner.daemon.state.State` (and the ring's final stats),
written after the run; nothing here talks to a cloud or the ring. :func:`figures` are the
run's figures, each named with its unit (``_usd``, ``_pct``, ``_hours``, ``_s``), each
explained once in :data:`provisioner.daemon.view.report_text.FIELDS` (the markdown:
:mod:`provisioner.daemon.view.report_text`):

- what ran: ``run`` (id), ``name``, ``job``; how it ended: ``outcome`` (done, limit, lost,
  failed, interrupted, duration, workers-failing), ``outcome_text``, ``failure``;
- the work: ``simulated_hours``, ``epochs``, ``samples``, ``job_metrics`` (everything the
  job's ``evaluate`` returned, at the step and time measured) and ``accuracy``;
- the money: ``spend_usd`` (Σ over instances of ∫ price dt), ``cost_per_1m_samples_usd``,
  the two baselines of :mod:`provisioner.daemon.view.savings` (``on_demand_usd``,
  ``checkpoint_restart_usd``) and what was saved against each, in percent
  (``saved_vs_on_demand_pct``, ``saved_vs_checkpoint_restart_pct``): claimed only for a job
  that trained something and was not lost (else none); ``checkpoint_restart_hours_lost``,
  ``median_boot_s``;
- the losses: ``steps_lost`` (every step computed and thrown away, across coordinator lives,
  :func:`provisioner.daemon.outcome.totals`), ``money_lost_usd``, ``resumed_from``,
  ``snapshot_step``, ``daemon_restarts``, ``restart_steps_lost``, ``adopted``;
- the counts: instance-hours, launches, notices (drained), kills (no notice), joins, members
  drained and lost, events.

Every JSON figure is finite (:func:`provisioner.clio.dumps`: an infinite or NaN float becomes
null, and ``allow_nan=False``): no ``Infinity`` in a file other tools parse.

Plots (``provisioner.plots.lines`` for the series): ``price.png`` (price of every offering
held), ``fleet.png`` (instances held), ``throughput.png`` (samples/s), ``cost.png``
(cumulative spend, with the on-demand and checkpoint-restart baselines beside it) and ``events.png`` (launches, notices, kills, joins on a time line).

Rule for callers: call :func:`write_report` once the daemon has stopped (the state is final).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from provisioner import plots
from provisioner.clio import dumps
from provisioner.daemon.outcome import Ledger, totals
from provisioner.daemon.view.report_text import MAX_EVENTS, markdown
from provisioner.daemon.view.savings import checkpoint_every_s, from_state
from provisioner.daemon.view.status import measured, short_offering
from provisioner.daemon.state import EventKind, State, ring_kind

EVENT_ROWS = (EventKind.LAUNCH, EventKind.NOTICE, EventKind.KILLED, EventKind.LEFT,
              EventKind.EXITED, EventKind.TERMINATED, ring_kind("join"),
              ring_kind("leave"), ring_kind("lost"))


def figures(state: State, end_t: float, ring: Mapping[str, Any]) -> dict[str, Any]:
    """The run's figures (see the module docstring), each with its unit in its name and its
    meaning in :data:`provisioner.daemon.view.report_text.FIELDS`."""
    spend = state.spend(end_t)
    samples = int(ring.get("samples_done") or 0)
    counts: dict[str, int] = defaultdict(int)
    for e in state.events():
        counts[e.kind] += 1
        if e.instance_id:  # about a member (not the ring as a whole)
            counts[f"{e.kind}/member"] += 1
    started = state.get_meta("started_at", end_t)
    acc = ring.get("accuracy")
    run = state.get_meta("run") or {}
    ended = run.get("ended") or {}
    outcome = ended.get("outcome") or ring.get("outcome")
    lost = totals(Ledger.from_meta(state.get_meta("ledger")), ring, spend)
    money = from_state(state, end_t, checkpoint_every_s(state)).as_figures()
    claim = bool(samples) and outcome != "lost"  # savings only for work done

    def saved(share: float | None) -> float | None:
        return round(share * 100.0, 1) if claim and share is not None else None

    return {
        "run": run.get("id"),
        "name": run.get("name"),
        "job": (run.get("identity") or {}).get("job_file"),
        "outcome": outcome,
        "outcome_text": ended.get("reason"),
        "failure": ended.get("failure") or (ring.get("failure") if outcome in ("lost", "failed")
                                            else None),
        "simulated_hours": round((end_t - started) / 3600.0, 4),
        "epochs": ring.get("epoch"),
        "samples": samples,
        "job_metrics": measured(state.get_meta("job_metrics"), float(started)),
        "accuracy": None if acc is None or (isinstance(acc, float) and math.isnan(acc))
        else float(acc),
        "spend_usd": round(spend, 6),
        "cost_per_1m_samples_usd": round(spend / samples * 1e6, 6) if samples else None,
        "on_demand_usd": money["on_demand_usd"],
        "saved_vs_on_demand_pct": saved(money["saved_vs_on_demand"]),
        "checkpoint_restart_usd": money["checkpoint_restart_usd"],
        "saved_vs_checkpoint_restart_pct": saved(money["saved_vs_checkpoint_restart"]),
        "checkpoint_restart_hours_lost": money["checkpoint_restart_hours_lost"],
        "median_boot_s": money["boot_s"],
        **lost,
        "instance_hours": round(state.instance_seconds(end_t) / 3600.0, 6),
        "launches": counts[EventKind.LAUNCH],
        "notices": counts[EventKind.NOTICE],
        "kills": counts[EventKind.KILLED],
        "joins": counts[ring_kind("join")],
        "members_drained": counts[f"{ring_kind('drain')}/member"],
        "members_lost": counts[f"{ring_kind('lost')}/member"],
        "events_total": state.count_events(),
    }


def _hours(t: float, t0: float) -> float:
    return (t - t0) / 3600.0


def write_report(state: State, out_dir: str | Path, end_t: float, ring: Mapping[str, Any], *,
                 title: str = "spotring run",
                 notes: Sequence[str] = ()) -> Path:
    """Write ``report.md``, ``report.json`` and the PNGs into ``out_dir``; returns the .md path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = float(state.get_meta("started_at", end_t))
    fig = figures(state, end_t, ring)
    held_offerings = sorted({r.offering for r in state.instances()})
    # labelled as the dashboard names them ("p3.2xlarge local-1a"; on-demand marked "od")
    price = {short_offering(o.key): ([_hours(max(t, t0), t0) for t, _ in state.price_series(o)]
                                     + [_hours(end_t, t0)],
                                     [p for _, p in state.price_series(o)]
                                     + [state.price_series(o)[-1][1]])
             for o in held_offerings if state.price_series(o)}
    plots.lines(out / "price.png", price, title="price of the offerings held",
                ylabel="USD per hour")

    def series(name: str) -> tuple[list[float], list[float]]:
        rows = state.metric_series(name)
        return [_hours(t, t0) for t, _, _ in rows], [v for _, _, v in rows]

    plots.lines(out / "fleet.png", {"instances": series("fleet_total")}, title="fleet size",
                ylabel="instances")
    plots.lines(out / "throughput.png", {"samples/s": series("samples_per_s")},
                title="ring throughput", ylabel="samples per second", step=False)
    plots.lines(out / "cost.png", _cost_curves(state, t0, end_t),
                title="cumulative cost: spotring against the baselines", ylabel="USD",
                step=False)
    _events_plot(out / "events.png", state, t0, end_t)
    (out / "report.json").write_text(dumps(fig, indent=2))
    decisions = state.decisions(limit=1)
    events = state.events(limit=MAX_EVENTS, in_time=True)
    text = markdown(title, fig, events, fig["events_total"], t0,
                    decisions[-1][2] if decisions else None, notes)
    path = out / "report.md"
    path.write_text(text)
    return path


def _cost_curves(state: State, t0: float, end_t: float, points: int = 60
                 ) -> dict[str, tuple[list[float], list[float]]]:
    """Spend, on-demand and checkpoint-restart, each as it stood at ``points`` times."""
    every = checkpoint_every_s(state)
    xs, spot, od, cr = [], [], [], []
    for k in range(points + 1):
        t = t0 + (end_t - t0) * k / points
        m = from_state(state, t, every)
        xs.append(_hours(t, t0))
        spot.append(m.spend_usd)
        od.append(m.on_demand_usd)
        cr.append(m.checkpoint_restart_usd)
    return {"spotring (spot, elastic ring)": (xs, spot),
            "checkpoint-restart on the same spot fleet": (xs, cr),
            "on-demand, same fleet": (xs, od)}


def _events_plot(path: Path, state: State, t0: float, end_t: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in EVENT_ROWS if state.events(kinds=[k])]
    fig, ax = plt.subplots(figsize=(8, 3.0), dpi=100)
    for row, kind in enumerate(kinds):
        xs = [_hours(e.t, t0) for e in state.events(kinds=[kind])]
        ax.scatter(xs, [row] * len(xs), marker="|", s=200, label=kind)
    ax.set_yticks(range(len(kinds)), kinds)
    ax.set_xlim(0, max(_hours(end_t, t0), 1e-6))
    ax.set_xlabel("hours")
    ax.set_title("events")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
