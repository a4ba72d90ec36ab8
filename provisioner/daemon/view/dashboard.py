"""The live dashboard of ``provision run`` (rich), sized to the terminal.

Design: pure rendering: :func:`render` turns a :class:`~provisioner.daemon.view.status.Status`
into a rich renderable that fits ``width`` x ``height``; the caller owns the
``rich.live.Live``, the refresh and the terminal's size. Nothing here reads the state or a
clock. What it shows, top to bottom:

- four head lines, each within 76 characters for a run of days: the run's time, epoch of
  the total, accuracy, loss, samples/s; notices, kills, steps lost and the ETA (the run's
  hours, and real seconds at the run's speed); the spend and cost per hour against
  on-demand, and against a checkpoint-restart system, with what each saved
  (:mod:`provisioner.daemon.view.savings`); then, once the job's ``evaluate`` returned
  something, a line with every metric it returned and the step and time it was measured at;
- every live instance: booting (launched, not in the ring yet), joining, active or
  draining, its offering, samples/s and price;
- on a terminal of at least :data:`WIDE` (columns x lines), the market beside it: every spot
  offering with what is held there, its price and the on-demand price;
- the newest events in words (:func:`provisioner.daemon.view.status.describe`), as many as the
  lines left allow.

Every line is cut (an ellipsis) rather than wrapped, so at 80x24 no line is wider than 80
and there are at most 24 lines; a bigger terminal gets more events and the market.

Rule for callers: render from the main thread; pass ``t0`` (simulated start) so times read
as hours into the run, and the terminal's size as it is now.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from provisioner.daemon.view.savings import pct
from provisioner.daemon.view.status import (Status, describe, metrics_text, number,
                                            short_offering)

#: (columns, lines) from which the market is shown beside the workers.
WIDE = (120, 40)
#: Events the dashboard leaves out: each re-forming is already said by "ring of N trains".
QUIET_EVENTS = ("ring-generation",)


def _h(t: float, t0: float) -> str:
    return f"{(t - t0) / 3600.0:6.2f} h"


def usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.4f}" if abs(x) < 100 else f"${x:,.2f}"


def _compact(x: float) -> str:
    """``32.9k``, ``1.2M``: a rate in at most five characters."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def eta_text(eta_s: float | None, speed: float) -> str:
    """``0.21 h (6 s real)``: the run's hours and, at ``speed``, the real time."""
    if eta_s is None:
        return "-"
    real = eta_s / max(speed, 1e-9)
    real_s = f"{real:.0f} s" if real < 120 else f"{real / 60:.0f} min"
    if speed == 1.0:
        return f"{eta_s / 3600:.2f} h"
    return f"{eta_s / 3600:.2f} h ({real_s} real)"


def _line(text: str) -> Text:
    t = Text.from_markup(text)
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def head_lines(st: Status, t0: float) -> list[Text]:
    """The head lines (see the module docstring): four, and a fifth with the job's metrics
    once its ``evaluate`` returned some."""
    p = st.progress
    acc = p.get("accuracy")
    loss = p.get("loss")
    epoch = p.get("epoch", "-")
    epochs = f"{epoch}/{st.total_epochs}" if st.total_epochs else f"{epoch}"
    sps = "-" if st.samples_per_s is None else _compact(st.samples_per_s)
    # Each line holds its most telling figures first and stays within 76 characters (an
    # 80-column panel) for a run of days: the revocations survived must never be cut.
    values = dict((st.job_metrics or {}).get("values") or p.get("metrics") or {})
    if not values and isinstance(acc, (int, float)):
        values = {"accuracy": acc}
    # the job's first metric (all of them: the fifth line), shortened: "acc" for accuracy
    first = next(iter(values.items()), ("acc", None))
    label = "acc" if first[0] == "accuracy" else first[0][:12]
    one = (f"[b]{_h(st.now.timestamp(), t0).strip()}[/b]  epoch {epochs}  {label} "
           f"{number(first[1])}  loss "
           f"{'-' if not isinstance(loss, (int, float)) else f'{loss:.3g}'}  "
           f"{sps} samples/s")
    two = (f"notices {st.counts.get('notice', 0)}  kills {st.counts.get('killed', 0)}  "
           f"steps lost {p.get('steps_lost', 0)}  [b]ETA[/b] {eta_text(st.eta_s, st.speed)}")
    if st.paused_since is not None:  # said first: the one thing the person must act on
        two = "[b red]disk full: writes paused[/b red]  " + two
    s = st.savings
    spend = f"[b]spend[/b] {usd(st.spend)} (${st.cost_per_hour:,.2f}/h)"
    if s is None:
        three, four = f"{spend}  on-demand -", "checkpoint-restart -"
    else:
        # savings only for work done: none before the ring trained, none for a lost job
        claim = (p.get("samples_done") or 0) > 0 and p.get("outcome") != "lost"
        three = (f"{spend}  on-demand {usd(s.on_demand_usd)} [b]saved "
                 f"{pct(s.vs_on_demand if claim else None)}[/b]")
        four = (f"checkpoint-restart on the same spot fleet {usd(s.checkpoint_restart_usd)} "
                f"[b]saved {pct(s.vs_checkpoint_restart if claim else None)}[/b]")
    lines = [_line(one), _line(two), _line(three), _line(four)]
    job = st.job_metrics or {}
    if job.get("values"):  # everything evaluate returned, and when
        lines.append(_line(f"[b]job[/b] {metrics_text(job['values'])}  (step {job.get('step')}"
                           f", {_h(float(job.get('t') or t0), t0).strip()})"))
    return lines


