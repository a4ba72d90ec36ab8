"""The simulator's runs on the real traces in ../shared/data, by family (shared by benchmarks).

Design: one table of rows, each a ``provision simulate`` command as data (the traces, the
types, the on-demand list prices the traces lack, the deadline), grouped into the trace
families the data holds, so the policy benchmarks (``policy_cv.py``, ``correlated.py``)
run exactly the runs docs/optimizer.md shows. :func:`run_row` replays one row with given
settings and returns spotring's, on-demand's and the bound's figures with the invariants.

Rule: the traces are read from ``$SPOTRING_DATA`` (default ``../shared/data`` beside the
repository) at run time; nothing here copies them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from provisioner.sim.windows import WINDOW_TAIL_H

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("SPOTRING_DATA", REPO.parent / "shared" / "data"))
PRICES = "aws_spot_price_history/ericpauley_2022-05-31_all_types.csv.gz"
AVAIL = "spot_availability_traces/cant_be_late/availability"
PREEMPT = "spot_availability_traces/cant_be_late/preemption"
#: us-west-2 on-demand list prices (the AWS price events hold none)
OD = {"p3.2xlarge": 3.06}
OD4 = {"p2.xlarge": 0.90, "p3.2xlarge": 3.06, "p2.8xlarge": 7.20, "p3.16xlarge": 24.48}


@dataclass(frozen=True)
class Row:
    """One run: ``family`` of traces, a ``name``, the trace paths (under the data folder),
    the types kept, on-demand prices given, the deadline (hours), the period, the work."""

    family: str
    name: str
    traces: tuple[str, ...]
    types: tuple[str, ...] = ()
    on_demand: tuple[tuple[str, float], ...] = tuple(OD.items())
    deadline_h: float | None = None
    start: str | None = None
    hours: float | None = None
    itype: str = "p3.2xlarge"
    regions: tuple[str, ...] = ()
    work: float = 1.2e8
    multi: bool = False  # several instance types in play (the goal is 1.10x, not 1.05x)
    tags: tuple[str, ...] = field(default=())
    window_of: str | None = None  # the row this one replays from a later start (windows())


GCP = ("gcp_gpu_price_history/gcp_gpu_vm_prices_history.csv.gz",
       "preemption_lifetimes/gcp_preemptible_gpu_lifetimes_2019.csv")
ROWS: tuple[Row, ...] = (
    Row("gcp-weekly", "gcp", GCP, itype="a2-highgpu-1g", on_demand=(), start="2025-06-01T00:00:00Z",
        hours=200, work=3.5e8, regions=("us-central1", "us-east1", "europe-west4", "asia-east1")),
    Row("aws-price-events", "events", (PRICES,), types=("p3.2xlarge",)),
    Row("cbl-16node", "16-node", (f"{AVAIL}/16-node/aws-08-27-2023", PRICES)),
    Row("cbl-16node", "16-late", (f"{AVAIL}/16-node/aws-08-27-2023", PRICES),
        start="2023-09-03T14:40:00Z", hours=100),
    Row("cbl-1node-02-15", "02-15", (f"{AVAIL}/1-node/aws-02-15-2023", PRICES)),
    Row("cbl-1node-02-15", "02-15, 34.4 h", (f"{AVAIL}/1-node/aws-02-15-2023", PRICES),
        deadline_h=34.4),
    Row("cbl-1node-02-15", "02-15, 45.8 h", (f"{AVAIL}/1-node/aws-02-15-2023", PRICES),
        deadline_h=45.8),
    # (the baselines' type: the spot type with the most offerings, as `provision simulate`
    # picks it; its nominal ring sets the job's own pace)
    Row("cbl-1node-10-26", "10-26", (f"{AVAIL}/1-node/aws-10-26-2022", PRICES),
        on_demand=tuple(OD4.items()), multi=True, itype="p2.xlarge"),
    Row("cbl-1node-10-26", "10-26, 159.4 h", (f"{AVAIL}/1-node/aws-10-26-2022", PRICES),
        on_demand=tuple(OD4.items()), deadline_h=159.4, multi=True, itype="p2.xlarge"),
    Row("cbl-1node-10-26", "10-26, 34.4 h", (f"{AVAIL}/1-node/aws-10-26-2022", PRICES),
        on_demand=tuple(OD4.items()), deadline_h=34.4, multi=True, itype="p2.xlarge"),
    Row("cbl-1node-10-26", "10-26 V100", (f"{AVAIL}/1-node/aws-10-26-2022", PRICES),
        types=("p3.2xlarge",)),
    Row("cbl-1node-10-26", "10-26 V100, 34.4 h", (f"{AVAIL}/1-node/aws-10-26-2022", PRICES),
        types=("p3.2xlarge",), deadline_h=34.4),
    Row("cbl-preempt-1node", "p-1node", (f"{PREEMPT}/1-node/aws-04-22-2023", PRICES)),
    Row("cbl-preempt-1node", "p-1node, 34.4 h", (f"{PREEMPT}/1-node/aws-04-22-2023", PRICES),
        deadline_h=34.4),
    Row("cbl-preempt-4node", "p-4node", (f"{PREEMPT}/4-node/aws-08-03-2023", PRICES)),
    Row("cbl-preempt-4node", "p-4node, 34.4 h", (f"{PREEMPT}/4-node/aws-08-03-2023", PRICES),
        deadline_h=34.4),
)
#: One row per family: the small default of the benchmarks.
SMALL = ("gcp", "events", "16-node", "02-15", "10-26", "10-26 V100", "p-1node", "p-4node")


@lru_cache(maxsize=8)
def _snapshot(traces: tuple[str, ...]) -> Any:
    from pricing.sources.trace import load_trace
    return load_trace([str(DATA / t) for t in traces])


def world_of(row: Row, settings: Any, seed: int = 0) -> Any:
    """The simulated world of ``row`` (as ``provision simulate`` builds it)."""
    from pricing.sources.trace_formats import parse_time
    from provisioner.plan.throughput import ThroughputModel
    from provisioner.sim.world import build_world

    job = settings.job
    model = ThroughputModel(priors=job.throughput_priors, unit=job.samples_per_s_per_unit)
    return build_world(_snapshot(row.traces), model, max_size=settings.fleet.max_size,
                       on_demand=dict(row.on_demand), types=row.types, regions=row.regions,
                       start=parse_time(row.start) if row.start else None, hours=row.hours,
                       seed=seed)


def windows(row: Row, step_h: float) -> tuple[Row, ...]:
    """``row`` replayed from every ``step_h`` hours of its traces: one row per start whose
    deadline and :data:`WINDOW_TAIL_H` fit inside the traces (the first at the row's own
    start), named ``"NAME @+H h"``. One window is one draw of the market: a rule fitted to
    it can win there and lose in the next; the family's windows are the test. A row without
    a deadline has no fixed length: ``(row,)``."""
    from datetime import datetime, timezone

    from provisioner.config import parse_settings
    from provisioner.sim.windows import window_starts

    if row.deadline_h is None:
        return (row,)
    if step_h <= 0:
        raise ValueError(f"step_h={step_h}: must be > 0")
    w = world_of(row, parse_settings({}))
    out = []
    for t in window_starts(w.start, w.end, row.deadline_h, step_h):
        off = (t - w.start) / 3600.0
        start = datetime.fromtimestamp(t, timezone.utc)
        out.append(replace(row, name=f"{row.name} @+{off:g} h", window_of=row.name,
                           start=start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                           hours=row.deadline_h + WINDOW_TAIL_H))
    return tuple(out)


def world_after(world, t: float, level: int):
    """``world`` with every spot availability series held at ``level`` from ``t`` on (and no
    removal after it): the same market as far as a policy at ``t`` can tell, whose spot
    stays (``max_size``), or is gone (0)."""
    from pricing.series import Step

    avail, reclaims = dict(world.avail), dict(world.reclaims)
    for o, st in world.avail.items():
        if st is None or o.market != "spot":
            continue
        keep = st.t < t
        avail[o] = Step(list(st.t[keep]) + [t], list(st.v[keep]) + [level])
        if o in reclaims:
            reclaims[o] = reclaims[o].before(t)
    return replace(world, avail=avail, reclaims=reclaims)


def outage_starts(world, deadline_h: float) -> list[float]:
    """Hours (from the start, within the deadline) at which the cheapest spot type per
    sample goes out in every zone: where the trace and the one whose spot stays part."""
    spot = [o for o, st in world.avail.items()
            if st is not None and o.market == "spot" and o.instance_type in world.speed]
    if not spot:
        return []
    cheap = min({o.instance_type for o in spot}, key=lambda t: min(
        world.price[o].at(world.start) for o in spot if o.instance_type == t) / world.speed[t])
    series = [world.avail[o] for o in spot if o.instance_type == cheap]
    end = world.start + deadline_h * 3600.0
    cuts = sorted({float(x) for st in series for x in st.t if world.start < x < end})
    starts, before = [], sum(st.at(world.start) for st in series)
    for t in cuts:
        now = sum(st.at(t) for st in series)
        if before > 0 and now <= 0:
            starts.append(round((t - world.start) / 3600.0, 4))
        before = now
    return starts


def run_row(row: Row, config: dict | None = None, *, work_scale: float = 1.0, seed: int = 0,
            policies: tuple[str, ...] = ("spotring", "on-demand", "hindsight"),
            floors: bool = False, gone: int = 0) -> dict:
    """Replay ``row`` with settings ``config`` (a dict as a TOML file reads); spotring's
    figures, its ratios to on-demand and to the bound, and the invariants. With ``floors``
    (a deadline row), also what the deadline costs at least over the bound
    (``deadline_safe``, ``margin_kept``: :func:`provisioner.sim.report.deadline_floors`;
    None where no fleet keeps it). With ``gone`` (``True``: 1), also spotring against
    on-demand alone in the worlds whose spot is gone for good from each of the first ``gone``
    outages of its cheapest spot in every zone at least an hour in (:func:`outage_starts`),
    the worst of them: ``gone_from_h`` (its hour), ``cost_vs_on_demand_if_gone``,
    ``deadline_met_if_gone`` (False if any missed; None without such an outage), and
    ``gone_worlds`` replayed: invariant 1 where a policy cannot tell an outage that ends
    from one that does not."""
    from provisioner.config import parse_settings
    from provisioner.sim.invariants import check
    from provisioner.sim.policies import Params
    from provisioner.sim.report import run_all

    settings = parse_settings(config or {})
    world = world_of(row, settings, seed)
    p = Params(settings, itype=row.itype, size=4)
    work = row.work * work_scale
    deadline = None if row.deadline_h is None else row.deadline_h * work_scale
    r = run_all(world, list(policies), p, work=work, deadline_h=deadline, seed=seed,
                floors=floors)
    ours = r["spotring"]
    out = {"row": row.name, "family": row.family, "multi": row.multi, "window_of": row.window_of,
           "cost": round(ours.cost, 4),
           "hours": None if ours.completion_h is None else round(float(ours.completion_h), 3),
           "launches": ours.launches, "revocations": ours.revocations}
    if "hindsight" in r and r["hindsight"].cost > 0:
        out["bound"] = round(r["hindsight"].cost, 4)
        out["vs_bound"] = round(ours.cost_per_m / r["hindsight"].cost_per_m, 4)
        got = r["hindsight"].floors  # (the ``floors`` asked for, where a deadline has them)
        for name in ("deadline_safe", "margin_kept") if got else ():
            v = got[f"{name}_usd"]
            out[name] = round(v / r["hindsight"].cost, 4) if math.isfinite(v) else None
    out.update(check(r, world, p, deadline_h=deadline))
    if gone:
        horizon = deadline if deadline is not None else out["hours"] or 0.0
        hours = [h for h in outage_starts(world, horizon) if h >= 1.0][:int(gone)]
        figs = []
        for t in hours:
            other = world_after(world, world.start + t * 3600.0, 0)
            figs.append((t, check(run_all(other, ["spotring", "on-demand"], p, work=work,
                                          deadline_h=deadline, seed=seed),
                                  other, p, deadline_h=deadline)))
        out.update(worst_gone(figs), gone_asked=int(gone))
    return {k: plain(v) for k, v in out.items()}


def worst_gone(figs: list[tuple[float, dict]]) -> dict:
    """Of the worlds whose spot is gone from each hour of ``figs`` (``(hour, check's
    figures)``), the worst: its hour and cost per sample over on-demand alone's (the
    dearest; None if none has one), whether every deadline was met (False if one was
    missed, None without a deadline or a world), and how many worlds."""
    out: dict = {"gone_from_h": None, "cost_vs_on_demand_if_gone": None,
                 "deadline_met_if_gone": None, "gone_worlds": len(figs)}
    for t, g in figs:
        cost, worst = g.get("cost_vs_on_demand"), out["cost_vs_on_demand_if_gone"]
        if out["gone_from_h"] is None or (cost is not None and (worst is None or cost > worst)):
            out.update(gone_from_h=t, cost_vs_on_demand_if_gone=cost)
        if g.get("deadline_met") is False or out["deadline_met_if_gone"] is None:
            out["deadline_met_if_gone"] = g.get("deadline_met")
    return out


def plain(v: Any) -> Any:
    """A JSON-able Python value of ``v`` (numpy scalars become float, int or bool)."""
    if v is None or isinstance(v, (str, list, dict)):
        return v
    if hasattr(v, "item"):  # a numpy scalar
        v = v.item()
    return v
