"""Benchmark: where a run loses against the hindsight bound, and what knowing less could reach.

Two figures for one row of ``benchmarks/trace_rows.py`` (default: the V100 10-minute probes
with a 34.4 h deadline, the one run of issue 28 still above its goal), both built from the
simulator's own bound (:func:`provisioner.sim.hindsight.hindsight`, the same program the
ratios are taken against):

- **the gap by hour** (``--at H ...``): spotring's run replayed, and at each hour ``H`` the
  least it could still pay: what it spent by ``H`` plus the bound of the work it had left
  over ``[H, deadline]`` (starting up to ``max_size`` instances of its choosing without a
  boot: whatever the run held at ``H`` was booted already), over the bound. 1.000x at the
  start, its ratio at the end: where it rises is where the run lost, whatever it did later;
- **a non-anticipating policy's best** (``--until T``): a policy cannot tell the trace from
  the same trace whose spot stays after ``T`` (the hour its first outage of every zone
  starts), so it has done the same work ``W_T`` by ``T`` in both. For each ``W_T`` the least
  either can cost is the bound of ``W_T`` over ``[0, T]`` plus the bound of the rest over
  ``[T, deadline]`` in that world; the best such policy is at least the ``W_T`` whose worse
  ratio of the two is least. A floor above the goal would prove the goal out of reach of
  any policy that does not see the future; one below it says the run's loss is the policy's;
- **the floor over more worlds** (:func:`tree_floor`): the same, over the trace and, at each
  hour its cheapest spot goes out in every zone (``--branches``), the world whose spot stays
  from then on and the one whose spot is gone; one figure with the worlds where it stays
  only, one with both, and the worst over the others when the trace itself is held at
  ``--goal`` (what meeting the goal on this trace costs where a policy cannot tell). These
  are on a grid of work levels (``--grid``), at or above the continuous figure. At
  ``--until``, the three worlds (the trace, spot stays, spot gone) give a lower bound at
  any grid (``--fine``), and spotring's own ratio in each;
- **the deadline kept safe** (:func:`provisioner.sim.report.deadline_floors`): the bound of
  the policies that would still meet the deadline were all spot to vanish at any hour (every
  such hour is a ``--until``), and of those that keep ``objective.safety_hours`` of slack
  against the fastest on-demand ring all along: the margin's own price on this market.

Prints ONE JSON line (``--table`` also prints the rows to stderr). Seconds on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.trace_rows import (ROWS, outage_starts, windows,  # noqa: E402
                                   world_after, world_of)


def tree_floor(stage: list[list[float]], rest: list[list[list[float]]],
               bounds: list[list[float]], bound: float, *, trace_at_most: float | None = None,
               lower: bool = False, tol: float = 1e-4) -> tuple[float, list[int]]:
    """The least worst ratio to its own bound, over the trace and the worlds that part from
    it at each branch hour (its spot stays from then on, or is gone), that a policy doing
    the same work in all of them up to each hour can reach; and its work at each branch, in
    grid steps.

    Work is on a grid of ``n`` steps (``len(stage[0]) - 1``). ``stage[j][d]``: the least cost
    of ``d`` steps between branch ``j`` and ``j + 1`` of the trace (the start and the
    deadline the outer ends); ``rest[k][w][i]``: the least cost of the work left after ``i``
    steps from branch ``k`` on in world ``w`` of those parting there, whose bound is
    ``bounds[k][w]``; ``bound``, the trace's. A policy that cannot see the future has the
    same work at branch ``k`` in the trace and in those worlds (they agree up to it), so its
    ratio in one is at least (what it spent by ``k`` + ``rest[k][w][i]``) / ``bounds[k][w]``.
    For a ratio ``z``, the least spent reaching each grid step at each branch, among the
    paths that keep every world passed at most ``z``, is a dynamic program (spending less
    never hurts a later world); the least ``z`` with a path to the whole work at most ``z``
    of the trace's bound is found by bisection. The grid only restricts the work at the
    branches, so the figure is at least that of the finer grids (it falls toward the
    continuous one as ``n`` grows). With ``lower``, step ``i`` stands for any work in
    ``[i, i + 1]`` steps, each cost taken at the end of that span where it is least (a
    stage's at one step less, but the first's, from none; a world's rest at one more): a
    lower bound at any grid, loose by about a step per branch. With ``trace_at_most``, the
    trace's own ratio is held at most that instead, and the figure is the worst over the
    other worlds alone (inf when no path keeps the trace there): what keeping this trace at
    a goal costs on the worlds a policy cannot tell from it."""
    n, slack = len(stage[0]) - 1, int(lower)

    def path(z: float) -> list[int] | None:
        spent = [0.0] + [float("inf")] * n
        back = []
        for k in range(len(rest)):
            best, arg = [float("inf")] * (n + 1), [0] * (n + 1)
            for i in range(n + 1):
                for j in range(i + 1):
                    v = spent[j] + stage[k][max(i - j - (slack if k else 0), 0)]
                    if v < best[i]:
                        best[i], arg[i] = v, j
                if any(best[i] + r[min(i + slack, n)] > z * b
                       for r, b in zip(rest[k], bounds[k])):
                    best[i] = float("inf")
            back.append(arg)
            spent = best
        total = [spent[j] + stage[-1][max(n - j - slack, 0)] for j in range(n + 1)]
        j = min(range(n + 1), key=total.__getitem__)
        if total[j] > (z if trace_at_most is None else trace_at_most) * bound:
            return None
        steps = [j] if rest else []
        for arg in reversed(back[1:]):
            steps.append(arg[steps[-1]])
        return steps[::-1]

    lo, hi = 0.0, 1.0
    while path(hi) is None:
        if hi > 1e6:
            return float("inf"), []
        lo, hi = hi, 2 * hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if path(mid) is not None else (mid, hi)
    return hi, path(hi) or []


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="10-26 V100, 34.4 h",
                    help="a row of benchmarks/trace_rows.py with a deadline, or one of its "
                    "windows ('NAME @+H h': from H hours into its traces)")
    ap.add_argument("--at", type=float, nargs="*",
                    default=[3, 6, 9, 12.8, 16, 19.7, 25.8, 27, 28, 29, 30, 31],
                    help="hours at which to take the gap of spotring's run")
    ap.add_argument("--until", type=float, default=9.0,
                    help="the hour up to which the trace and the one whose spot stays agree")
    ap.add_argument("--steps", type=int, default=20, help="work shares W_T tried, 0 to 1")
    ap.add_argument("--branches", type=float, nargs="*", default=None,
                    help="hours at which the trace and the worlds whose spot stays or is "
                    "gone part, for the floor over all of them (default: every start of an "
                    "outage of the cheapest spot type in all its zones)")
    ap.add_argument("--grid", type=int, default=40,
                    help="work levels tried at the branches, 0 to 1 (finer: slower, lower)")
    ap.add_argument("--fine", type=int, default=200,
                    help="work levels tried at --until for the lower bound over the trace "
                    "and the worlds whose spot stays or is gone from then")
    ap.add_argument("--goal", type=float, default=1.05,
                    help="the trace's ratio held for the figure of the other worlds")
    ap.add_argument("--table", action="store_true", help="print the rows to stderr too")
    a = ap.parse_args(argv)
    rows = {r.name: r for r in ROWS}
    row = rows.get(a.row)
    base, _, off = a.row.partition(" @+")
    if row is None and rows.get(base) is not None and rows[base].deadline_h is not None:
        try:  # one window of the row: "NAME @+H h", as policy_cv.py --windows names it
            step = float(off.removesuffix(" h"))
        except ValueError:
            step = -1.0
        if step >= 0:
            row = next((w for w in windows(rows[base], step or 24.0) if w.name == a.row), None)
        if row is None:
            ap.error(f"--row {a.row!r}: no such window; name one as 'NAME @+H h', H the "
                     f"hours into the traces from which the deadline and 6 h more fit them")
    if row is None or row.deadline_h is None:
        ap.error(f"--row {a.row!r}: name a row with a deadline: "
                 + ", ".join(repr(n) for n, r in rows.items() if r.deadline_h))
    if not 0 < a.until < row.deadline_h:
        ap.error(f"--until {a.until}: give an hour between 0 and the deadline, {row.deadline_h}")

    import numpy as np
    from provisioner.config import parse_settings
    from provisioner.sim.hindsight import hindsight
    from provisioner.sim.policies import Params
    from provisioner.sim.report import deadline_floors, run_all

    settings = parse_settings({})
    world = world_of(row, settings, 0)
    p = Params(settings, itype=row.itype, size=4)
    work, deadline = row.work, row.deadline_h
    ours = run_all(world, ["spotring"], p, work=work, deadline_h=deadline, seed=0)["spotring"]
    bound = hindsight(world, p, work=work, horizon_h=deadline).cost

    def least(w, a: float, b: float, amount: float) -> float:
        # the bound of ``amount`` over [a, b] h; from an hour on, the fleet a policy holds
        # then (at most max_size instances) is booted already: the bound starts that many
        # for free, of the offerings it chooses (a credit of max_size boots at the dearest
        # spot price had counted a p3.16xlarge's boot per instance on the four types)
        if amount <= 0:
            return 0.0
        return hindsight(dataclasses.replace(w, start=w.start + a * 3600), p, work=amount,
                         horizon_h=b - a, free_boots=p.max_size if a > 0 else 0).cost

    xs, fleet, rates, cum = (np.asarray(v, dtype=float) for v in ours.series)
    done = np.concatenate([[0.0], np.cumsum(rates[:-1] * np.diff(xs) * 3600.0)])
    gap = []
    for h in sorted(x for x in a.at if 0 < x < deadline):
        i = max(int(np.searchsorted(xs, h, side="right")) - 1, 0)
        did = min(work, done[i] + rates[i] * (h - xs[i]) * 3600.0)
        spent = float(np.interp(h, xs, cum))
        at_best = (spent + least(world, h, deadline, work - did)) / bound
        gap.append({"hour": h, "done": round(did / work, 3), "spent": round(spent, 2),
                    "fleet": int(fleet[i]), "at_best": round(at_best, 4)})

    others: dict[tuple[float, int], tuple] = {}

    def other(h: float, level: int) -> tuple:
        """The world whose spot is held at ``level`` from ``h`` on, and its bound (once)."""
        if (h, level) not in others:
            w = world_after(world, world.start + h * 3600, level)
            others[h, level] = (w, hindsight(w, p, work=work, horizon_h=deadline).cost)
        return others[h, level]

    def tables(hours: list[float], n: int, levels: tuple[int, ...]) -> tuple[list, list, list]:
        """``tree_floor``'s tables: the trace's stages between ``hours`` and, at each hour,
        the worlds whose spot is held from it on at each of ``levels`` (``max_size``:
        stays; 0: gone), the work on a grid of ``n`` steps."""
        grid = [work * i / n for i in range(n + 1)]
        cuts = [0.0, *hours, deadline]
        stage = [[least(world, cuts[j], cuts[j + 1], g) for g in grid]
                 for j in range(len(cuts) - 1)]
        rest: list = [[] for _ in hours]
        bounds: list = [[] for _ in hours]
        for k, h in enumerate(hours):
            for level in levels:
                w, own = other(h, level)
                bounds[k].append(own)
                rest[k].append([least(w, h, deadline, work - g) for g in grid])
        return stage, rest, bounds

    stage, rest, bounds = tables([a.until], a.steps, (p.max_size,))
    two, at_t = tree_floor(stage, rest, bounds, bound)
    floor = [{"share_by_T": round(k / a.steps, 3),
              "trace": round((stage[0][k] + stage[1][a.steps - k]) / bound, 4),
              "spot_stays": round((stage[0][k] + rest[0][0][k]) / bounds[0][0], 4)}
             for k in range(a.steps + 1)]
    stage3, rest3, bounds3 = tables([a.until], a.fine, (p.max_size, 0))
    three, at_three = tree_floor(stage3, rest3, bounds3, bound, lower=True)
    theirs = {}  # spotring in the worlds it cannot tell from the trace until --until
    for name, level in (("spot_stays", p.max_size), ("spot_gone", 0)):
        w, own = other(a.until, level)
        run = run_all(w, ["spotring"], p, work=work, deadline_h=deadline, seed=0)["spotring"]
        theirs[name] = round(run.cost / own, 4) if run.deadline_met is not False else None
    branches = sorted(h for h in (outage_starts(world, deadline) if a.branches is None
                                  else a.branches) if 0 < h < deadline)
    stage, rest, bounds = tables(branches, a.grid, (p.max_size, 0))
    stays, at_stays = tree_floor(stage, [r[:1] for r in rest], [b[:1] for b in bounds], bound)
    tree, at_tree = tree_floor(stage, rest, bounds, bound)
    held, at_held = tree_floor(stage, rest, bounds, bound, trace_at_most=a.goal)
    kept = deadline_floors(world, p, work=work, deadline_h=deadline) or {}

    def ratio(x: float | None) -> float | None:
        return None if x is None or not np.isfinite(x) else round(x / bound, 4)

    out = {"row": row.name, "bound": round(bound, 2), "spotring": round(ours.cost, 2),
           "vs_bound": round(ours.cost / bound, 4), "gap_by_hour": gap,
           "until_h": a.until, "bound_spot_stays": round(other(a.until, p.max_size)[1], 2),
           "non_anticipating_floor": round(two, 4), "at_share_by_T": round(at_t[0] / a.steps, 3),
           "spotring_share_by_T": round(float(np.interp(a.until, xs, done)) / work, 3),
           "deadline_safe_floor": ratio(kept.get("deadline_safe_usd")),
           "margin_kept_floor": ratio(kept.get("margin_kept_usd")),
           "margin_hours": kept.get("margin_hours"),
           "three_world_lower_bound": round(three, 4),
           "three_world_share_by_T": round(at_three[0] / a.fine, 3),
           "bound_spot_gone": round(other(a.until, 0)[1], 2),
           "spotring_in_those_worlds": {"trace": round(ours.cost / bound, 4), **theirs},
           "branch_hours": branches, "grid": a.grid,
           "branch_floor_stays": round(stays, 4),
           "branch_shares_stays": [round(i / a.grid, 3) for i in at_stays],
           "branch_floor": round(tree, 4),
           "branch_shares": [round(i / a.grid, 3) for i in at_tree],
           "goal": a.goal, "others_with_trace_at_goal": round(held, 4) if np.isfinite(held)
           else None, "branch_shares_at_goal": [round(i / a.grid, 3) for i in at_held]}
    if a.table:
        for g in gap:
            print(f"{g['hour']:5.1f} h  done {g['done']:.3f}  spent ${g['spent']:7.2f}  "
                  f"fleet {g['fleet']:2d}  at best {g['at_best']:.3f}x", file=sys.stderr)
        for f in floor:
            print(f"W_T {f['share_by_T']:.2f}: trace {f['trace']:.3f}x, spot stays "
                  f"{f['spot_stays']:.3f}x", file=sys.stderr)
        print(f"at {a.until:g} h, over the trace and the worlds whose spot stays or is gone "
              f"from then: at least {three:.3f}x (a lower bound; its work by then "
              f"{at_three[0] / a.fine:.0%}); spotring there: " + ", ".join(
                  f"{k} {v:.3f}x" if v is not None else f"{k} late"
                  for k, v in out["spotring_in_those_worlds"].items()),
              file=sys.stderr)
        for name, z, at in (("stays", stays, at_stays), ("stays or is gone", tree, at_tree),
                            (f"stays or is gone, this one held at {a.goal}x", held, at_held)):
            print(f"over the trace and the worlds whose spot {name} from each of its "
                  f"{len(branches)} outages: {z:.3f}x at least; the work done by then: "
                  + ", ".join(f"{h:g} h {i / a.grid:.0%}" for h, i in zip(branches, at)),
                  file=sys.stderr)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
