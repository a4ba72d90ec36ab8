"""Benchmark: robust, not tuned: leave-one-family-out over the trace families in ../shared/data.

A knob spotring keeps (by default ``pacing.catch_up_tolerance``, the one a previous round
chose on the 16-node trace; ``--knob SECTION.NAME=V1,V2,...`` names any other) is tried at
every value on every run of every family (``benchmarks/trace_rows.py``: GCP weekly prices
with lifetimes, the AWS price events, the Can't-Be-Late 16-node, 1-node 02-15 and 10-26 and
both preemption folders). Then, for each family held out, the value is chosen on the OTHER
families (the one whose worst ratio to the bound there is least) and the held-out family's
runs are reported at it: the figures that count, those of families the value never saw.
``train_on`` gives the other view (tuned on one family, reported on the rest).

Goals per held-out family: spotring's cost per sample <= 1.05x the hindsight bound with one
instance type, <= 1.10x with several, <= 1.00x on-demand alone; with the invariants of each
run (deadlines met, hours empty while late, unpaid swaps). Prints ONE JSON line; with
``--markdown PATH`` also the table docs/optimizer.md shows. The default is small (a quarter
of the work, one run per family, two values); ``--full`` runs every row at the full work and
four values (about 20 minutes on 2 cores with ``--jobs 2``). ``--windows STEP_H`` replays
each deadline run from every STEP_H hours of its traces (``trace_rows.windows``): one start
is one draw of its market, and a rule fitted to it can lose on the next; over windows the
value is chosen by the least mean (then the least worst) and the table gives each run's
windows' mean, worst and misses (``--full --windows 48``: 356 runs for four values, about
13 minutes with ``--jobs 2``). ``--floors`` adds what each deadline costs at least over the
bound (:func:`provisioner.sim.report.deadline_floors`): a window past its goal whose floor
kept safe is within it lost to the policy, not to the market.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.trace_rows import ROWS, SMALL, Row, run_row, windows  # noqa: E402
from provisioner.sim.windows import GOAL_MANY, GOAL_OD, GOAL_ONE, goal_of  # noqa: E402


def _config(knob: str, value: float) -> dict:
    section, name = knob.split(".", 1)
    return {section: {name: value}}


def _one(args: tuple[Row, str, float, float, bool, int]) -> dict:
    row, knob, value, scale, floors, gone = args
    out = run_row(row, _config(knob, value), work_scale=scale, floors=floors, gone=gone)
    out["value"] = value
    return out


def goal(run: dict) -> float:
    """The bound ratio ``run`` is held to: 1.10x with several instance types, else 1.05x."""
    return goal_of(2 if run["multi"] else 1)


def base(run: dict) -> str:
    """The row ``run`` replays: its own, or the one whose window it is."""
    return run.get("window_of") or run["row"]


def worst(runs: list[dict]) -> float:
    """The worst ratio to the bound, each run against its own goal (1.05 or 1.10) so one
    family's multi-type runs do not count as misses at 1.08."""
    return max((r["vs_bound"] / goal(r) for r in runs if "vs_bound" in r), default=0.0)


def pick(runs: list[dict], values: list[float]) -> float:
    """The value whose worst goal-relative ratio over ``runs`` is least (ties: the mean);
    over windows (``--windows``), whose mean is least (ties: the worst): each window is
    one draw of its market, and the worst of many draws is mostly one the knob cannot
    change."""
    windowed = any(r.get("window_of") for r in runs)

    def score(v: float) -> tuple[float, float]:
        mine = [r for r in runs if r["value"] == v]
        rel = [r["vs_bound"] / goal(r) for r in mine if "vs_bound" in r]
        mean = sum(rel) / max(len(rel), 1)
        return (mean, worst(mine)) if windowed else (worst(mine), mean)
    return min(values, key=score)


#: a run's figures where all spot is gone for good from its first outage (``--gone``; with K,
#: the worst of its first K)
GONE = ("gone_from_h", "cost_vs_on_demand_if_gone", "deadline_met_if_gone")


