"""Benchmark: hybrid aggregation against the synchronous ring across zones (issue 20).

Design. Zones for real (``tests/fakes/netns.Zones``): ``--zones`` network namespaces
(default 2), each with ``--per-zone`` workers (2) that all-reduce inside it; the zones are
joined by a bridge whose links ``tc tbf`` limits to ``--rate`` in both directions (the slow
cross-zone link; ``none``: unshaped); the coordinator runs here, listening on zone 0's
gateway only. One worker (the last of the last zone) is ``--straggler`` times slower
(``--slowdown``, the ring tests' sleeps). The same job, examples/digits.py (``--epochs``,
the CNN, global batch 64), then trains twice on the same workers and link, in the same run:

* **ring**: the synchronous ring (``Job.mode = "ring"``), ranks ordered zone by zone, so its
  all-reduce crosses the zone boundary twice per step, the fewest a ring can;
* **hybrid**: ``Job.mode = "hybrid"`` with ``--staleness`` (default: the mode's default).

This file is also the job both runs load (``make_job`` below: the digits job in the mode
``HYBRID_BENCH_MODE`` says). Figures (one JSON line on stdout):

* ``straggler_speedup``: hybrid samples/s over the ring's, each its rank 0's steady rate
  from its 5th applied update to its last (evaluations included in both). Goal >= 1.3.
* ``accuracy_gap``: the ring's final test accuracy minus the hybrid's, both after every
  sample of every epoch once (equal samples). Goal <= 0.01.
* ``cross_zone_bytes_ratio``: bytes that left the zones over the data link during the hybrid
  run over those of the ring run (the kernel's counters; the whole runs, the first state
  transfer included in both). Goal <= 0.5.
* ``ps_load_imbalance``: the largest parameter-server shard's bytes over the mean (what the
  shard hosts counted). Goal <= 1.10. ``ps_load_imbalance_whole_layers``: the same for the
  layers dealt to the shards in turn (computed from the sizes), what placement by size
  avoids.
* Also: each run's ``samples_per_s``, ``accuracy``, ``cross_zone_mb``, ``elapsed_s``; the
  hybrid's ``updates_per_zone``, ``staleness`` (a histogram) and ``shard_mb``; ``rate``,
  ``straggler``, ``load`` (1-minute load average at the start and the end).

Needs root (network namespaces); prints ``{"error": ...}`` and exits 2 where they cannot
be made. Runtime at the defaults: about 1-2 minutes on 2 CPU cores.

Rule: figures are ratios within one run; run alone (a loaded machine inflates the noise).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import (PYTHON, emit, read_jsonl, setup_logging, spawn,  # noqa: E402
                                steady_rate, steps_by_number, stop, wait_for)


def make_job(seed: int) -> Any:
    """The digits job (examples/digits.py) in the mode the benchmark runs."""
    from trainer.hybrid import HybridSettings

    spec = importlib.util.spec_from_file_location("spotring_bench_digits",
                                                  REPO / "examples" / "digits.py")
    assert spec is not None and spec.loader is not None
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    job = digits.make_job(seed)
    job.mode = os.environ.get("HYBRID_BENCH_MODE", "hybrid")
    s = os.environ.get("HYBRID_BENCH_STALENESS", "")
    job.hybrid = HybridSettings(staleness=int(s)) if s else HybridSettings()
    return job


def run_mode(mode: str, zones: Any, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Train the job once in ``mode`` over ``zones``; returns what was measured."""
    from trainer.control.coordinator import Coordinator

    out_dir = workdir / mode
    out_dir.mkdir(parents=True, exist_ok=True)
    token = os.urandom(16).hex().encode()
    token_file = out_dir / "token"
    token_file.write_bytes(token)
    token_file.chmod(0o600)
    n = args.zones * args.per_zone
    coord = Coordinator(zones.gateway, 0, token, initial_world=n)
    coord.start()
    env = {"DIGITS_EPOCHS": str(args.epochs), "HYBRID_BENCH_MODE": mode,
           "HYBRID_BENCH_STALENESS": "" if args.staleness is None else str(args.staleness)}
    procs = []
    names = []
    before = zones.data_bytes()
    t0 = time.monotonic()
    try:
        for z in range(args.zones):
            for k in range(args.per_zone):
                name = f"z{z}w{k}"
                slow = args.straggler if (z, k) == (args.zones - 1, args.per_zone - 1) else 1.0
                argv = zones.argv(z, [
                    PYTHON, "-m", "trainer", "--log-level", "WARNING", "worker",
                    "--coordinator", f"{zones.gateway}:{coord.address[1]}",
                    "--token-file", str(token_file), "--job", str(Path(__file__).resolve()),
                    "--name", name, "--zone", f"zone{z}", "--ring-host", zones.data_addr(z),
                    "--slowdown", str(slow), "--metrics-file", str(out_dir / f"{name}.jsonl")])
                procs.append(spawn(argv, out_dir / f"{name}.log", env))
                names.append(name)
                # ranks follow the start order: zone by zone, the ring's best order
                wait_for(lambda name=name: any(m.name == name for m in coord.members()),
                         args.timeout, f"{mode}: {name} admitted")
        wait_for(lambda: coord.stats().get("finished"), args.timeout, f"{mode}: the job")
        elapsed = time.monotonic() - t0
        stats = coord.stats()
        if stats.get("outcome") != "done":
            raise RuntimeError(f"{mode}: the job ended {stats.get('outcome')}: "
                               f"{stats.get('failure')}")
    finally:
        stop(procs, grace=10.0)
        coord.stop()
    metrics = {name: read_jsonl(out_dir / f"{name}.jsonl") for name in names}
    rank0 = steps_by_number(metrics[names[0]])
    res: dict[str, Any] = {
        "samples_per_s": round(steady_rate(rank0, skip=5), 1),
        "accuracy": round(float(stats["metrics"].get("accuracy", 0.0)), 4),
        "cross_zone_mb": round((zones.data_bytes() - before) / 1e6, 3),
        "elapsed_s": round(elapsed, 1), "updates": int(stats["step"]),
    }
    if mode == "hybrid":
        own = [r for recs in metrics.values() for r in recs if r.get("own")]
        leaders = {name: recs for name, recs in metrics.items() if name.endswith("w0")}
        res["updates_per_zone"] = {f"zone{z}": len({r["step"] for r in own if r["zone"] == z})
                                   for z in range(args.zones)}
        res["staleness"] = dict(sorted(Counter(r["staleness"] for r in rank0.values()).items()))
        shards: dict[str, int] = {}
        for recs in leaders.values():
            for r in recs:
                shards.update(r.get("ps_bytes", {}))
        res["shard_mb"] = {k: round(v / 1e6, 3) for k, v in sorted(shards.items())}
    return res


