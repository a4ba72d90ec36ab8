"""Running every policy over one world and reporting: markdown, PNG plots, JSON figures.

Design: :func:`run_all` is the only place that knows the order (the online policies first,
then :func:`~provisioner.sim.hindsight.hindsight` over the horizon the others set);
:func:`write_report` turns results into files and never simulates. Plots go through the
generic :mod:`provisioner.plots`: price, availability (the traces' caps), the fleet by
offering and market, throughput and cost, each over the whole span of every run.

Honest reports: a run that did not finish is flagged in both (``finished``,
``work_done_fraction``, "NOT FINISHED"); spotring's cost ratio is given only between runs that
did the same work, else as a per-sample ratio marked "unequal work"; when spotring did not
finish, the bound is computed for the work it did; the JSON holds no NaN or infinity.

Rule: the JSON (``figures``) and the markdown table show the same numbers.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from pathlib import Path
from typing import Mapping, Sequence

from pricing.model import Offering
from provisioner import plots
from provisioner.errors import UserError
from provisioner.plan.pacing import margin_hours
from provisioner.sim.engine import simulate_policy
from provisioner.sim.hindsight import hindsight, od_ring_rate
from provisioner.sim.policies import POLICIES, Params
from provisioner.sim.result import Result
from provisioner.sim.world import World, iso

log = logging.getLogger(__name__)

ALL_POLICIES = tuple(POLICIES) + ("hindsight",)


def run_all(world: World, names: Sequence[str], params: Params, *, work: float,
            deadline_h: float | None, tick_s: float = 600.0, seed: int = 0,
            floors: bool = False) -> dict[str, Result]:
    """Simulate each named policy; hindsight last, over the deadline (or the completion time
    of spotring, else of on-demand, else the whole trace). When spotring did not finish, the
    bound is for the work spotring did over the whole trace, so the two compare equal work.
    With ``floors`` and a deadline the bound also carries :func:`deadline_floors`.
    Raises UserError on a bad name, on uniform-progress without a deadline, and when
    on-demand or uniform-progress would run with no on-demand price for the baselines' type."""
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
        other = (f", or --type one of the types that have one ({', '.join(od_types)})"
                 if od_types else "")
        raise UserError(
            f"--policy {' and '.join(od_users)} need{'s' if len(od_users) == 1 else ''} an "
            f"on-demand price for {params.itype}, the baselines' instance type, and the traces "
            f"hold none: pass --on-demand {params.itype}=USD_PER_HOUR (its list price){other}, "
            f"or leave {' and '.join(od_users)} out with --policy")
    out: dict[str, Result] = {}
    for n in names:
        if n != "hindsight":
            log.info("simulating %s", n)
            out[n] = simulate_policy(world, n, params, work=work, deadline_h=deadline_h,
                                     tick_s=tick_s, seed=seed)
    if "hindsight" in names:
        trace_h = (world.end - world.start) / 3600
        horizon, bound_work, why = deadline_h, work, ""
        ours = out.get("spotring")
        if ours is not None and not ours.finished and ours.done > 0:
            horizon, bound_work = trace_h, ours.done
            why = f"; the bound is for spotring's work ({ours.done / work:.1%} of the job)"
        for ref in ("spotring", "on-demand"):
            if horizon is None and ref in out and out[ref].finished:
                horizon = out[ref].completion_h
        if horizon is None:
            horizon = trace_h
        r = hindsight(world, params, work=bound_work, horizon_h=min(horizon, trace_h))
        r.deadline_h = deadline_h
        if floors and deadline_h is not None and not why and r.status == "optimal":
            r.floors = deadline_floors(world, params, work=work,
                                       deadline_h=min(deadline_h, trace_h))
        if why:
            r.work = bound_work
            r.status += why
        out["hindsight"] = r
    return out