def analyse(results: list[dict], values: list[float]) -> dict:
    families = sorted({r["family"] for r in results})
    held_out = {}
    for fam in families:
        v = pick([r for r in results if r["family"] != fam], values)
        mine = [r for r in results if r["family"] == fam and r["value"] == v]
        held_out[fam] = {
            "value": v,
            "runs": {r["row"]: {k: r.get(k) for k in (
                "vs_bound", "cost_vs_on_demand", "deadline_met", "empty_behind_h",
                "empty_late_h", "unpaid_swaps", "hours", "launches") + (GONE if GONE[0] in r
                                                                     else ())}
                     for r in mine},
            "goal_bound_met": all(r.get("vs_bound", 0) <= goal(r) for r in mine),
            "goal_od_met": all(r.get("cost_vs_on_demand", 0) <= GOAL_OD for r in mine),
            "deadlines_met": all(r["deadline_met"] is not False for r in mine),
            "never_empty_behind": all(not r.get("empty_behind_h") for r in mine)}
        if any(GONE[0] in r for r in mine):  # --gone: invariant 1 where spot is gone
            held_out[fam]["goal_od_met_if_gone"] = all(
                (r.get("cost_vs_on_demand_if_gone") or 0) <= GOAL_OD
                and r.get("deadline_met_if_gone") is not False for r in mine)
    train_on = {fam: pick([r for r in results if r["family"] == fam], values)
                for fam in families}
    return {"held_out": held_out, "train_on": train_on}


def markdown(results: list[dict], values: list[float], an: dict, knob: str) -> str:
    if any(r.get("window_of") for r in results):
        return markdown_windows(results, values, an, knob)
    lines = [f"| family (held out) | run | {knob} chosen on the others | vs bound | "
             "vs on-demand | deadline | empty while behind (h) | empty past the unmoved "
             "line (h) | unpaid swaps | hours | "
             + " | ".join(f"at {v:g}" for v in values) + " |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|" + "---:|" * len(values)]
    for fam, h in an["held_out"].items():
        for row, f in h["runs"].items():
            at = [next((r for r in results if r["row"] == row and r["value"] == v), {})
                  for v in values]
            met = {None: "-", True: "met", False: "MISSED"}[f["deadline_met"]]
            lines.append(f"| {fam} | {row} | {h['value']:g} | {f['vs_bound']:.3f}x | "
                         f"{f['cost_vs_on_demand']:.3f}x | {met} | "
                         f"{f.get('empty_behind_h') or 0:.2f} | {f['empty_late_h']:.2f} | "
                         f"{f['unpaid_swaps']} | {f['hours']} | "
                         + " | ".join(f"{a['vs_bound']:.3f}x" if "vs_bound" in a else "-"
                                      for a in at) + " |")
    return "\n".join(lines) + "\n"


def markdown_windows(results: list[dict], values: list[float], an: dict, knob: str) -> str:
    """The table of a ``--windows`` run: per row, its windows at the value chosen on the
    other families (mean and worst ratio to the bound, windows past the goal, the
    invariants summed), then the mean at each value tried."""
    floors = any("deadline_safe" in r for r in results)
    lines = [f"| family (held out) | run | windows | {knob} chosen on the others | mean vs "
             "bound | worst | past the goal | worst vs on-demand | deadlines missed | "
             "hours empty while behind | unpaid swaps | "
             + ("worst kept safe | worst margin kept | " if floors else "")
             + " | ".join(f"mean at {v:g}" for v in values) + " |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(values)
             + ("---:|---:|" if floors else "")]
    for fam, h in an["held_out"].items():
        v = h["value"]
        for row in dict.fromkeys(base(r) for r in results if r["family"] == fam):
            at = {a: [r["vs_bound"] for r in results if base(r) == row and r["value"] == a
                      and "vs_bound" in r] for a in values}
            mine = [r for r in results if base(r) == row and r["value"] == v and "vs_bound" in r]
            if not mine:
                continue
            ratios = at[v]
            lines.append(
                f"| {fam} | {row} | {len(mine)} | {v:g} | {sum(ratios) / len(ratios):.3f}x | "
                f"{max(ratios):.3f}x | {sum(x > goal(mine[0]) for x in ratios)} | "
                f"{max(r['cost_vs_on_demand'] for r in mine):.3f}x | "
                f"{sum(r['deadline_met'] is False for r in mine)} | "
                f"{sum(r.get('empty_behind_h') or 0 for r in mine):.2f} | "
                f"{sum(r['unpaid_swaps'] for r in mine)} | "
                + ("".join(f"{_worst_floor(mine, k)} | " for k in ("deadline_safe", "margin_kept"))
                   if floors else "")
                + " | ".join(f"{sum(x) / max(len(x), 1):.3f}x" for x in at.values()) + " |")
    return "\n".join(lines) + "\n"


