"""``provision status`` and ``provision list`` as text that fits the terminal.

Design: pure functions from the plain data the commands already have (a state's
:func:`~provisioner.daemon.view.status.summary`, the rows of the runs on this machine) to
lines no wider than ``width``: at 80 columns every line fits (what a person must type, a run
or an instance id, comes first and is never cut; what follows is cut with an ellipsis, a
path from its left); a wider terminal gets the rest (the job, full times, longer events).

Rule: callers pass the terminal's width (``shutil.get_terminal_size``); nothing here reads a
file or the clock except ``now`` where given.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from provisioner.daemon.view.status import metrics_text

#: From this many columns the tables add what an 80-column one leaves out.
WIDE = 120


def cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def cut_left(text: str, width: int) -> str:
    """``text`` cut from its left (a path keeps its end), an ellipsis marking the cut."""
    return text if len(text) <= width else "…" + text[len(text) - max(0, width - 1):]


def money(x: Any) -> str:
    return "-" if not isinstance(x, (int, float)) else f"${x:,.4f}" if abs(x) < 100 \
        else f"${x:,.2f}"


def age(iso: str | None, now: datetime | None = None) -> str:
    """``12m``, ``3h``, ``2d``: how long ago ``iso`` (an ISO time) was."""
    if not iso:
        return "-"
    try:
        then = datetime.fromisoformat(iso)
    except ValueError:
        return "-"
    s = ((now or datetime.now(timezone.utc)) - then).total_seconds()
    for unit, div in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= div:
            return f"{int(s // div)}{unit}"
    return f"{max(0, int(s))}s"


def progress_text(ring: Mapping[str, Any], total_epochs: int | None = None,
                  limit: int | None = 2) -> str:
    """``epoch 12/30, step 340, accuracy 0.981``: the ring's progress and the job's metrics
    (what ``evaluate`` returned; at most ``limit`` of them) in words."""
    if not ring:
        return "no ring yet"
    epoch = ring.get("epoch")
    parts = [f"epoch {epoch if epoch is not None else 0}"
             + (f"/{total_epochs}" if total_epochs else ""),
             f"step {ring.get('step') or 0}"]
    values = ring.get("metrics") or ({"accuracy": ring["accuracy"]}
                                     if ring.get("accuracy") is not None else {})
    if values:
        parts.append(metrics_text(values, limit))
    return ", ".join(parts)


def status_lines(doc: Mapping[str, Any], width: int) -> list[str]:
    """``provision status``: the run, its money and progress, its fleet, its events."""
    job = doc.get("job") or {}
    run = doc.get("name") or doc.get("run_id") or "-"
    head = f"{run}: job {job.get('id', '?')} on {job.get('driver', '?')}"
    if doc.get("name") and doc.get("run_id") and width >= WIDE:
        head += f" (run {doc['run_id']})"
    ended = doc.get("outcome")
    state = (f"ended: {doc.get('outcome_text') or ended}"
             + (", fleet kept (provision down)" if doc.get("fleet_kept") else "")
             if doc.get("finished") else "running")
    lines = [head, f"  {doc.get('hours', 0):.2f} h, spend {money(doc.get('spend_usd'))}, "
                   f"{state}"]
    ring = doc.get("ring") or {}
    if ring:
        lines.append(f"  {progress_text(ring, doc.get('total_epochs'))}, world "
                     f"{ring.get('world') or 0}, steps lost {ring.get('steps_lost') or 0}")
    job = doc.get("job_metrics")
    if job:
        lines.append(f"  job: {metrics_text(job['values'])} (at step {job.get('step')}, "
                     f"epoch {job.get('epoch')}, {job.get('hours', 0):.2f} h)")
    fleet = doc.get("fleet") or []
    lines.append(f"fleet ({len(fleet)})")
    idw = max([len(r["id"]) for r in fleet] + [2])
    for r in fleet:
        lines.append(f"  {r['id']:<{idw}}  {r.get('where') or r['offering']:<22}  "
                     f"{r['state']:<9} {r['hours']:6.2f} h")
    failed = doc.get("failed_boots") or []
    if failed:
        lines.append(f"failed boots ({len(failed)})")
        for f in failed:
            lines.append(f"  {f['hours']:7.3f} h  {f['instance'] or '-'} {f['kind']}: "
                         f"{f['what']}")
            if f.get("last_error"):
                lines.append(f"             {f['last_error']}")
    events = doc.get("events") or []
    if events:
        lines.append(f"events (last {len(events)})")
        for e in events:
            lines.append(f"  {e['hours']:7.3f} h  {e.get('text') or e['kind']}")
    return [cut(ln, width) for ln in lines]


def runs_lines(rows: Sequence[Mapping[str, Any]], width: int,
               now: datetime | None = None) -> list[str]:
    """``provision list``: one line per run (its name or id first, whole), then its pid, age,
    progress and work directory (cut to fit); a wide terminal adds the job."""
    if not rows:
        return []
    names = [str(r.get("name") or r["run"]) for r in rows]
    nw = max(len(n) for n in names + ["RUN"])
    wide = width >= WIDE
    header = f"{'RUN':<{nw}}  {'PID':>7}  {'AGE':>4}  "
    fixed = len(header)
    rest = max(20, width - fixed)
    prog_w = rest * 3 // 5
    path_w = rest - prog_w - 2
    if wide:
        job_w = 24
        prog_w = min(prog_w, 48)
        path_w = width - fixed - prog_w - job_w - 4
    out = [header + f"{'PROGRESS':<{prog_w}}  " + (f"{'JOB':<{job_w}}  " if wide else "")
           + "WORKDIR"]
    for name, r in zip(names, rows):
        prog = progress_text({k: r.get(k) for k in ("epoch", "step", "accuracy", "metrics")}
                             if r.get("step") is not None else {})
        prog += f"; fleet {r.get('fleet') or 0}, {money(r.get('spend_usd'))}"
        line = (f"{name:<{nw}}  {r['pid']:>7}  {age(r.get('started'), now):>4}  "
                f"{cut(prog, prog_w):<{prog_w}}  ")
        if wide:
            job = str(r.get("job") or "").rsplit("/", 1)[-1]
            line += f"{cut(job, job_w):<{job_w}}  "
        line += cut_left(str(r.get("workdir") or ""), max(8, path_w))
        out.append(line)
    return [cut(ln, width) for ln in out]