def deadline_floors(world: World, params: Params, *, work: float,
                    deadline_h: float) -> dict[str, float] | None:
    """What a deadline costs on this market at least, beyond the bound (None without an
    on-demand price to fall back on): ``deadline_safe_usd``, the bound of the policies that
    would still meet it were all spot to vanish at any moment (no policy that cannot see the
    future tells the trace from that world until then: every one that meets every deadline
    it can be asked to pays at least this), and ``margin_kept_usd``, the bound of those that
    keep the deadline's margin (``margin_hours``, ``objective.safety_hours`` of slack against
    the fastest on-demand ring) all along. Spotring's net phases the margin in rather than
    keeping it whole, so the second is the margin's price, not a bound on spotring. Infinite
    where no fleet keeps it (the JSON says null); None too when a solve hit its time limit."""
    rate = od_ring_rate(world, params)
    if rate <= 0:
        return None
    margin = margin_hours(params.settings.objective.safety_hours, deadline_h)
    safe, kept = (hindsight(world, params, work=work, horizon_h=deadline_h,
                            fallback=(rate, m)) for m in (0.0, margin))
    if any(r.status.startswith("not solved") for r in (safe, kept)):
        return None  # a time limit is no figure (infeasible is one: no fleet keeps it)
    return {"deadline_safe_usd": safe.cost, "margin_kept_usd": kept.cost,
            "margin_hours": margin}


def floors_line(f: Mapping) -> str:
    """One line for people of the bound's :func:`deadline_floors` (its figures ``f``)."""
    bound = f.get("total_cost_usd")

    def usd(x: float | None) -> str:
        if x is None:
            return "none (no fleet does)"
        return f"${x:,.2f}" + (f" ({x / bound:.3f}x the bound)" if bound else "")

    return (f"the deadline on this market, at least: {usd(f['deadline_safe_usd'])} for a "
            "policy that would still meet it were all spot to vanish at any moment (one that "
            "cannot see the future cannot tell); "
            f"{usd(f['margin_kept_usd'])} keeping {f['margin_hours']:g} h of slack against the "
            "fastest on-demand ring all along (objective.safety_hours, which spotring phases "
            "in rather than keeps whole)")


def figures(results: Mapping[str, Result]) -> dict[str, dict]:
    """Per policy figures, plus ratios of spotring's cost per sample to every other policy:
    ``spotring_cost_per_sample_ratio`` only between runs that did the same work; between
    runs that did not (one did not finish), ``spotring_cost_per_sample_ratio_unequal_work``
    instead, marked so in the markdown. No NaN or infinity anywhere (JSON-safe)."""
    out = {n: r.figures() for n, r in results.items()}
    ours = results.get("spotring")
    if ours is not None and ours.done > 0 and math.isfinite(ours.cost):
        for n, r in results.items():
            if n == "spotring" or r.done <= 0 or not math.isfinite(r.cost) or r.cost <= 0:
                continue
            ratio = round(float(ours.cost_per_m / r.cost_per_m), 4)
            same = abs(ours.done - r.done) <= 1e-6 * max(ours.done, r.done)
            out[n]["spotring_cost_per_sample_ratio" + ("" if same else "_unequal_work")] = ratio
    return out


def on_demand_cost(results: Mapping[str, Result], world: World, params: Params,
                   work: float) -> float | None:
    """USD on-demand alone pays for ``work`` samples: the on-demand policy's cost per sample
    where it ran (and did work), else its ring's (``size`` x ``itype`` at the cheapest
    on-demand price at the start, at the ring's nominal rate); None without a price."""
    od = results.get("on-demand")
    if od is not None and od.done > 0 and math.isfinite(od.cost):
        return od.cost / od.done * work
    prices = [s.at(world.start) for o, s in world.price.items()
              if o.market == "on-demand" and o.instance_type == params.itype]
    if not prices or params.itype not in world.speed:
        return None
    rate = params.nominal_rate(world.speed)
    return params.size * min(prices) * work / (rate * 3600.0) if rate > 0 else None


def money(results: Mapping[str, Result], world: World, params: Params) -> dict | None:
    """Spotring's money: spent, what on-demand alone pays for the same work, saved, and
    the budget with what is left (when the job had one). None without a spotring run."""
    ours = results.get("spotring")
    if ours is None:
        return None
    od = on_demand_cost(results, world, params, ours.done)
    out = {"spent_usd": round(ours.cost, 4),
           "on_demand_usd": None if od is None else round(od, 4),
           "saved_vs_on_demand_usd": None if od is None else round(od - ours.cost, 4)}
    if ours.budget_usd is not None:
        out["budget_usd"] = round(ours.budget_usd, 4)
        out["budget_left_usd"] = round(ours.budget_usd - ours.cost, 4)
    return out