def _worst_floor(runs: list[dict], key: str) -> str:
    """The worst of ``runs``' floor ``key`` over the bound ("none": no fleet keeps it in
    some window; "-": not computed)."""
    got = [r[key] for r in runs if key in r]
    if not got:
        return "-"
    return "none" if any(v is None for v in got) else f"{max(got):.3f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", default="pacing.catch_up_tolerance=1.05,1.2",
                    help="SECTION.NAME=V1,V2,... (a settings field and the values to try)")
    ap.add_argument("--full", action="store_true", help="every row, the full work, 4 values")
    ap.add_argument("--work-scale", type=float, default=None, help="fraction of each run's work")
    ap.add_argument("--windows", type=float, default=None, metavar="STEP_H",
                    help="replay each deadline run from every STEP_H hours of its traces "
                         "(trace_rows.windows): a family's windows, not one start, are the test")
    ap.add_argument("--jobs", type=int, default=1, help="processes (the machine is shared)")
    ap.add_argument("--cache", help="JSON file: reuse runs found there, add the new ones")
    ap.add_argument("--markdown", help="write the table docs/optimizer.md shows here")
    ap.add_argument("--gone", type=int, nargs="?", const=1, default=0, metavar="K",
                    help="also each run against on-demand alone where all spot is gone for "
                    "good from its first outage an hour in (with K: from each of its first K "
                    "outages, the worst counted; invariant 1 where an outage that ends "
                    "cannot be told from one that does not; up to K more replays a run)")
    ap.add_argument("--floors", action="store_true",
                    help="also what each deadline costs at least over the bound: kept safe "
                    "were all spot to vanish, and keeping objective.safety_hours of slack "
                    "(two more solves a deadline run; a loss above the first is the policy's)")
    args = ap.parse_args()
    if args.gone < 0:
        ap.error(f"--gone {args.gone}: K is how many outages to part each run from (1 or more)")
    knob, _, vals = args.knob.partition("=")
    values = [float(v) for v in vals.split(",")]
    rows = ROWS if args.full else tuple(r for r in ROWS if r.name in SMALL)
    if args.full and args.knob == ap.get_default("knob"):
        values = [1.05, 1.1, 1.2, 1.5]
    if args.windows is not None:
        if args.windows <= 0:
            ap.error(f"--windows {args.windows:g}: the step must be > 0 hours")
        rows = tuple(w for r in rows for w in windows(r, args.windows))
    scale = args.work_scale or (1.0 if args.full else 0.25)
    cache: dict[str, dict] = {}
    if args.cache and Path(args.cache).exists():
        cache = json.loads(Path(args.cache).read_text())
    key = lambda row, v: f"{knob}={v}|{row.name}|{scale}"  # noqa: E731
    todo = [(row, knob, v, scale, args.floors, args.gone) for row in rows for v in values
            if key(row, v) not in cache or (args.floors and row.deadline_h is not None
                                            and "deadline_safe" not in cache[key(row, v)])
            or (args.gone and cache[key(row, v)].get(
                "gone_asked", 1 if GONE[0] in cache[key(row, v)] else 0) < args.gone)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for (row, _, v, _, _, _), out in zip(todo, pool.map(_one, todo)):
            cache[key(row, v)] = out
            print(f"{row.name} {knob}={v}: {out.get('vs_bound')}x the bound"
                  + ("" if "deadline_safe" not in out else
                     f" (at least {out['deadline_safe']}x kept safe, {out['margin_kept']}x "
                     "with the margin)")
                  + ("" if out.get(GONE[1]) is None else
                     f"; {out[GONE[1]]}x on-demand alone if all spot is gone from "
                     f"{out[GONE[0]]:g} h"), file=sys.stderr)
            if args.cache:
                Path(args.cache).write_text(json.dumps(cache, indent=1, sort_keys=True))
    results = [cache[key(row, v)] for row in rows for v in values]
    an = analyse(results, values)
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, values, an, knob))
    print(json.dumps({"knob": knob, "values": values, "work_scale": scale,
                      "goal_one_type": GOAL_ONE, "goal_several_types": GOAL_MANY,
                      "goal_vs_on_demand": GOAL_OD, **an,
                      "all_goals_met_held_out": all(
                          h["goal_bound_met"] and h["goal_od_met"] and h["deadlines_met"]
                          and h["never_empty_behind"] and h.get("goal_od_met_if_gone", True)
                          for h in an["held_out"].values()),
                      "runs": len(results), "seconds": round(time.perf_counter() - t0, 1)},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
