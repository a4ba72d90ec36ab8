"""Benchmark: where a run loses against the hindsight bound, and what knowing less could reach.

Two figures for one row of ``benchmarks/trace_rows.py`` (default: the V100 10-minute probes
with a 34.4 h deadline, the one run of issue 28 still above its goal), both built from the
simulator's own bound (:func:`provisioner.sim.hindsight.hindsight`, the same program the
ratios are taken against):

- **the gap by hour** (``--at H ...``): spotring's run replayed, and at each hour ``H`` the
  least it could still pay: what it spent by ``H`` plus the bound of the work it had left
  over ``[H, deadline]`` (starting up to ``max_size`` instances of its choosing without a
  boot: whatever the run held at ``H`` was booted already), over the bound. 1.000x at the start, its ratio at the end: where it rises is
  where the run lost, whatever it did later;
- **a non-anticipating policy's best** (``--until T``): a policy cannot tell the trace from
  the same trace whose spot stays after ``T`` (the hour its first outage of every zone
  starts), so it has done the same work ``W_T`` by ``T`` in both. For each ``W_T`` the least
  either can cost is the bound of ``W_T`` over ``[0, T]`` plus the bound of the rest over
  ``[T, deadline]`` in that world; the best such policy is at least the ``W_T`` whose worse
  ratio of the two is least. A floor above the goal would prove the goal out of reach of
  any policy that does not see the future; one below it says the run's loss is the policy's;
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

from benchmarks.trace_rows import ROWS, windows, world_of  # noqa: E402


def _world_after(world, t: float, level: int):
    """``world`` with every spot availability series held at ``level`` from ``t`` on (and no
    removal after it): the same market as far as a policy at ``t`` can tell, whose spot
    stays."""
    from pricing.series import Step

    avail, reclaims = dict(world.avail), dict(world.reclaims)
    for o, st in world.avail.items():
        if st is None or o.market != "spot":
            continue
        keep = st.t < t
        avail[o] = Step(list(st.t[keep]) + [t], list(st.v[keep]) + [level])
        if o in reclaims:
            reclaims[o] = reclaims[o].before(t)
    return dataclasses.replace(world, avail=avail, reclaims=reclaims)


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

    def rest(w, at_h: float, left: float) -> float:
        # the fleet a policy holds at ``at_h`` (at most max_size instances) is booted
        # already: the bound of the rest starts that many for free, of the offerings it
        # chooses (a credit of max_size boots at the dearest spot price had counted a
        # p3.16xlarge's boot per instance on the four types: floors below 1)
        if left <= 0:
            return 0.0
        return hindsight(dataclasses.replace(w, start=w.start + at_h * 3600), p, work=left,
                         horizon_h=deadline - at_h, free_boots=p.max_size).cost

    xs, fleet, rates, cum = (np.asarray(v, dtype=float) for v in ours.series)
    done = np.concatenate([[0.0], np.cumsum(rates[:-1] * np.diff(xs) * 3600.0)])
    gap = []
    for h in sorted(x for x in a.at if 0 < x < deadline):
        i = max(int(np.searchsorted(xs, h, side="right")) - 1, 0)
        did = min(work, done[i] + rates[i] * (h - xs[i]) * 3600.0)
        spent = float(np.interp(h, xs, cum))
        least = (spent + rest(world, h, work - did)) / bound
        gap.append({"hour": h, "done": round(did / work, 3), "spent": round(spent, 2),
                    "fleet": int(fleet[i]), "at_best": round(least, 4)})
    stays = _world_after(world, world.start + a.until * 3600, p.max_size)
    bound_stays = hindsight(stays, p, work=work, horizon_h=deadline).cost
    floor = []
    for k in range(a.steps + 1):
        w_t = work * k / a.steps
        first = hindsight(world, p, work=w_t, horizon_h=a.until).cost if w_t > 0 else 0.0
        r_trace = (first + rest(world, a.until, work - w_t)) / bound
        r_stays = (first + rest(stays, a.until, work - w_t)) / bound_stays
        floor.append({"share_by_T": round(k / a.steps, 3), "trace": round(r_trace, 4),
                      "spot_stays": round(r_stays, 4), "worse": round(max(r_trace, r_stays), 4)})
    best = min(floor, key=lambda f: f["worse"])
    kept = deadline_floors(world, p, work=work, deadline_h=deadline) or {}

    def ratio(x: float | None) -> float | None:
        return None if x is None or not np.isfinite(x) else round(x / bound, 4)

    out = {"row": row.name, "bound": round(bound, 2), "spotring": round(ours.cost, 2),
           "vs_bound": round(ours.cost / bound, 4), "gap_by_hour": gap,
           "until_h": a.until, "bound_spot_stays": round(bound_stays, 2),
           "non_anticipating_floor": best["worse"], "at_share_by_T": best["share_by_T"],
           "spotring_share_by_T": round(float(np.interp(a.until, xs, done)) / work, 3),
           "deadline_safe_floor": ratio(kept.get("deadline_safe_usd")),
           "margin_kept_floor": ratio(kept.get("margin_kept_usd")),
           "margin_hours": kept.get("margin_hours")}
    if a.table:
        for g in gap:
            print(f"{g['hour']:5.1f} h  done {g['done']:.3f}  spent ${g['spent']:7.2f}  "
                  f"fleet {g['fleet']:2d}  at best {g['at_best']:.3f}x", file=sys.stderr)
        for f in floor:
            print(f"W_T {f['share_by_T']:.2f}: trace {f['trace']:.3f}x, spot stays "
                  f"{f['spot_stays']:.3f}x", file=sys.stderr)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