def money_line(m: Mapping[str, float | None]) -> str:
    """One line of :func:`money` for people."""
    line = f"spotring spent ${m['spent_usd']:,.2f}"
    if m.get("on_demand_usd"):
        line += (f"; on-demand alone would have paid ${m['on_demand_usd']:,.2f} for the same "
                 f"work: ${m['saved_vs_on_demand_usd']:,.2f} saved "
                 f"({m['spent_usd'] / m['on_demand_usd']:.2f}x)")
    if m.get("budget_usd") is not None:
        line += f"; budget ${m['budget_usd']:,.2f}, ${m['budget_left_usd']:,.2f} left"
    return line


def warning_line(warning: str) -> str:
    """One line for people of the planner's first word that the budget cannot finish the
    work (``Result.budget_warning``), said before the job started."""
    return f"spotring's plan at the start said: {warning}"


def with_money(figs: dict[str, dict], results: Mapping[str, Result], world: World,
               params: Params) -> tuple[dict | None, dict[str, float]]:
    """:func:`money` and :meth:`World.spot_shares`, also put into spotring's ``figs`` (as
    ``money`` and ``spot_share``, when there is a spotring run and they exist): what
    ``provision simulate`` prints and the report writes, computed in one place."""
    m = money(results, world, params)
    shares = world.spot_shares()
    if "spotring" in figs:
        if m is not None:
            figs["spotring"]["money"] = m
        if shares:
            figs["spotring"]["spot_share"] = shares
    return m, shares


def share_line(shares: Mapping[str, float]) -> str:
    """One line of :meth:`World.spot_shares` for people (callers pass a non-empty one)."""
    each = ", ".join(f"{t} {v:.0%}" for t, v in shares.items())
    return (f"spot had capacity over the traces' whole period: {each} of the time (a deadline on "
            "this market may set [pacing] spot_share to its type's share)")