def workers_table(st: Status, rows: int) -> Table:
    """The live instances, at most ``rows`` lines of them (the last one says how many more)."""
    t = Table(box=None, padding=(0, 1), pad_edge=False, expand=False, show_edge=False)
    t.add_column("worker", no_wrap=True, overflow="ellipsis")
    t.add_column("offering", no_wrap=True, overflow="ellipsis")
    t.add_column("state", no_wrap=True)
    t.add_column("samples/s", justify="right", no_wrap=True)
    t.add_column("$/h", justify="right", no_wrap=True)
    style = {"booting": "yellow", "joining": "yellow", "draining": "red", "active": "green"}
    items = list(st.instances)
    shown = items if len(items) <= rows else items[: max(0, rows - 1)]
    for w in shown:
        t.add_row(w.id, short_offering(w.offering), Text(w.phase, style=style.get(w.phase, "")),
                  "-" if w.samples_per_s is None else f"{w.samples_per_s:,.0f}",
                  "-" if w.price is None else f"{w.price:.3f}")
    if len(shown) < len(items):
        t.add_row(Text(f"... {len(items) - len(shown)} more", style="dim"), "", "", "", "")
    if not items:
        gone = st.progress.get("finished")
        t.add_row(Text("(none left: the job is over)" if gone else "(none yet)", style="dim"),
                  "", "", "", "")
    return t


def market_table(st: Status) -> Table:
    """Every spot offering: held there, price, on-demand price."""
    t = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False)
    t.add_column("offering", no_wrap=True, overflow="ellipsis")
    t.add_column("held", justify="right", no_wrap=True)
    t.add_column("spot $/h", justify="right", no_wrap=True)
    t.add_column("on-demand $/h", justify="right", no_wrap=True)
    keys = sorted(set(st.fleet) | {k for k in st.prices if k.endswith("/spot")})
    for k in keys:
        n = st.fleet.get(k, 0)
        od = st.prices.get(k.rsplit("/", 1)[0] + "/on-demand")
        price = st.prices.get(k)
        t.add_row(Text(short_offering(k), style="bold" if n else "dim"), str(n) if n else "",
                  "-" if price is None else f"{price:.4f}", "-" if od is None else f"{od:.2f}")
    return t


def event_lines(st: Status, t0: float, rows: int) -> list[Text]:
    """The newest ``rows`` events in words, oldest first."""
    if rows <= 0:
        return []
    events = [e for e in st.events if e.kind not in QUIET_EVENTS][-rows:]
    out = []
    for e in events:
        t = Text.assemble((_h(e.t, t0), "dim"), "  ", describe(e))
        t.no_wrap, t.overflow = True, "ellipsis"
        out.append(t)
    return out


def render(st: Status, t0: float, *, width: int = 80, height: int = 24,
           title: str = "spotring") -> Any:
    """A rich renderable of one status that fits ``width`` x ``height`` (see the module
    docstring)."""
    wide = width >= WIDE[0] and height >= WIDE[1]
    head = head_lines(st, t0)
    budget = max(0, height - 2 - len(head))  # the panel's top and bottom borders
    n_workers = min(max(1, len(st.instances)), max(1, budget // 3))
    market = market_table(st) if wide else None
    market_rows = (len(market.rows) + 2) if market is not None else 0
    block = max(n_workers + 2, market_rows)  # a title line and a header line
    workers = workers_table(st, n_workers)
    title_w = _line("[b]workers[/b] (booting: launched, not in the ring yet)")
    if market is not None:
        grid = Table.grid(padding=(0, 4))
        grid.add_column()
        grid.add_column()
        grid.add_row(Group(title_w, workers),
                     Group(_line("[b]market[/b] (spot offerings)"), market))
        middle: list[Any] = [grid]
    else:
        middle = [title_w, workers]
    rows_left = budget - block - 1  # the events' title
    events = event_lines(st, t0, rows_left)
    parts: list[Any] = [*head, *middle]
    if rows_left > 0:
        parts += [_line("[b]events[/b]"), *events]
    return Panel(Group(*parts), title=title, padding=(0, 1), width=width)
