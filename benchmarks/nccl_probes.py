"""Probes of NCCL's failure semantics and of the gradient memory at a switch, on one GPU.

Design. Each probe runs in a child process of its own (a watchdog may end it) and reports
plain facts, so the figures say what the real backend does rather than what the double
(tests/fakes/nccl.py) assumes:

* ``f1``: a collective held pending (on a GPU, behind a ``torch.cuda._sleep`` kernel on the
  compute stream; on the CPU, behind a peer thread that never posts) with the group's timeout
  at ``--group-timeout``: is its future done at enqueue, is ``is_completed()`` False, does
  :func:`trainer.collective.nccl.poll` give up at its deadline, and does the process outlive
  the group's timeout after ``abort()`` (``new_path_alive``)? The old path (a blocking wait)
  is run too: ``old_path_exit`` is the child's exit code (negative: killed by a signal).
* ``f3``: a store whose root holds ``exception_dump`` (what a failed NCCL generation of an
  earlier process left there); a fresh process forms its first NCCL group over a
  ``PrefixStore`` (the old way) and over the generation's ``NamespacedStore`` (now) and
  trains ``--probe-s`` seconds: did each survive?
* ``memory``: a Stepper's gradient buckets across a generation switch as the ring mode makes
  it (close the old stepper, build the new): ``switch_grad_copies`` is the peak of gradient
  memory at the switch over one copy (goal 1.0; 2.0 when the old buckets outlive the switch).

``--backend double`` runs every probe on the CPU with the NCCL double (what
``benchmarks/gpu.py --dry`` and CI run: the figures then check the probe's path, and the
double's semantics, not NCCL). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _setup(backend: str) -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if backend == "double":
        from tests.fakes.nccl import install

        install()
    import torch

    return torch


def _pending_pair(torch: Any, backend: str, store: Any, group_timeout: float) -> tuple[Any, Any]:
    """An NCCL group (world 1 on a GPU, 2 with a silent peer thread on the CPU) and a work
    held pending for longer than the group's timeout."""
    from trainer.collective import groups

    if backend == "double":
        world = 2
        peers: list[Any] = []

        def peer() -> None:  # takes part in the first collective, then never posts again
            peers.append(groups.make_nccl(store, 1, 2, group_timeout))
            peers[0].allreduce([torch.ones(1)]).wait()

        threading.Thread(target=peer, daemon=True).start()
    else:
        world = 1
    pg = groups.make_nccl(store, 0, world, group_timeout)
    dev = groups.nccl_device()
    t = torch.ones(1, device=dev)
    pg.allreduce([t]).wait()  # the communicator forms
    if dev.type == "cuda":
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch.cuda._sleep(int(1e8))
        torch.cuda.synchronize()
        per_s = 1e8 / (time.perf_counter() - start)
        torch.cuda._sleep(int(per_s * 3 * group_timeout))  # holds the collective behind it
    return pg, pg.allreduce([t])


def child_f1(backend: str, path: str, group_timeout: float) -> None:
    """One side of the f1 probe (prints one JSON line, or is killed)."""
    torch = _setup(backend)
    import torch.distributed as dist

    from trainer.collective import nccl
    from trainer.errors import GenerationBroken

    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3"
    pg, work = _pending_pair(torch, backend, dist.HashStore(), group_timeout)
    out: dict[str, Any] = {"future_done_at_enqueue": work.get_future().done(),
                           "completed_at_enqueue": work.is_completed()}
    if path == "old":
        print(json.dumps(out), flush=True)
        work.wait()
        torch.ones(1, device="cuda" if torch.cuda.is_available() else "cpu").cpu()
        time.sleep(3 * group_timeout)  # the watchdog ends the process before this
        out["old_path_alive"] = True
        print(json.dumps(out), flush=True)
        return
    t0 = time.perf_counter()
    try:
        nccl.poll(work, lambda: False, "probe", timeout_s=group_timeout / 4)
        out["poll"] = "completed"
    except GenerationBroken:
        out["poll"] = "broken"
    out["poll_s"] = round(time.perf_counter() - t0, 3)
    pg.abort()
    time.sleep(2 * group_timeout)  # past the group's timeout: the watchdog must stand down
    out["new_path_alive"] = True
    print(json.dumps(out), flush=True)


def child_f3(backend: str, port: int, how: str, probe_s: float) -> None:
    """A fresh process's first NCCL group over a store whose root holds a dump key."""
    torch = _setup(backend)
    import torch.distributed as dist

    from trainer.collective import groups, nccl

    os.environ.update({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_ENABLE_MONITORING": "1",
                       "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "5",
                       "TORCH_NCCL_COORD_CHECK_MILSEC": "200"})
    store = dist.TCPStore("127.0.0.1", port, None, False,
                          timeout=datetime.timedelta(seconds=30))
    where = (dist.PrefixStore("g2/", store) if how == "prefix"
             else nccl.NamespacedStore("g2/nccl/", store))
    pg = groups.make_nccl(where, 0, 1, 60.0)
    t = torch.ones(1, device=groups.nccl_device())
    end = time.monotonic() + probe_s
    while time.monotonic() < end:
        pg.allreduce([t]).wait()
        time.sleep(0.1)
    print(json.dumps({"alive": True}), flush=True)