def summary(figs: Mapping[str, Mapping], m: Mapping | None,
            shares: Mapping[str, float] | None = None) -> str:
    """The figures as a small table for a terminal (``provision simulate`` without
    ``--json`` or ``--report``), then the money line and the spot share line."""
    rows = [("policy", "cost USD", "hours", "$/1M samples", "spotring x", "deadline",
             "launches", "revoked", "status")]
    for n, f in figs.items():
        hours = (f"{f['completion_hours']:.2f}" if f["finished"] else
                 f"not done ({(f['work_done_fraction'] or 0):.0%})")
        cpm = "-" if f["cost_per_1m_samples_usd"] is None else f"{f['cost_per_1m_samples_usd']:.4f}"
        cost = "-" if f["total_cost_usd"] is None else f"{f['total_cost_usd']:.2f}"
        met = {None: "-", True: "met", False: "MISSED"}[f["deadline_met"]]
        rows.append((n, cost, hours, cpm, _fmt_ratio(f), met, str(f["launches"]),
                     str(f["revocations"]), _short(f["status"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i in (0, 5, 8) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    whole = [f"{n}: {f['status']}" for n, f in figs.items() if _short(f["status"]) != f["status"]]
    warning = figs.get("spotring", {}).get("budget_warning")
    if whole or warning:
        lines.append("")
    lines += whole
    if warning:
        lines.append(warning_line(warning))
    if m is not None:
        lines += ["", money_line(m)]
    if shares:
        lines += [share_line(shares)]
    if "deadline_safe_usd" in figs.get("hindsight", {}):
        lines += [floors_line(figs["hindsight"])]
    return "\n".join(lines)


def _short(status: str, width: int = 60) -> str:
    """``status`` for the table's last column: whole when it fits ``width``, else cut at a
    word and marked (the summary prints it whole below the table)."""
    if len(status) <= width:
        return status
    return status[:width - 4].rsplit(" ", 1)[0].rstrip(":;,(") + " ..."


def _fmt_ratio(f: dict) -> str:
    if f.get("spotring_cost_per_sample_ratio") is not None:
        return f"{f['spotring_cost_per_sample_ratio']:.3f}x"
    if f.get("spotring_cost_per_sample_ratio_unequal_work") is not None:
        return f"{f['spotring_cost_per_sample_ratio_unequal_work']:.3f}x (unequal work)"
    return "-"


def write_report(directory: str | Path, world: World, results: Mapping[str, Result], *,
                 params: Params, work: float, deadline_h: float | None,
                 traces: Sequence[str]) -> Path:
    """Write ``report.md``, ``figures.json`` and the PNGs into ``directory``; return the
    markdown's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    figs = figures(results)
    pngs = _plots(d, world, results)
    md = ["# spotring simulation report", "",
          f"Traces: {', '.join(traces)}  ",
          f"Period: {iso(world.start)} .. {iso(world.end)} UTC; work {work:.4g} samples; "
          f"deadline {'none' if deadline_h is None else f'{deadline_h:g} h'}; job instance type "
          f"{params.itype} x {params.size} (baselines), spotring up to {params.max_size}.", ""]
    unfinished = [n for n, r in results.items() if not r.finished and n != "hindsight"]
    for n in unfinished:
        why = results[n].status if results[n].status != "ok" else (
            f"{results[n].done / work:.1%} of the work by the end of the trace")
        md.append(f"**{n} did not finish**: {why}; its cost is for that work only, and its "
                  "ratio is marked *unequal work*.  ")
    if unfinished:
        md.append("")
    md += ["| policy | total cost (USD) | completion (h) | cost per 1M samples (USD) | "
           "deadline met | revocations | launches | work lost (samples) | spotring cost ratio |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for n, f in figs.items():
        comp = (f"{f['completion_hours']:.2f}" if f["finished"] else
                f"NOT FINISHED ({(f['work_done_fraction'] or 0):.1%} done)")
        cost = "-" if f["total_cost_usd"] is None else f"{f['total_cost_usd']:.2f}"
        cpm = "-" if f["cost_per_1m_samples_usd"] is None else f"{f['cost_per_1m_samples_usd']:.4f}"
        met = {None: "-", True: "yes", False: "NO"}[f["deadline_met"]]
        md.append(f"| {n} | {cost} | {comp} | {cpm} | {met} | {f['revocations']} | "
                  f"{f['launches']} | {f['work_lost_samples'] or 0:.0f} | {_fmt_ratio(f)} |")
    m, shares = with_money(figs, results, world, params)
    if m is not None:
        md += ["", money_line(m) + "."]
    if figs.get("spotring", {}).get("budget_warning"):
        md += ["", warning_line(figs["spotring"]["budget_warning"]) + "."]
    if shares:
        md += ["", share_line(shares) + "."]
    if "deadline_safe_usd" in figs.get("hindsight", {}):
        md += ["", floors_line(figs["hindsight"]) + "."]
    md += ["", "The ratio is spotring's cost per sample over the policy's, between runs that did "
           "the same work; a run that did not finish is compared per sample of unequal work and "
           "marked so. Hindsight is an offline bound: it knows the whole trace, keeps max_size "
           "and max_zone_share, pays the boots of the fewest launches its fleet needs (its "
           "launches column), the relaunches of what the trace revokes in expectation, no "
           "restart and no lost step; its status: "
           + (results["hindsight"].status if "hindsight" in results else "not run") + ".",
           "", "## Model", "",
           f"- boot {params.boot_s:g} s, restart from checkpoint {params.restart_s:g} s, "
           f"checkpoint every {params.checkpoint_s:g} s, back-off {params.backoff_s:g} s, "
           f"spotring: ring re-form {params.reform_s:g} s, step {params.step_s:g} s lost per "
           f"revocation, zone avoided {params.avoid_s:g} s after it failed.",
           f"- ring: {params.model_mb:g} MB gradient, global batch {params.global_batch}; zone "
           f"share {params.max_zone_share:g}.",
           "", "## Plots", ""]
    md += [f"![{name}]({name})" for name in pngs]
    md += ["", "## How the traces were combined, and what was wrong in them", ""]
    md += [f"- {n}" for n in world.notes] or ["- nothing to report"]
    path = d / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    (d / "figures.json").write_text(json.dumps(figs, indent=2, sort_keys=True, allow_nan=False)
                                    + "\n", encoding="utf-8")
    return path


def _label(o: Offering) -> str:
    return f"{o.zone if o.zone != '*' else o.region} {o.instance_type} {o.market}"


def _plots(d: Path, world: World, results: Mapping[str, Result]) -> list[str]:
    """The PNGs, each over the whole span of the runs (the slowest policy's end included),
    with a zoom on the spans of spotring, on-demand and the bound where a baseline ran long."""
    end_h = max([r.series[0][-1] for r in results.values() if r.series[0]] + [1.0])
    refs = [r.series[0][-1] for n, r in results.items()
            if n in ("spotring", "on-demand", "hindsight") and r.series[0]]
    zoom = 1.1 * max(refs) if refs else None
    out = []
    groups: dict[tuple, list[Offering]] = {}
    for o in sorted(world.price, key=lambda o: (o.market, o.key)):
        s = world.price[o]
        xs = [(t - world.start) / 3600 for t in s.t if world.start < t <= world.start + end_h * 3600]
        ys = [float(s.at(world.start + x * 3600)) for x in xs]
        key = (tuple([0.0] + xs + [end_h]),
               tuple([s.at(world.start)] + ys + [s.at(world.start + end_h * 3600)]))
        groups.setdefault(key, []).append(o)
    price_series = {}
    for (xs, ys), offs in list(groups.items())[:16]:  # one line per distinct price series
        kinds = {(o.instance_type, o.market) for o in offs}
        name = (_label(offs[0]) if len(offs) == 1 else
                f"{offs[0].instance_type} {offs[0].market} in {len(offs)} zones/regions"
                if len(kinds) == 1 else f"{len(offs)} offerings")
        price_series[name] = (list(xs), list(ys))
    plots.lines(d / "price.png", price_series, title="price of each offering (log scale)",
                ylabel="USD / hour", xmax=end_h, max_legend=16, logy=True)
    out.append("price.png")
    avail = {}
    for o in sorted(o for o, st in world.avail.items() if st is not None):
        st = world.avail[o]
        xs = [(t - world.start) / 3600 for t in st.t]
        ys = [float(v) for v in st.v]
        spans = [((a - world.start) / 3600, (b - world.start) / 3600)
                 for a, b in world.observed.get(o, ())]
        avail[_label(o)] = _observed_only(xs, ys, spans) if spans else (xs, ys)
    if avail:
        plots.heatmap(d / "availability.png", avail, xmax=(world.end - world.start) / 3600,
                      title="spot instances available over the period simulated (the capacity "
                      "caps; grey: not observed)", label="instances")
        out.append("availability.png")
    panels = {}
    for n, r in results.items():
        by = r.by_offering()
        end = max([r.series[0][-1] if r.series[0] else 0.0] +
                  [xs[-1] for xs, _ in by.values() if xs])
        panels[f"{n}: {r.launches} launches" + ("" if r.finished else " (did not finish)")] = (
            end, {_label(o): by[o] for o in sorted(by, key=lambda o: (o.market, o.key))})
    plots.stacked_panels(d / "fleet.png", panels, title="fleet by offering and market, each run "
                         "over its own span\n(hatched: on-demand; hindsight: its mean count "
                         "per trace segment)", ylabel="instances")
    out.append("fleet.png")
    plots.lines(d / "throughput.png", {n: (r.series[0], r.series[2]) for n, r in results.items()},
                title="training throughput", ylabel="samples / s", xmax=end_h, zoom=zoom,
                dashed=("hindsight",))
    out.append("throughput.png")
    plots.lines(d / "cost.png", {n: (r.series[0], r.series[3]) for n, r in results.items()},
                title="cumulative cost, each run to its end", ylabel="USD", step=False,
                xmax=end_h, zoom=zoom, dashed=("hindsight",))
    out.append("cost.png")
    return out


def _observed_only(xs: list[float], ys: list[float], spans: list[tuple[float, float]]
                   ) -> tuple[list[float], list[float]]:
    """The step function (xs, ys) where a span observed it, NaN elsewhere (a gap in the
    plot, not a zero)."""
    cuts = sorted(set(xs) | {x for span in spans for x in span})
    out = []
    for x in cuts:
        inside = any(a <= x < b for a, b in spans)
        i = bisect.bisect_right(xs, x) - 1
        out.append(ys[max(i, 0)] if inside else math.nan)
    return [min(cuts[0], 0.0) - 1e-9] + cuts, [math.nan] + out
