"""Generic matplotlib helpers: named series in, one PNG out.

Design: no knowledge of policies or the daemon; the simulator's report and the daemon's run
report both call :func:`lines`. The Agg backend is selected on import of matplotlib here,
so nothing ever opens a window. Rule: pass plain sequences of numbers; nothing is mutated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def lines(path: str | Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
          title: str, ylabel: str, xlabel: str = "hours", step: bool = True,
          logy: bool = False, max_legend: int = 12, xmax: float | None = None) -> Path:
    """Draw each named (x, y) series as a line (a step line when ``step``) and save a PNG.

    Returns the path written. Empty series are skipped; an all-empty input still writes a
    figure that says "no data". ``xmax`` crops the x axis (a long outlier run).
    """
    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    drawn = 0
    for name, (x, y) in series.items():
        if len(x) == 0:
            continue
        if step:
            ax.step(list(x), list(y), where="post", label=name, linewidth=1.2)
        else:
            ax.plot(list(x), list(y), label=name, linewidth=1.2)
        drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if xmax is not None and drawn:
        ax.set_xlim(left=0, right=xmax)
    if 0 < drawn <= max_legend:
        ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
