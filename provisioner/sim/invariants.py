"""What must hold on every trace, checked on a run: the issue-28 invariants as figures.

Design: pure functions of finished runs (:class:`~provisioner.sim.result.Result`), the world
and the job, so the benchmarks (``benchmarks/policy_cv.py``) and the tests check the same
thing the same way. For spotring's run:

- ``cost_vs_on_demand``: its cost per sample over on-demand alone's (<= 1);
- ``empty_behind_h``: hours the fleet held nothing while the planner said it was behind its
  pace (``Decision.behind``: its slack gone, the on-demand floor positive; for the job's own
  pace, against its line moved for the spot outages seen), with on-demand allowed;
- ``empty_late_h``: the stricter reading: hours holding nothing while behind the line that
  does not move (the user's deadline less its margin, or the job's own nominal time, from
  :func:`provisioner.plan.pacing.pace` over the fastest on-demand ring);
- ``unpaid_swaps``: running instances dropped in a round that launched a cheaper offering
  whose instance was revoked before its saving paid back its boot
  (``boot x new price / (old price - new price)``), and what those swaps cost;
- ``deadline_met``: a deadline run finished by its deadline.

Rule: pass the run as the engine returned it (its series and lives are read, not changed).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from provisioner.plan.model import ring_rate
from provisioner.plan.pacing import pace
from provisioner.sim.policies import Params
from provisioner.sim.result import Result
from provisioner.sim.world import World


def od_ring_rate(world: World, p: Params) -> float:
    """Samples/s of the fastest on-demand ring of ``max_size`` (the planner's od_capacity)."""
    best = 0.0
    for o in world.price:
        if o.market == "on-demand" and o.instance_type in world.speed:
            best = max(best, ring_rate(p.max_size, world.speed[o.instance_type], p.model_mb,
                                       p.global_batch, p.links[0]))
    return best


def empty_late_hours(run: Result, world: World, p: Params, deadline_h: float,
                     hard: bool) -> float:
    """Hours with no instance held while the on-demand floor of the pace was positive."""
    if "on-demand" not in p.plan.markets:
        return 0.0
    od = od_ring_rate(world, p)
    if od <= 0:
        return 0.0
    xs, fleet, rates, _ = run.series
    _, _, safety = pace(1.0, deadline_h, deadline_h, od, hard=hard,
                        safety_hours=p.plan.safety_hours, overhead_h=p.plan.ramp_h)
    done, empty = 0.0, 0.0
    for i in range(len(xs) - 1):
        h0, h1 = xs[i], xs[i + 1]
        left = run.work - done
        if fleet[i] == 0 and h1 > h0 and left > 0:
            # nothing is done while empty: the floor turns positive once the slack (time
            # left less the ramp and the fastest on-demand ring's time) falls to the margin
            late_from = deadline_h - p.plan.ramp_h - left / (od * 3600.0) - safety
            empty += max(0.0, h1 - max(h0, late_from))
        done += rates[i] * (h1 - h0) * 3600.0
    return empty


#: prices within this relative difference are the same price (a move, not a saving)
PRICE_RTOL = 1e-6


def unpaid_swaps(run: Result, boot_s: float) -> tuple[int, float]:
    """(count, USD) of running instances dropped for a cheaper launch in the same round
    whose new instance was revoked before the saving paid back its boot."""
    launched: dict[float, list] = defaultdict(list)
    for life in run.lives:
        launched[round(life.launched_h, 9)].append(life)
    count, usd = 0, 0.0
    for life in run.lives:
        if life.revoked or life.ended_h <= life.ready_h:  # revoked, or dropped while booting
            continue
        for new in launched.get(round(life.ended_h, 9), ()):
            if new.offering == life.offering:
                continue
            old_p = life.cost / max(life.ended_h - life.launched_h, 1e-12)
            new_p = new.cost / max(new.ended_h - new.launched_h, 1e-12)
            if new_p >= old_p * (1.0 - PRICE_RTOL):  # the same price, rebuilt from cost and
                continue  # hours with float noise, is no saving (its payback was 1e14 h)
            payback_h = boot_s / 3600.0 * new_p / (old_p - new_p)
            if new.revoked and new.ended_h - new.launched_h < boot_s / 3600.0 + payback_h:
                count += 1
                usd += new.cost
                break
    return count, usd


def check(results: Mapping[str, Result], world: World, p: Params, *,
          deadline_h: float | None) -> dict:
    """The invariants of spotring's run in ``results`` (with ``on-demand`` for the cost
    check), as plain numbers."""
    ours = results["spotring"]
    od = results.get("on-demand")
    out: dict = {}
    if od is not None and od.done > 0 and ours.done > 0:
        out["cost_vs_on_demand"] = round(ours.cost_per_m / od.cost_per_m, 4)
    out["empty_behind_h"] = round(ours.empty_behind_h, 3)
    own_h = ours.work / p.nominal_rate(world.speed) / 3600.0  # the job's own (soft) pace
    line_h = deadline_h if deadline_h is not None else own_h
    out["empty_late_h"] = round(empty_late_hours(ours, world, p, line_h,
                                                 hard=deadline_h is not None), 3)
    n, usd = unpaid_swaps(ours, p.boot_s)
    out["unpaid_swaps"], out["unpaid_swaps_usd"] = n, round(usd, 4)
    out["deadline_met"] = ours.deadline_met
    out["finished"] = ours.finished
    return out
