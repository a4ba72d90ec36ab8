"""Running every policy over one world and reporting: markdown, PNG plots, JSON figures.

Design: :func:`run_all` is the only place that knows the order (the online policies first,
then :func:`~provisioner.sim.hindsight.hindsight` over the horizon the others set);
:func:`write_report` turns results into files and never simulates. Plots go through the
generic :mod:`provisioner.plots`.

Rule: the JSON (``figures``) and the markdown table show the same numbers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Mapping, Sequence

from provisioner.errors import UserError
from provisioner.plots import lines
from provisioner.sim.policies import POLICIES, Params
from provisioner.sim.engine import Result, simulate_policy
from provisioner.sim.hindsight import hindsight
from provisioner.sim.world import World, iso

log = logging.getLogger(__name__)

ALL_POLICIES = tuple(POLICIES) + ("hindsight",)


def run_all(world: World, names: Sequence[str], params: Params, *, work: float,
            deadline_h: float | None, tick_s: float = 600.0, seed: int = 0) -> dict[str, Result]:
    """Simulate each named policy; hindsight last, over the deadline (or the completion time
    of spotring, else of on-demand, else the whole trace). Raises UserError on a bad name,
    on uniform-progress without a deadline, and when on-demand or uniform-progress would run
    with no on-demand price for the baselines' type."""
    for n in names:
        if n not in ALL_POLICIES:
            raise UserError(f"--policy {n!r}: unknown; choose from {', '.join(ALL_POLICIES)}")
    if "uniform-progress" in names and deadline_h is None:
        raise UserError("--policy uniform-progress needs --deadline HOURS (it is a deadline policy)")
    od_users = [n for n in names if n in ("on-demand", "uniform-progress")]
    od_types = sorted({o.instance_type for o in world.price if o.market == "on-demand"})
    if od_users and params.itype not in od_types:
        # checked before any policy runs (it used to fail half-way, as "on-demand: no
        # on-demand price for p2.xlarge", after the policies before it had run)
        raise UserError(
            f"--policy {' and '.join(od_users)} need an on-demand price for {params.itype}, the "
            f"baselines' instance type, and the traces hold none: pass --on-demand "
            f"{params.itype}=USD_PER_HOUR (its list price), or --type one of the types that have "
            f"one ({', '.join(od_types) or 'none'}), or leave {' and '.join(od_users)} out with "
            f"--policy")
    out: dict[str, Result] = {}
    for n in names:
        if n != "hindsight":
            log.info("simulating %s", n)
            out[n] = simulate_policy(world, n, params, work=work, deadline_h=deadline_h,
                                     tick_s=tick_s, seed=seed)
    if "hindsight" in names:
        horizon = deadline_h
        for ref in ("spotring", "on-demand"):
            if horizon is None and ref in out and out[ref].completion_h is not None:
                horizon = out[ref].completion_h
        if horizon is None:
            horizon = (world.end - world.start) / 3600
        r = hindsight(world, params, work=work, horizon_h=horizon)
        r.deadline_h = deadline_h
        out["hindsight"] = r
    return out


def figures(results: Mapping[str, Result]) -> dict[str, dict]:
    """Per policy figures, plus ratios of spotring's cost per sample to every other policy."""
    out = {n: r.figures() for n, r in results.items()}
    ours = results.get("spotring")
    if ours is not None and ours.done > 0:
        for n, r in results.items():
            if n != "spotring" and r.done > 0:
                out[n]["spotring_cost_per_sample_ratio"] = round(float(ours.cost_per_m / r.cost_per_m), 4)
    return out