def whole_layers_imbalance(shards: int) -> float:
    """The shards' imbalance with the update's items dealt to them in turn (no sizes)."""
    from trainer.hybrid.update import UpdateLayout

    items = UpdateLayout(make_job(0).model).items()
    loads = [0] * shards
    for i, n in enumerate(items):
        loads[i % shards] += n
    return max(loads) * shards / sum(loads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zones", type=int, default=2)
    ap.add_argument("--per-zone", type=int, default=2, help="workers per zone")
    ap.add_argument("--rate", default="50mbit", help="the cross-zone link (tc tbf), or none")
    ap.add_argument("--straggler", type=float, default=3.0,
                    help="slowdown of the last worker of the last zone")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--staleness", type=int, default=None,
                    help="the hybrid's bound (default: the mode's default)")
    ap.add_argument("--modes", default="ring,hybrid")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    from tests.fakes.netns import NetnsUnavailable, Zones

    try:
        zones = Zones.create("srbh", args.zones, base=90,
                             rate=None if args.rate == "none" else args.rate)
    except NetnsUnavailable as e:
        emit({"benchmark": "hybrid", "error": f"zones need network namespaces: {e}"})
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotring-hybrid-"))
    out: dict[str, Any] = {"benchmark": "hybrid", "rate": args.rate, "zones": args.zones,
                           "per_zone": args.per_zone, "straggler": args.straggler,
                           "epochs": args.epochs, "load": [round(os.getloadavg()[0], 2)]}
    try:
        for mode in args.modes.split(","):
            out[mode] = run_mode(mode, zones, args, workdir)
    finally:
        zones.destroy()
    out["load"].append(round(os.getloadavg()[0], 2))
    ring, hyb = out.get("ring"), out.get("hybrid")
    if ring and hyb:
        out["straggler_speedup"] = round(hyb["samples_per_s"] / ring["samples_per_s"], 3)
        out["accuracy_gap"] = round(ring["accuracy"] - hyb["accuracy"], 4)
        out["cross_zone_bytes_ratio"] = (round(hyb["cross_zone_mb"] / ring["cross_zone_mb"], 3)
                                         if ring["cross_zone_mb"] else None)  # one zone: 0/0
    if hyb and sum(hyb.get("shard_mb", {}).values()):  # one zone: no network, no figure
        loads = list(hyb["shard_mb"].values())
        out["ps_load_imbalance"] = round(max(loads) * len(loads) / sum(loads), 4)
        out["ps_load_imbalance_whole_layers"] = round(whole_layers_imbalance(len(loads)), 3)
    emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
