"""Benchmark: how much of a slow dataset's read time a member still waits for (issue 14, item 6).

Design. A dataset on a slow disk (every ``dataset[i]`` sleeps ``--read-ms``, default 2 ms,
then builds a ``--shape`` float tensor and a ``(1,)`` target) is read in batches of
``--batch`` (32) by a consumer that computes ``--compute-ms`` (50) per step (a sleep, or with
``--busy`` real CPU work that competes with the workers). Five ways, in the same run, over the
same ``--steps`` batches of a seeded random order:

- ``sync``: the trainer before :mod:`trainer.data` (``Job.batch``): read and collate in the
  step; the baseline;
- ``dataloader``: a plain ``torch.utils.data.DataLoader`` with the same workers and prefetch,
  given the whole order up front (collating in its workers): what prefetching can do at best;
- ``feed``: :class:`trainer.data.Feed`, hinting the next batch at the start of each step, as
  the ring's loop does; ``feed_no_hint``: no hints (the workers only read a batch in
  parallel); ``feed_wrong_hint``: every hint names other samples (the worst case of a
  re-split).

Figures (one JSON line): ``wait_ratio``: the time ``feed`` waits for its batches over the
time ``sync`` spends reading them (goal: a small fraction; the test asserts < 0.5);
``wait_ratio_no_hint``, ``wait_ratio_wrong_hint``, ``wait_ratio_dataloader`` likewise;
``wait_ms_per_step_<way>``; ``step_rate_ratio``: steps/s of ``feed`` over ``sync``;
``main_cpu_ms_per_step_<way>``: CPU time of the consumer's process per step (its threads
included: for ``feed`` the feeder thread unpacking samples and the collate), which shows what
the transport costs beside a DataLoader that collates in its workers; ``noops_per_request``:
empty requests the feed handed its DataLoader per real one (bounded by ``prefetch * workers``:
they keep a delivering DataLoader moving and must not spin). Small defaults finish in
about 15 s on 2 cores; ``--shape 3x224x224`` measures image-sized samples.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.data.feed import Feed  # noqa: E402

log = logging.getLogger("benchmarks.input_pipeline")


class SlowDisk(Dataset):
    """Every read sleeps ``read_ms`` (a disk), then builds the sample."""

    def __init__(self, n: int, read_ms: float, shape: tuple[int, ...]) -> None:
        self.n, self.read_s, self.shape = n, read_ms / 1000, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_s)
        return torch.full(self.shape, float(i)), torch.tensor([float(i)])


def compute(seconds: float, busy: bool) -> None:
    """The step's forward/backward: a sleep, or real CPU work for ``seconds``."""
    if not busy:
        time.sleep(seconds)
        return
    a = torch.randn(128, 128)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def run(way: str, ds: SlowDisk, batches: list[list[int]], args: argparse.Namespace) -> dict:
    """Walk ``batches`` one way; the time spent waiting for batches, the wall and CPU time."""
    step_s = args.compute_ms / 1000
    waited = 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    if way == "sync":
        for ids in batches:
            t = time.perf_counter()
            default_collate([ds[i] for i in ids])
            waited += time.perf_counter() - t
            compute(step_s, args.busy)
    elif way == "dataloader":
        dl = DataLoader(ds, batch_sampler=batches, num_workers=args.workers,
                        prefetch_factor=args.prefetch)
        it = iter(dl)
        compute(step_s, args.busy)  # the same head start the Feed's first hint gets
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in batches:
            t = time.perf_counter()
            next(it)
            waited += time.perf_counter() - t
            compute(step_s, args.busy)
        del it
    else:
        rng = random.Random(1)
        with Feed(ds, workers=args.workers, prefetch=args.prefetch) as feed:
            if way != "feed_no_hint":
                feed.hint(batches[0])  # a joiner warms up before its first step
            compute(step_s, args.busy)
            c0, t0 = time.process_time(), time.perf_counter()
            for k, ids in enumerate(batches):
                t = time.perf_counter()
                feed.batch(ids)
                waited += time.perf_counter() - t
                if way == "feed" and k + 1 < len(batches):
                    feed.hint(batches[k + 1])
                elif way == "feed_wrong_hint":
                    feed.hint(rng.sample(range(ds.n), len(ids)))
                compute(step_s, args.busy)
            real, noops = feed._loader.sent  # internal counters: no-ops must not spin
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            return {"waited_s": waited, "wall_s": wall, "cpu_s": cpu,
                    "noops_per_request": noops / max(1, real)}
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {"waited_s": waited, "wall_s": wall, "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--read-ms", type=float, default=2.0, help="sleep per dataset[i]")
    ap.add_argument("--compute-ms", type=float, default=50.0, help="per step")
    ap.add_argument("--busy", action="store_true", help="compute with the CPU, not a sleep")
    ap.add_argument("--shape", default="3x32x32", help="each sample's input tensor")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    shape = tuple(int(d) for d in args.shape.split("x"))
    n = max(4096, args.steps * args.batch)
    ds = SlowDisk(n, args.read_ms, shape)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed)).tolist()
    batches = [order[k * args.batch:(k + 1) * args.batch] for k in range(args.steps)]
    res = {}
    for way in ("sync", "dataloader", "feed", "feed_no_hint", "feed_wrong_hint"):
        res[way] = run(way, ds, batches, args)
        log.info("%s: %s", way, {k: round(v, 3) for k, v in res[way].items()})
    sync = res["sync"]["waited_s"]
    out: dict = {
        "steps": args.steps, "batch": args.batch, "read_ms": args.read_ms,
        "compute_ms": args.compute_ms, "busy": args.busy, "shape": args.shape,
        "workers": args.workers, "prefetch": args.prefetch,
        "wait_ratio": round(res["feed"]["waited_s"] / sync, 4),
        "wait_ratio_no_hint": round(res["feed_no_hint"]["waited_s"] / sync, 4),
        "wait_ratio_wrong_hint": round(res["feed_wrong_hint"]["waited_s"] / sync, 4),
        "wait_ratio_dataloader": round(res["dataloader"]["waited_s"] / sync, 4),
        "step_rate_ratio": round(res["sync"]["wall_s"] / res["feed"]["wall_s"], 3),
        "noops_per_request": round(res["feed"]["noops_per_request"], 2),
        "goal_wait_ratio": 0.5,
    }
    for way, r in res.items():
        out[f"wait_ms_per_step_{way}"] = round(r["waited_s"] / args.steps * 1000, 2)
        out[f"main_cpu_ms_per_step_{way}"] = round(r["cpu_s"] / args.steps * 1000, 2)
    print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
