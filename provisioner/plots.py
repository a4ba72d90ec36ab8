"""Generic matplotlib helpers: named series in, one PNG out.

Design: no knowledge of policies or the daemon; the simulator's report and the daemon's run
report both call :func:`lines`; :func:`stacked_panels` draws a fleet by offering for
several runs, :func:`heatmap` many step functions at once (availability per zone). The Agg backend is selected on import of matplotlib here,
so nothing ever opens a window. Rule: pass plain sequences of numbers; nothing is mutated.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def lines(path: str | Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
          title: str, ylabel: str, xlabel: str = "hours", step: bool = True,
          logy: bool = False, max_legend: int = 12, xmax: float | None = None,
          zoom: float | None = None, dashed: Sequence[str] = ()) -> Path:
    """Draw each named (x, y) series as a line (a step line when ``step``) and save a PNG.

    Returns the path written. Empty series are skipped; an all-empty input still writes a
    figure that says "no data". ``xmax`` ends the x axis; ``zoom`` adds a second panel on
    [0, zoom] beside the whole span (short runs beside a long one); series named in
    ``dashed`` are drawn dashed (a bound over a run it would hide).
    """
    path = Path(path)
    two = zoom is not None and xmax is not None and zoom < 0.8 * xmax
    wide = sum(1 for x, _ in series.values() if len(x)) > 4
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=((11 if two else 8) + 2.5 * wide, 3.6),
                             dpi=100, squeeze=False)
    drawn = 0
    for k, ax in enumerate(axes[0]):
        drawn = 0
        for name, (x, y) in series.items():
            if len(x) == 0:
                continue
            style = "--" if name in dashed else "-"
            if step:
                ax.step(list(x), list(y), where="post", label=name, linewidth=1.2,
                        linestyle=style)
            else:
                ax.plot(list(x), list(y), label=name, linewidth=1.2, linestyle=style)
            drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title if k == 0 else f"the first {zoom:.3g} {xlabel}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        right = zoom if k == 1 else xmax
        if right is not None and drawn:
            ax.set_xlim(left=0, right=right)
        if k == 1 and drawn:
            ax.set_ylim(bottom=0, top=_top(series, zoom) * 1.05 or None)
        if 0 < drawn <= max_legend and k == len(axes[0]) - 1:
            if drawn > 4:  # beside the plot, where it hides no line
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                          borderaxespad=0.0)
            else:
                ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _top(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], right: float) -> float:
    """The largest y of every series with x <= ``right``."""
    return max([float(y) for xs, ys in series.values() for x, y in zip(xs, ys) if x <= right]
               + [0.0])


def stacked_panels(path: str | Path,
                   panels: Mapping[str, tuple[float, Mapping[str, tuple[Sequence[float],
                                                                        Sequence[float]]]]],
                   *, title: str, ylabel: str, xlabel: str = "hours") -> Path:
    """One panel per key of ``panels`` (a run): (the run's end, its series), each series a
    step area stacked on the ones before (an offering), over that run's own span; one
    legend, a name keeps its colour in every panel, names with "on-demand" are hatched.
    Returns the path written."""
    path = Path(path)
    names: list[str] = []
    for _, series in panels.values():
        names += [n for n in series if n not in names]
    colours = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
    rows = max(1, len(panels))
    legend_rows = 1 + (len(names) - 1) // 3 if names else 0
    fig, axes = plt.subplots(rows + 1, 1, figsize=(9, 0.9 + 1.6 * rows + 0.18 * legend_rows),
                             dpi=100, squeeze=False,
                             gridspec_kw={"height_ratios": [0.12 * legend_rows + 0.01] +
                                          [1.0] * rows})
    head = axes[0, 0]
    head.axis("off")
    for ax, (panel, (end, series)) in zip(axes[1:, 0], panels.items()):
        grid = sorted({float(x) for xs, _ in series.values() for x in xs} | {0.0, float(end)})
        if not series:
            ax.text(0.5, 0.5, "no instances", ha="center", va="center", transform=ax.transAxes)
        base = [0.0] * len(grid)
        for name, (xs, ys) in series.items():
            top = [b + _at(xs, ys, x) for b, x in zip(base, grid)]
            od = "on-demand" in name
            ax.fill_between(grid, base, top, step="post", facecolor=colours[name],
                            edgecolor="0.25" if od else colours[name], hatch="//" if od else None,
                            linewidth=0.0)
            base = top
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(panel, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0, right=max(float(end), 1e-3))
        ax.set_ylim(bottom=0)
    axes[-1, 0].set_xlabel(xlabel)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=colours[n], edgecolor="0.25",
                             hatch="//" if "on-demand" in n else None, linewidth=0.0)
               for n in names]
    if names:
        head.legend(handles, names, fontsize=7, loc="center", ncol=3, frameon=False)
    head.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def heatmap(path: str | Path, rows: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
            xmax: float, title: str, label: str, xlabel: str = "hours") -> Path:
    """One row per named step function (x, y), coloured by value, over [0, ``xmax``]:
    readable for many series (nine zones' availability) where lines overlap."""
    path = Path(path)
    names = list(rows)
    width = 800
    grid = [xmax * (i + 0.5) / width for i in range(width)]
    data = [[_at(xs, ys, x) for x in grid] for xs, ys in rows.values()] or [[0.0]]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.32 * max(1, len(names))), dpi=100)
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.8")  # NaN: not observed
    im = ax.imshow(np.ma.masked_invalid(np.array(data, dtype=float)), aspect="auto",
                   interpolation="nearest", cmap=cmap, extent=(0, xmax, len(names) - 0.5, -0.5))
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=label, fraction=0.03, pad=0.01)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The value of the step function (xs, ys) at ``x`` (0 before its first point)."""
    i = bisect.bisect_right(xs, x) - 1
    return float(ys[i]) if i >= 0 else 0.0
