"""The live dashboard of ``provision run`` and the view of ``provision status`` (rich).

Design: pure rendering: :func:`render` turns a :class:`~provisioner.daemon.scheduler.Status` into a
rich renderable (fleet by offering, prices, spend, samples/s, accuracy, last events); the
caller owns the ``rich.live.Live`` and the refresh. Nothing here reads the state or a clock.

Rule for callers: render from the main thread; pass ``t0`` (simulated start) so times read
as hours into the run.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from provisioner.daemon.status import Status


def _h(t: float, t0: float) -> str:
    return f"{(t - t0) / 3600.0:6.2f} h"


def render(st: Status, t0: float, *, title: str = "spotring") -> Any:
    """A rich renderable of one status (see the module docstring)."""
    head = Table.grid(padding=(0, 2))
    sps = "-" if st.samples_per_s is None else f"{st.samples_per_s:,.0f}"
    acc = st.progress.get("accuracy")
    acc_s = "-" if not isinstance(acc, (int, float)) else f"{acc:.3f}"
    head.add_row(
        f"[b]time[/b] {_h(st.now.timestamp(), t0)}",
        f"[b]spend[/b] ${st.spend:,.4f}",
        f"[b]cost[/b] ${st.cost_per_hour:,.3f}/h",
        f"[b]samples/s[/b] {sps}",
        f"[b]epoch[/b] {st.progress.get('epoch', '-')}",
        f"[b]step[/b] {st.progress.get('step', '-')}",
        f"[b]accuracy[/b] {acc_s}",
        f"[b]steps lost[/b] {st.progress.get('steps_lost', 0)}",
    )
    fleet = Table(title="fleet by offering", expand=True)
    fleet.add_column("offering")
    fleet.add_column("held", justify="right")
    fleet.add_column("price $/h", justify="right")
    keys = sorted(set(st.fleet) | {k for k in st.prices if k.endswith("/spot")})
    for k in keys:
        n = st.fleet.get(k, 0)
        price = st.prices.get(k)
        fleet.add_row(Text(k, style="bold" if n else "dim"), str(n) if n else "",
                      f"{price:.4f}" if price is not None else "-")
    if st.draining:
        fleet.add_row(Text("draining", style="yellow"), str(st.draining), "")
    workers = Table(title="workers (samples/s)", expand=True)
    workers.add_column("worker")
    workers.add_column("samples/s", justify="right")
    for name, v in sorted(st.workers.items()):
        workers.add_row(name, f"{v:,.0f}")
    events = Table(title="last events", expand=True)
    events.add_column("time", no_wrap=True)
    events.add_column("event", no_wrap=True)
    events.add_column("instance", no_wrap=True)
    events.add_column("detail", overflow="ellipsis", no_wrap=True)
    for e in st.events:
        events.add_row(_h(e.t, t0), e.kind, e.instance_id or "", e.detail[:80])
    return Panel(Group(head, fleet, workers, events), title=title)
