"""``provision simulate``: replay real traces against policies and write a report.

Design: wiring only: traces -> :func:`pricing.sources.trace.load_trace` ->
:func:`provisioner.sim.world.build_world` -> :func:`provisioner.sim.report.run_all` ->
:func:`provisioner.sim.report.write_report`. Job and fleet figures (model size, batch, boot,
re-form, zone share, max size) come from ``--config`` when given; flags override the few
the simulation needs. The simulator runs on a virtual clock: it never sleeps.

Rule: the report says how traces were combined and what was wrong in them; a trace that
cannot be used is a user error (exit 2) naming the file and the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Iterator

from provisioner.clio import add_json_flag, print_json
from provisioner.errors import UserError


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null for the block: HiGHS (C++) sometimes prints
    debug lines to stdout, which would corrupt ``--json`` output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _kv(text: str) -> tuple[str, float]:
    itype, sep, usd = text.partition("=")
    try:
        value = float(usd)
    except ValueError:
        value = -1.0
    if not sep or not itype or not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TYPE=USD_PER_HOUR, e.g. p3.2xlarge=3.06")
    return itype, value


#: Bounds of the numeric flags: (lowest, highest, what a value means). A value outside is
#: refused with one line naming the flag and the range, before anything is read or written.
LIMITS = {
    "work": (1e-9, 1e18, "samples to train"),
    "deadline": (1e-3, 24 * 366 * 10, "hours from the start"),
    "hours": (1e-3, 24 * 366, "hours to replay (the simulator steps through them)"),
    "tick": (1.0, 86400.0, "seconds between decisions"),
    "checkpoint": (1.0, 7 * 86400.0, "seconds between checkpoints"),
    "restart": (0.0, 86400.0, "seconds a restart from a checkpoint takes"),
    "size": (1, 1000, "instances of the baselines"),
    "every": (0.1, 24 * 366, "hours between the starts of --every"),
}


def check_flags(args: argparse.Namespace) -> None:
    """Refuse absurd numbers (inf, NaN, 1e9 hours, a zero tick) with the flag and the fix."""
    import math

    from pricing.sources.trace_io import MAX_PRICE_PER_HOUR

    for name, (lo, hi, what) in LIMITS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
            raise UserError(f"--{name} {value}: must be {what}, between {lo:g} and {hi:g}")
    for itype, usd in args.on_demand:
        if not (math.isfinite(usd) and 0 < usd <= MAX_PRICE_PER_HOUR):
            raise UserError(f"--on-demand {itype}={usd}: must be a price in USD per hour, at most "
                            f"{MAX_PRICE_PER_HOUR:g}")


#: The policy names (kept here so building the parser imports neither scipy nor matplotlib;
#: tests check it equals provisioner.sim.report.ALL_POLICIES).
ALL_POLICIES = ("spotring", "on-demand", "cheapest-first", "static-spot", "uniform-progress",
                "hindsight")


def _check_writable(directory: str) -> None:
    """Refuse a report folder that cannot be written, before anything runs or is made."""
    path = os.path.abspath(directory)
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--report {directory}: {probe} is not a writable folder; pass a folder "
                        "you can write")


def _time_flag(flag: str, text: str | None, parse: Any) -> Any:
    if not text:
        return None
    try:
        return parse(text)
    except (ValueError, OverflowError):
        raise UserError(f"--{flag} {text!r}: not an ISO 8601 time (e.g. 2024-01-01T00:00:00Z)"
                        ) from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate", help="replay real traces against spotring and baseline policies",
        description="Replay price and availability traces on a virtual clock against "
        "provisioning policies; write a markdown report with plots; --json prints the figures.")
    p.add_argument("--trace", action="extend", nargs="+", required=True, metavar="PATH",
                   help="trace files or folders (prices and/or availability)")
    p.add_argument("--work", type=float, required=True, metavar="SAMPLES",
                   help="samples to train (e.g. 1.4e8)")
    p.add_argument("--deadline", type=float, metavar="HOURS",
                   help="deadline from the start (with an on-demand price, also prints what "
                   "the deadline costs at least: kept safe were all spot to vanish, and "
                   "with objective.safety_hours of slack kept whole)")
    p.add_argument("--policy", action="extend", nargs="+", choices=ALL_POLICIES, metavar="NAME",
                   help=f"policies to run (default: all that apply): {', '.join(ALL_POLICIES)}")
    p.add_argument("--report", metavar="DIR", help="write report.md, figures.json and PNGs here")
    add_json_flag(p, help="print one JSON object keyed by policy")
    p.add_argument("--config", metavar="FILE", help="TOML settings for job and fleet figures")
    p.add_argument("--type", dest="itype", metavar="TYPE",
                   help="the job's instance type for the baselines (default: the spot type with "
                   "the most offerings)")
    p.add_argument("--size", type=int, default=4, help="instances of the baselines (default 4)")
    p.add_argument("--on-demand", action="append", type=_kv, default=[], metavar="TYPE=USD",
                   help="on-demand price for a type the traces lack (repeatable)")
    p.add_argument("--types", nargs="+", default=[], metavar="TYPE", help="only these types")
    p.add_argument("--regions", nargs="+", default=[], metavar="REGION", help="only these regions")
    p.add_argument("--start", metavar="TIME", help="start (ISO 8601; default: start of the traces)")
    p.add_argument("--trace-start", metavar="TIME",
                   help="the start of user traces whose times are a number in a unit (time_ms, "
                   "time_s or time_h columns; ISO 8601; default: the Unix epoch)")
    p.add_argument("--hours", type=float, help="length of the period to replay")
    p.add_argument("--tick", type=float, default=600.0, metavar="S", help="decision period (600 s)")
    p.add_argument("--checkpoint", type=float, default=1800.0, metavar="S",
                   help="checkpoint interval of restart-based policies (1800 s)")
    p.add_argument("--restart", type=float, default=300.0, metavar="S",
                   help="restart cost from a checkpoint (300 s)")
    p.add_argument("--seed", type=int, default=0, help="seed of drawn revocations")
    p.add_argument("--every", type=float, metavar="HOURS",
                   help="replay the --deadline from every HOURS of the traces (each start whose "
                   "deadline and 6 h more fit), spotring against on-demand and the hindsight "
                   "bound at each, and print the spread: one start is one draw of the market")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from collections import Counter

    from pricing.sources.trace import load_trace
    from pricing.sources.trace_formats import parse_time
    from provisioner.config import load_settings
    from provisioner.sim.policies import Params
    from provisioner.sim.report import figures, run_all, summary, with_money, write_report
    from provisioner.sim.world import build_world
    from provisioner.plan.throughput import ThroughputModel

    check_flags(args)
    if args.every is not None:
        if args.deadline is None:
            raise UserError(f"--every {args.every:g}: replays a deadline from many starts; give "
                            "--deadline HOURS too")
        for flag, given in (("--report", args.report), ("--policy", args.policy)):
            if given:
                raise UserError(f"{flag}: --every runs spotring, on-demand and the bound at each "
                                f"start and prints their spread; drop {flag} (or --every)")
    if args.report:
        _check_writable(args.report)
    settings = load_settings(args.config)
    job, fleet = settings.job, settings.fleet
    start, trace_start = (_time_flag(flag, getattr(args, flag.replace("-", "_")), parse_time)
                          for flag in ("start", "trace-start"))
    snap = load_trace(args.trace, start=trace_start)
    model = ThroughputModel(priors=job.throughput_priors, unit=job.samples_per_s_per_unit)
    max_size = max(fleet.max_size, args.size)
    world = build_world(snap, model, max_size=max_size, on_demand=dict(args.on_demand),
                        types=args.types, regions=args.regions, start=start, hours=args.hours,
                        seed=args.seed)
    spot_types = Counter(o.instance_type for o in world.price if o.market == "spot")
    itype = args.itype or (spot_types.most_common(1)[0][0] if spot_types else None)
    if itype is None or itype not in world.speed:
        raise UserError(f"--type {itype!r}: not in the traces; types there: "
                        + ", ".join(sorted(spot_types)))
    span_h = (world.end - world.start) / 3600
    if args.deadline is not None and args.deadline > span_h:
        raise UserError(f"--deadline {args.deadline:g}: beyond the {span_h:.1f} h the traces "
                        f"cover from {args.start or 'their start'}; give at most {span_h:.1f}")
    if max_size > fleet.max_size:  # the baselines' ring must fit spotring's too
        settings = settings.model_copy(update={"fleet": fleet.model_copy(
            update={"max_size": max_size})})
    params = Params(settings, itype=itype, size=args.size, restart_s=args.restart,
                    checkpoint_s=args.checkpoint)
    if args.every is not None:
        return _every(args, snap, model, max_size, params, world)
    names = args.policy or [n for n in ALL_POLICIES
                            if n != "uniform-progress" or args.deadline is not None]
    with quiet_stdout():
        results = run_all(world, names, params, work=args.work, deadline_h=args.deadline,
                          tick_s=args.tick, seed=args.seed, floors=True)
    figs = figures(results)
    m, shares = with_money(figs, results, world, params)
    if args.report:
        path = write_report(args.report, world, results, params=params, work=args.work,
                            deadline_h=args.deadline, traces=args.trace)
    if args.json:
        print_json(figs, sort_keys=True)
    else:
        print(summary(figs, m, shares))
        if args.report:
            print(f"report written to {path}")
    return 0


def _every(args: argparse.Namespace, snap: Any, model: Any, max_size: int, params: Any,
           world: Any) -> int:
    """``--every``: the deadline replayed from every ``args.every`` hours of ``world``'s
    period (:func:`provisioner.sim.windows.window_starts`); a line per start as it is done
    (on stderr with ``--json``), then the spread (:func:`provisioner.sim.windows.summarise`)."""
    from datetime import datetime, timezone

    from provisioner.sim.report import figures, run_all
    from provisioner.sim.windows import (WINDOW_TAIL_H, Window, goal_of, summarise,
                                         window_starts)
    from provisioner.sim.world import build_world

    starts = window_starts(world.start, world.end, args.deadline, args.every)
    if not starts:
        span_h = (world.end - world.start) / 3600
        raise UserError(f"--every {args.every:g}: no start leaves the deadline ({args.deadline:g} "
                        f"h) and {WINDOW_TAIL_H:g} h more inside the {span_h:.1f} h the traces "
                        "cover; give a shorter --deadline, or drop --hours, or more trace")
    goal = goal_of(len({o.instance_type for o in world.price if o.market == "spot"}))
    names = ["spotring", "hindsight"] + (["on-demand"] if any(  # on-demand needs its price
        o.market == "on-demand" and o.instance_type == params.itype for o in world.price) else [])
    say = sys.stderr if args.json else sys.stdout
    print(f"{len(starts)} starts every {args.every:g} h, deadline {args.deadline:g} h, goal "
          f"{goal:.2f}x the bound", file=say)
    print(f"{'start (UTC)':<16}  {'vs bound':>8}  {'vs on-demand':>12}  {'cost USD':>9}  "
          f"{'hours':>6}  deadline", file=say, flush=True)
    if "on-demand" not in names:
        print(f"(no on-demand price for {params.itype} in the traces: pass --on-demand "
              f"{params.itype}=USD_PER_HOUR to compare)", file=say)
    done: list[Window] = []
    for t in starts:
        w = build_world(snap, model, max_size=max_size, on_demand=dict(args.on_demand),
                        types=args.types, regions=args.regions,
                        start=datetime.fromtimestamp(t, timezone.utc),
                        hours=args.deadline + WINDOW_TAIL_H, seed=args.seed)
        with quiet_stdout():
            r = run_all(w, names, params, work=args.work,
                        deadline_h=args.deadline, tick_s=args.tick, seed=args.seed)
        f = figures(r)
        ours, od = f["spotring"], f.get("on-demand", {})
        win = Window(start=t,
                     vs_bound=f.get("hindsight", {}).get("spotring_cost_per_sample_ratio"),
                     # per sample, so an on-demand ring too slow to finish still compares
                     vs_on_demand=od.get("spotring_cost_per_sample_ratio",
                                         od.get("spotring_cost_per_sample_ratio_unequal_work")),
                     cost=ours["total_cost_usd"],
                     hours=ours["completion_hours"] if ours["finished"] else None,
                     deadline_met=ours["deadline_met"])
        done.append(win)
        cells = ["-" if v is None else f"{v:.3f}x" for v in (win.vs_bound, win.vs_on_demand)]
        cells += ["-" if v is None else f"{v:.2f}" for v in (win.cost, win.hours)]
        met = {None: "-", True: "met", False: "MISSED"}[win.deadline_met]
        print(f"{datetime.fromtimestamp(t, timezone.utc):%Y-%m-%d %H:%M}  {cells[0]:>8}  "
              f"{cells[1]:>12}  {cells[2]:>9}  {cells[3]:>6}  {met}", file=say, flush=True)
    spread = summarise(done, goal)
    if args.json:
        print_json({"starts": [vars(w) | {"start_utc": datetime.fromtimestamp(
            w.start, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")} for w in done],
            **spread}, sort_keys=True)
    else:
        mean, worst = spread["mean_vs_bound"], spread["worst_vs_bound"]
        print(f"\nover {spread['windows']} starts: "
              + ("no bound to compare (the hindsight bound did not run)" if mean is None else
                 f"{mean:.3f}x the bound on average, worst {worst:.3f}x, "
                 f"{spread['past_goal']} past {goal:.2f}x")
              + (f"; at most {spread['worst_vs_on_demand']:.3f}x on-demand alone"
                 if spread["worst_vs_on_demand"] is not None else "")
              + f"; deadlines missed: {spread['deadlines_missed']}")
    return 0
