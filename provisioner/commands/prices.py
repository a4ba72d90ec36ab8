"""``provision prices``: believable spot prices and revocation hazards, from a cloud or a trace.

Design: the command wires the pricing pieces in their one order (source -> sanity ->
risk) and only formats: a rich table for people, ``--json`` for programs, and a summary of
refused quotes on stderr. For a trace, "now" is the end of the trace unless ``--at`` says.

Rule: errors users can fix (no credentials, a bad trace) reach the dispatcher as
CredentialsError / TraceFormatError / UserError: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from pricing.catalog import canonical_gpu, gpu_for
from pricing.errors import PricingError, SourceError, StoreError
from pricing.model import PriceQuote, RiskEstimate, Snapshot
from pricing.sources.trace_formats import parse_time
from provisioner.clio import add_json_flag, print_json
from provisioner.errors import UserError

log = logging.getLogger(__name__)

#: Default --max-age for a trace: GCP publishes spot prices about monthly and the weekly
#: history has gaps of up to three weeks, so a quote older than 30 days at "now" is stale.
TRACE_MAX_AGE_HOURS = 30 * 24.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "prices", help="spot prices, discounts and revocation risk per offering",
        description="List believable spot prices per offering with the on-demand price, the "
        "discount and a revocation hazard per hour. Refused quotes are summarised on stderr.")
    p.add_argument("--source", choices=("aws", "gcp", "trace"), default="trace",
                   help="where prices come from (default: trace)")
    p.add_argument("--trace", action="extend", nargs="+", default=[], metavar="PATH",
                   help="trace file(s) or folder(s) for --source trace; lifetime and "
                   "availability traces given here inform the hazard (default: $SPOTRING_DATA)")
    p.add_argument("--region", action="append", default=[], help="only this region (repeatable)")
    p.add_argument("--gpu", action="append", default=[], help="only this GPU model, e.g. H100 (repeatable)")
    add_json_flag(p, help="print a JSON array instead of a table")
    p.add_argument("--at", metavar="TIME", help="trace time to view (ISO 8601); default: end of the trace")
    p.add_argument("--max-age", type=float, metavar="HOURS",
                   help=f"refuse quotes older than this (default {TRACE_MAX_AGE_HOURS:g} h for a "
                   "trace, none for a cloud, whose latest price change holds until the next)")
    p.add_argument("--advisor", metavar="PATH", help="AWS Spot Advisor csv(.gz) used as a hazard prior")
    p.add_argument("--all-types", action="store_true", help="include instance types without GPUs")
    p.add_argument("--store", metavar="PATH", help="also append the accepted quotes to this SQLite "
                   "price store (created if missing)")
    p.add_argument("--endpoint-url", help=argparse.SUPPRESS)  # moto server / local fake in tests
    p.add_argument("--project", help="GCP project for --source gcp (default: from credentials)")
    p.set_defaults(handler=run)


def _superseded(quotes: list[PriceQuote]) -> list[PriceQuote]:
    """Drop on-demand quotes of (cloud, region, type) that also have a spot quote, which
    carries the on-demand price: e.g. GCP rows from before spot prices were published."""
    spot = {(q.offering.cloud, q.offering.region, q.offering.instance_type)
            for q in quotes if q.offering.market == "spot"}
    return [q for q in quotes if q.offering.market == "spot"
            or (q.offering.cloud, q.offering.region, q.offering.instance_type) not in spot]


def _rows(quotes: list[PriceQuote], risks: dict, snapshot: Snapshot, now: datetime) -> list[dict]:
    rows = []
    for q in quotes:
        off = q.offering
        spec = snapshot.gpus.get(off.instance_type) or gpu_for(off.instance_type)
        risk: RiskEstimate = risks[off]
        spot = q.price_per_hour if off.market == "spot" else None
        od = q.on_demand_per_hour if off.market == "spot" else q.price_per_hour
        rows.append({
            "cloud": off.cloud, "region": off.region, "zone": off.zone,
            "instance_type": off.instance_type, "market": off.market,
            "gpu": spec.model if spec else None, "gpu_count": spec.count if spec else 0,
            "spot_price": spot, "on_demand_price": od,
            "discount": round(q.discount, 4) if q.discount is not None and spot is not None else None,
            "hazard_per_hour": round(risk.hazard_per_hour, 6), "hazard_basis": risk.basis,
            "hazard_low": None if risk.low is None else round(risk.low, 6),
            "hazard_high": None if risk.high is None else round(risk.high, 6),
            "hazard_samples": risk.samples,
            "co_revocation": None if risk.co_fraction is None else round(risk.co_fraction, 4),
            "quote_time": q.time.isoformat().replace("+00:00", "Z"),
            "age_s": round(q.age(now).total_seconds(), 1), "source": q.source,
        })

    def order(r: dict) -> tuple:
        price = r["spot_price"] if r["spot_price"] is not None else r["on_demand_price"]
        return (r["gpu"] or "~", price / max(r["gpu_count"], 1), r["cloud"], r["region"], r["zone"])

    return sorted(rows, key=order)


def _age(seconds: float) -> str:
    if seconds < 0:
        return "future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col, justify in (("offering", "left"), ("GPU", "left"), ("spot $/h", "right"),
                         ("on-demand $/h", "right"), ("discount", "right"), ("hazard/h", "right"),
                         ("basis", "left"), ("quote age", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    money = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    for r in rows:
        table.add_row(f"{r['cloud']}/{r['region']}/{r['zone']}/{r['instance_type']}",
                      f"{r['gpu_count']}x {r['gpu']}" if r["gpu"] else "-",
                      money(r["spot_price"]), money(r["on_demand_price"]),
                      "-" if r["discount"] is None else f"{r['discount']:.0%}",
                      f"{r['hazard_per_hour']:.4f}", r["hazard_basis"], _age(r["age_s"]))
    Console(width=160).print(table)


def _report_rejections(snapshot_rejected: tuple, stale: list, now_rejected: list) -> None:
    from pricing.sanity import summarize

    every = list(snapshot_rejected) + list(stale) + list(now_rejected)
    if not every:
        return
    counts = summarize(every)
    print(f"provision prices: refused {len(every)} quote(s): "
          + ", ".join(f"{reason} {n}" for reason, n in counts.items()), file=sys.stderr)
    shown: set[str] = set()
    for r in every:
        if r.reason in shown:
            continue
        shown.add(r.reason)
        print(f"  e.g. {r.reason}: {r.location} {r.offering or ''} price {r.value}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from pricing.risk import estimate, with_signals
    from pricing.sources.advisor import load_spot_advisor
    from pricing.sanity import check
    from pricing.sources import make_source

    if args.source != "trace" and args.trace:
        raise UserError("--trace is only used with --source trace")
    at = None
    if args.at:
        if args.source != "trace":
            raise UserError("--at is only meaningful with --source trace")
        try:
            at = parse_time(args.at)
        except ValueError:
            raise UserError(f"--at {args.at!r}: not an ISO 8601 time (e.g. 2025-01-01T00:00:00Z)") from None
    try:
        source = make_source(args.source, trace=args.trace or None, regions=args.region or None,
                             endpoint_url=args.endpoint_url, project=args.project)
    except PricingError as exc:
        if type(exc) is PricingError:
            raise UserError(str(exc)) from None
        raise
    try:
        snap = source.fetch(regions=args.region or None, gpus=args.gpu or None, now=at)
    except SourceError as exc:  # API failure after the SDK's retries: one line, no traceback
        raise UserError(f"cannot fetch {args.source} prices: {exc}") from None
    for note in snap.notes:
        log.info("%s", note)
    if args.source == "trace":
        now = at or source.now()  # type: ignore[attr-defined]
        max_age = TRACE_MAX_AGE_HOURS if args.max_age is None else args.max_age
    else:
        now = datetime.now(timezone.utc)
        max_age = args.max_age
    quotes = [q for q in snap.quotes if args.all_types or
              (snap.gpus.get(q.offering.instance_type) or gpu_for(q.offering.instance_type))]
    if args.gpu:
        want = {canonical_gpu(g) for g in args.gpu}
        quotes = [q for q in quotes if (s := snap.gpus.get(q.offering.instance_type)
                                        or gpu_for(q.offering.instance_type)) and s.model in want]
    ok, refused = check(_superseded(quotes), now=now,
                        max_age=None if max_age is None else timedelta(hours=max_age))
    if args.store:
        from pricing.store import PriceStore

        try:
            PriceStore(args.store).append(ok)
        except StoreError as exc:
            raise UserError(str(exc)) from None
    advisor = load_spot_advisor(args.advisor) if args.advisor else None
    risks = with_signals(estimate([q.offering for q in ok], snap.lifetimes, advisor=advisor),
                         snap.signals, now=now, horizon_h=1.0)  # (a rebalance: within the hour)
    rows = _rows(ok, risks, snap, now)
    if args.json:
        print_json(rows, indent=1)
    else:
        _table(rows, f"{args.source} prices at {now:%Y-%m-%d %H:%M} UTC ({len(rows)} offerings)")
    _report_rejections(snap.rejected, [], refused)
    if not rows:
        print("provision prices: no offerings matched (check --region/--gpu, or --at within the trace)",
              file=sys.stderr)
    return 0