def write_report(directory: str | Path, world: World, results: Mapping[str, Result], *,
                 params: Params, work: float, deadline_h: float | None,
                 traces: Sequence[str]) -> Path:
    """Write ``report.md`` and four PNGs into ``directory``; return the markdown's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    figs = figures(results)
    end_h = max([r.series[0][-1] for r in results.values() if r.series[0]] + [1.0])
    # crop at twice the slowest of spotring, on-demand and hindsight (static-spot can take weeks)
    refs = [r.completion_h for n, r in results.items()
            if n in ("spotring", "on-demand", "hindsight") and r.completion_h]
    xmax = min(end_h, 2.0 * max(refs)) if refs else None
    price_series = {}
    for o in sorted(world.price, key=lambda o: (o.market, o.key))[:12]:
        s = world.price[o]
        xs = [(t - world.start) / 3600 for t in s.t if t <= world.start + end_h * 3600]
        ys = [float(v) for t, v in zip(s.t, s.v) if t <= world.start + end_h * 3600]
        if not xs or xs[0] > 0:
            xs, ys = [0.0] + xs, [s.at(world.start)] + ys
        xs.append(end_h)
        ys.append(s.at(world.start + end_h * 3600))
        price_series[f"{o.zone} {o.instance_type} {o.market}"] = (xs, ys)
    pngs = {
        "price.png": lines(d / "price.png", price_series, title="price over time",
                           ylabel="USD / hour", xmax=xmax),
        "fleet.png": lines(d / "fleet.png", {n: (r.series[0], r.series[1])
                                             for n, r in results.items()},
                           title="fleet size", ylabel="instances", xmax=xmax),
        "throughput.png": lines(d / "throughput.png", {n: (r.series[0], r.series[2])
                                                       for n, r in results.items()},
                                title="training throughput", ylabel="samples / s", xmax=xmax),
        "cost.png": lines(d / "cost.png", {n: (r.series[0], r.series[3])
                                           for n, r in results.items()},
                          title="cumulative cost", ylabel="USD", step=False, xmax=xmax),
    }
    md = ["# spotring simulation report", "",
          f"Traces: {', '.join(traces)}  ",
          f"Period: {iso(world.start)} .. {iso(world.end)} UTC; work {work:.4g} samples; "
          f"deadline {'none' if deadline_h is None else f'{deadline_h:g} h'}; job instance type "
          f"{params.itype} x {params.size} (baselines), spotring up to {params.max_size}.", "",
          "| policy | total cost (USD) | completion (h) | cost per 1M samples (USD) | "
          "deadline met | revocations | work lost (samples) | spotring cost ratio |",
          "|---|---:|---:|---:|---|---:|---:|---:|"]
    for n, f in figs.items():
        comp = "not finished" if f["completion_hours"] is None else f"{f['completion_hours']:.2f}"
        cpm = "-" if f["cost_per_1m_samples_usd"] is None else f"{f['cost_per_1m_samples_usd']:.4f}"
        met = {None: "-", True: "yes", False: "NO"}[f["deadline_met"]]
        ratio = f.get("spotring_cost_per_sample_ratio")
        md.append(f"| {n} | {f['total_cost_usd']:.2f} | {comp} | {cpm} | {met} | "
                  f"{f['revocations']} | {f['work_lost_samples']:.0f} | "
                  f"{'-' if ratio is None else f'{ratio:.3f}x'} |")
    md += ["", "Hindsight is an offline bound (knows the whole trace, pays no boot, restart or "
           "revocation loss); its status: " + (results["hindsight"].status
                                               if "hindsight" in results else "not run") + ".",
           "", "## Model", "",
           f"- boot {params.boot_s:g} s, restart from checkpoint {params.restart_s:g} s, "
           f"checkpoint every {params.checkpoint_s:g} s, back-off {params.backoff_s:g} s, "
           f"spotring: ring re-form {params.reform_s:g} s, step {params.step_s:g} s lost per "
           f"revocation, zone avoided {params.avoid_s:g} s after it failed.",
           f"- ring: {params.model_mb:g} MB gradient, global batch {params.global_batch}.",
           "", "## Plots", ""]
    md += [f"![{name}]({name})" for name in pngs]
    md += ["", "## How the traces were combined, and what was wrong in them", ""]
    md += [f"- {n}" for n in world.notes] or ["- nothing to report"]
    path = d / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    (d / "figures.json").write_text(json.dumps(figs, indent=2, sort_keys=True) + "\n",
                                    encoding="utf-8")
    return path