LOGS: list[Path] = []  # where each child's stderr goes (--workdir), else nowhere


def _run(argv: list[str], timeout: float, name: str) -> tuple[int, dict[str, Any]]:
    """Run one probe child; its exit code (124: timed out) and its last JSON line. Its stderr
    goes to ``<workdir>/<name>.log`` (the first H200 run's probes timed out and left
    nothing to read)."""
    from _common import child_env

    env = child_env({"OMP_NUM_THREADS": "1"})
    err = open(LOGS[0] / f"{name}.log", "wb") if LOGS else subprocess.DEVNULL
    try:
        p = subprocess.run([sys.executable, __file__, *argv], stdout=subprocess.PIPE,
                           stderr=err, env=env, cwd=str(REPO), timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[nccl_probes] {name}: timed out after {timeout:.0f}s",
              file=sys.stderr, flush=True)
        return 124, {}
    finally:
        if LOGS:
            err.close()
    lines = [ln for ln in p.stdout.decode(errors="replace").splitlines() if ln.startswith("{")]
    print(f"[nccl_probes] {name}: exit {p.returncode} {lines[-1:] or ''}",
          file=sys.stderr, flush=True)
    return p.returncode, (json.loads(lines[-1]) if lines else {})


def probe_f1(backend: str, group_timeout: float) -> dict[str, Any]:
    limit = 180 + 4 * group_timeout  # a loaded CPU may take a minute to import torch
    code_new, new = _run(["child-f1", backend, "new", str(group_timeout)], limit, "f1-new")
    code_old, old = _run(["child-f1", backend, "old", str(group_timeout)], limit, "f1-old")
    return {**new, "new_path_exit": code_new, "old_path_exit": code_old,
            "old_path_alive": bool(old.get("old_path_alive")),
            "group_timeout_s": group_timeout}


def probe_f3(backend: str, probe_s: float) -> dict[str, Any]:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    from _common import free_port

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    store.set("exception_dump", "0")  # a failed generation of an earlier process left it
    out: dict[str, Any] = {"probe_s": probe_s}
    for how in ("prefix", "namespaced"):
        code, got = _run(["child-f3", backend, str(port), how, str(probe_s)], 180 + 2 * probe_s,
                         f"f3-{how}")
        out[f"{how}_alive"] = bool(got.get("alive")) and code == 0
        out[f"{how}_exit"] = code
    return out


def probe_memory(backend: str, tiny: bool) -> dict[str, Any]:
    torch = _setup(backend)
    import torch.distributed as dist

    from trainer.collective import groups
    from trainer.collective.step import Stepper
    from trainer.job import load_job

    if tiny:
        os.environ["BENCH_TINY"] = "1"
    else:
        os.environ.pop("BENCH_TINY", None)
    os.environ.setdefault("BENCH_SAMPLES", "64")
    job = load_job(str(HERE / "jobs" / "resnet.py"), 0)
    dev = groups.nccl_device()
    job.model.to(dev)
    x, y = job.train_set.tensors[0][:4].to(dev), job.train_set.tensors[1][:4].to(dev)

    def stepper() -> Stepper:
        return Stepper(job.model, job.optimizer, job.loss_fn, world=1, rank=0, device=dev)

    group = groups.form_group(dist.HashStore(), 1, 0, 1, 60.0, lambda: False, backend="nccl")
    old = stepper()
    old.step(group.pg, (x, y), 4, 4, step=0, latest=0, eval_s=0.0, should_abort=lambda: False,
             watch=group.watch())
    grad = old.reducer.nbytes
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    old.close()  # what RingMode.prepare does: the old buckets go first
    left = old.reducer.nbytes
    old = None
    new = stepper()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        copies = (peak - (before - grad)) / grad
    else:
        copies = (left + new.reducer.nbytes) / grad
    new.close()
    group.abort()
    params = sum(p.numel() * p.element_size() for p in job.model.parameters())
    return {"grad_bytes": grad, "param_bytes": params, "switch_grad_copies": round(copies, 3)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("child-f1", "child-f3"):
        if argv[0] == "child-f1":
            child_f1(argv[1], argv[2], float(argv[3]))
        else:
            child_f3(argv[1], int(argv[2]), argv[3], float(argv[4]))
        sys.stdout.flush()
        os._exit(0)  # an aborted group's threads may hold a pending collective: no teardown
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("nccl", "double"), default="nccl")
    ap.add_argument("--group-timeout", type=float, default=4.0)
    ap.add_argument("--probe-s", type=float, default=20.0)
    ap.add_argument("--tiny", action="store_true", help="a small model for the memory probe")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where each probe child's stderr is kept (default: not kept)")
    args = ap.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        LOGS.append(args.workdir)
    t0 = time.monotonic()
    out = {"backend": args.backend,
           "f1": probe_f1(args.backend, args.group_timeout),
           "f3": probe_f3(args.backend, args.probe_s),
           "memory": probe_memory(args.backend, args.tiny)}
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
