"""What ``provision run`` shows in its terminal: the live dashboard or a progress line, the
notes of the start, and the lines of the end.

Design: the run itself (:class:`provisioner.daemon.run.session.RunSession`) never prints; it
calls an observer. :class:`Terminal` is the command's: on a terminal it keeps a
``rich.live.Live`` of :func:`provisioner.daemon.view.dashboard.render` sized to the terminal
as it is now (log lines written meanwhile go above the frame, through Live's stderr proxy:
straight to the terminal they tore it); otherwise (``--no-dashboard``, a pipe, a detached
run's log) one line every :data:`LINE_EVERY_S`. :func:`end_lines` turns the run's result into
the lines the command prints last.

Rule: only ``provision run`` uses this module; everything printed while a run goes on passes
through it.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable

from provisioner.daemon.run.session import RunResult
from provisioner.daemon.view.status import Status, metrics_text

#: Real seconds between two progress lines without the dashboard.
LINE_EVERY_S = 5.0


class Terminal:
    """The command's :class:`~provisioner.daemon.run.session.Observer`."""

    def __init__(self, dashboard: bool) -> None:
        self.dashboard = dashboard and sys.stdout.isatty()
        self._live: Any = None
        self._handlers: list[tuple[logging.StreamHandler, Any]] = []
        self._last_line = 0.0

    def note(self, line: str) -> None:
        print(line, flush=True)

    def watch(self, status: Callable[[int], Status], t0: float) -> None:
        if self.dashboard:
            if self._live is None:
                from rich.live import Live

                self._live = Live(self._frame(status, t0), refresh_per_second=4,
                                  transient=False, vertical_overflow="crop")
                self._live.start()
                self._handlers = _log_streams_to(sys.stderr)
            else:
                self._live.update(self._frame(status, t0))
        elif time.monotonic() - self._last_line > LINE_EVERY_S:
            self._last_line = time.monotonic()
            print(progress_line(status(0), t0), flush=True)

    def closing(self, status: Callable[[int], Status], t0: float) -> None:
        if self._live is None:
            return
        try:  # the last frame left on the screen is the end, not a frame before it
            self._live.update(self._frame(status, t0))
        finally:
            self._live.stop()
            self._live = None
            for h, stream in self._handlers:
                h.setStream(stream)

    def _frame(self, status: Callable[[int], Status], t0: float) -> Any:
        """The dashboard sized to the terminal as it is now (it may have been resized)."""
        from rich.console import Console

        from provisioner.daemon.view.dashboard import render

        size = (self._live.console if self._live is not None else Console()).size
        # one line short of the terminal: a frame of its full height scrolls the screen by
        # one each time the cursor ends below it, leaving torn frames above
        return render(status(60), t0, width=size.width, height=max(8, size.height - 1))


def progress_line(st: Status, t0: float) -> str:
    """One line of progress (the run's hours, fleet, cost, epoch, the job's metrics)."""
    values = (st.job_metrics or {}).get("values") or st.progress.get("metrics") or {}
    return (f"[{(st.now.timestamp() - t0) / 3600:6.2f} h] fleet {sum(st.fleet.values())} "
            f"(+{st.draining} draining), ${st.cost_per_hour:.3f}/h, spend ${st.spend:.4f}, "
            f"epoch {st.progress.get('epoch', 0)}"
            + (f", {metrics_text(values)}" if values else "")
            + ("; disk full: writes paused" if st.paused_since is not None else ""))


def end_lines(result: RunResult) -> tuple[list[str], str | None]:
    """The lines for stdout at the end of a run, and the one for stderr (None when the run
    succeeded). Savings are claimed only for work done."""
    v, fig = result.verdict, result.figures
    values = (fig.get("job_metrics") or {}).get("values") or {}
    if not values and fig.get("accuracy") is not None:
        values = {"accuracy": fig["accuracy"]}
    out = [f"stopped: {v.reason}. spend ${fig['spend_usd']:.4f} for {fig['samples']:,} "
           f"samples (${fig['cost_per_1m_samples_usd'] or 0:.4f} per 1M)"
           + (f", {metrics_text(values)}" if values else "")
           + f", steps lost {fig['steps_lost']} (${fig['money_lost_usd']:.4f}), "
           f"{fig['notices']} notices, {fig['kills']} kills, {fig['joins']} joins"]
    if fig.get("outcome") == "lost":
        out.append("no savings claimed: the job was lost")
    elif not fig.get("samples"):
        out.append("no savings claimed: the run trained nothing")
    else:
        out.append(f"against on-demand ${fig['on_demand_usd']:.4f}: saved "
                   f"{_pct(fig['saved_vs_on_demand_pct'])}; against checkpoint-restart on "
                   f"the same spot fleet ${fig['checkpoint_restart_usd']:.4f}: saved "
                   f"{_pct(fig['saved_vs_checkpoint_restart_pct'])} (docs/daemon.md, "
                   f"\"Savings\")")
    out.append(f"report: {result.report}" if result.report is not None else
               "report: not written (the disk was full); `provision status` shows the run")
    if result.model is not None:
        out.append(f"trained model: {result.model} (a state_dict: torch.load reads it)")
    return out, (f"provision run: error: {v.failure}" if v.failure else None)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0f}%"


def _log_streams_to(stream: Any) -> list[tuple[logging.StreamHandler, Any]]:
    """Point every terminal log handler (root's, writing to the process's stdout or stderr)
    at ``stream``; returns (handler, its former stream) to put back."""
    out = []
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) \
                and h.stream in (sys.__stderr__, sys.__stdout__):
            out.append((h, h.setStream(stream)))
    return out
