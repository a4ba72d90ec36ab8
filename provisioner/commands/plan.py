"""``provision plan``: the fleet the optimiser would run now, and why.

Design: argparse and wiring only: source -> sanity -> risk -> the market view
(:func:`provisioner.plan.build.market_view`) -> :class:`provisioner.plan.pipeline.Planner`,
the decision the daemon and the simulator's spotring make, with nothing held and (for the
deadline objective) no work done yet. Output is ``Plan.explain()`` for people or one JSON
object (``--json``) for programs.

Rule: an infeasible configuration is a user error (exit 2) whose message names the
constraint; nothing is launched by this command.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from provisioner.clio import add_json_flag, print_json
from provisioner.errors import UserError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="the fleet the optimiser would run now, and why",
        description="Read prices (a cloud or a trace), estimate revocation risk and solve the "
        "fleet MILP for the objective in the config; print the fleet and the constraints "
        "that bound it.")
    p.add_argument("--config", metavar="FILE", help="TOML settings (see examples/config.toml)")
    p.add_argument("--source", choices=("aws", "gcp", "trace"),
                   help="where prices come from (default: source.kind in the config)")
    p.add_argument("--trace", action="extend", nargs="+", default=[], metavar="PATH",
                   help="trace file(s) or folder(s) (default: source.trace/traces in the config, "
                   "else $SPOTRING_DATA)")
    add_json_flag(p, help="print one JSON object")
    p.add_argument("--endpoint-url", help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


def plan_json(plan) -> dict:
    """The plan as plain JSON-able data (with the training mode the fleet runs)."""
    from provisioner.plan.mode import training_mode

    mode = training_mode(plan)
    return {
        "status": plan.status, "objective": plan.objective,
        "cost_per_hour": round(plan.cost_per_hour, 6), "throughput": round(plan.throughput, 3),
        "raw_throughput": round(plan.raw_throughput, 3),
        "ring_efficiency": round(plan.ring_efficiency, 6), "link": plan.link,
        "hazard_per_hour": round(plan.hazard_per_hour, 6), "binding": list(plan.binding),
        "fleet": [{"offering": c.offering.key, "count": plan.counts[c.offering],
                   "price_per_hour": c.price_per_hour, "samples_per_s": c.samples_per_s,
                   "useful_samples_per_s": round(c.useful, 3),
                   "hazard_per_hour": c.hazard_per_hour} for c in plan.chosen],
        "considered": plan.considered, "pruned": plan.pruned,
        "solve_ms": round(plan.solve_ms, 2), "notes": list(plan.notes),
        "mode": mode.mode, "mode_reason": mode.reason, "groups": mode.groups,
    }


def run(args: argparse.Namespace) -> int:
    from pricing.errors import PricingError
    from pricing.risk import age_shape, estimate, with_signals
    from pricing.sanity import check
    from pricing.sources import make_source
    from provisioner.config import load_settings
    from provisioner.plan.build import latest_prices, market_view
    from provisioner.plan.objective import planner_input
    from provisioner.plan.pipeline import FleetView, Planner
    from provisioner.plan.throughput import ThroughputModel

    settings = load_settings(args.config)
    kind = args.source or settings.source.kind
    traces = list(args.trace) or [t for t in [settings.source.trace, *settings.source.traces] if t]
    if kind != "trace" and args.trace:
        raise UserError("--trace is only used with --source trace")
    try:
        source = make_source(kind, trace=traces or None, regions=settings.source.regions or None,
                             endpoint_url=args.endpoint_url)
    except PricingError as exc:
        if type(exc) is PricingError:
            raise UserError(str(exc)) from None
        raise
    snap = source.fetch(regions=settings.source.regions or None,
                        gpus=settings.source.gpus or None)
    now = max((q.time for q in snap.quotes), default=None)
    if now is None:
        raise UserError("the source returned no prices (check source.regions/gpus and the trace)")
    if kind == "trace" and hasattr(source, "now"):
        now = source.now()
    ok, refused = check(snap.quotes, now=now,
                        max_age=timedelta(hours=settings.optimizer.max_quote_age_hours))
    risks = with_signals(estimate({q.offering for q in ok} | {
        q.offering.with_market("on-demand") for q in ok if q.on_demand_per_hour}, snap.lifetimes),
        snap.signals, now=now, horizon_h=settings.fleet.churn_horizon_hours)
    job = settings.job
    model = ThroughputModel(priors=job.throughput_priors, unit=job.samples_per_s_per_unit)
    prices = latest_prices(ok, now, timedelta(hours=settings.optimizer.max_quote_age_hours))
    t = now.timestamp()
    planner = Planner.of(planner_input(settings))  # the daemon's own input, at its start
    from provisioner.commands.simulate import quiet_stdout

    with quiet_stdout():
        market = market_view(prices, model, risks, age_shape=age_shape(snap.lifetimes))
        decision = planner.decide(market, FleetView(), planner.goal.progress(t), t)
    if decision.plan is None:
        raise UserError("nothing to plan: " + decision.explain())
    plan = decision.plan
    if args.json:
        out = plan_json(plan)
        out["refused_quotes"] = len(refused) + len(snap.rejected)
        print_json(out, indent=1)
    else:
        print(f"plan at {now:%Y-%m-%d %H:%M} UTC from {kind} ({len(ok)} quotes, "
              f"{len(refused) + len(snap.rejected)} refused)")
        print(plan.explain())
        from provisioner.plan.mode import training_mode

        mode = training_mode(plan)
        print(f"training mode: {mode.mode} ({mode.reason})")
    return 0
