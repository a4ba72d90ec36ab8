"""Shared helpers of the trainer benchmarks, and the baseline worker they measure against.

Design. Every trainer benchmark has the same outline: parse flags (small defaults that finish
in under a minute on 2 CPU cores), start a coordinator and ``python -m trainer worker``
processes writing ``--metrics-file`` JSON lines, run a baseline in the same run, reduce the
metrics to figures and print ONE JSON line on stdout (logs go to stderr). This module holds
the parts they share: logging, process start/stop, metrics reading and rates, and the
baselines' worker.

Run as a script, this file is the baseline worker (one process per rank, started by the real
``torchrun``): plain ``torch.nn.parallel.DistributedDataParallel`` over gloo on the same job
file as the spotring workers, writing the same metrics keys. With ``--ckpt PATH`` it saves a
checkpoint (model, optimiser, step) after every step and reloads it at start, which makes it
the checkpoint-restart baseline when torchrun restarts the workers on a membership change.

Rule: figures are ratios against a baseline measured in the same run, never absolute times;
the machine is shared, so absolute times mean little.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
DEFAULT_JOB = REPO / "examples" / "digits.py"

log = logging.getLogger("benchmarks")


def setup_logging(verbose: bool = False) -> None:
    """Logs to stderr, so stdout carries only the one JSON line."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


def emit(result: dict[str, Any]) -> None:
    """Print the benchmark's single JSON line on stdout."""
    print(json.dumps(result, sort_keys=True), flush=True)


def free_port() -> int:
    """An unused TCP port on loopback (racy by nature; used right away)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON records of ``path`` (a torn last line from a killed writer is skipped)."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A benchmark child's environment: ours, one OpenMP thread unless set, ``env`` over it,
    and the repository put before the ``PYTHONPATH`` we were given, never in its place (a
    device machine brings the project's own dependencies through ``PYTHONPATH``)."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    return full_env


def spawn(args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a child in its own process group, its output into ``log_path``."""
    full_env = child_env(env)
    out = open(log_path, "ab")
    log.debug("spawn %s", " ".join(args))
    return subprocess.Popen(
        list(args), stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO),
        start_new_session=True,
    )


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def stop(procs: Iterable[subprocess.Popen], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Send ``sig`` to each child's process group, wait ``grace`` s, then SIGKILL the rest.

    Descendants in sessions of their own are reached too: torchrun's agent starts every rank
    with ``start_new_session``, so a SIGKILL to the agent's group alone left its ranks
    training (and appending metrics) after the benchmark ended. They are collected before
    anything is signalled and SIGKILLed at the end if still alive.
    """
    procs = list(procs)
    below = [d for p in procs if p.poll() is None for d in descendants(p.pid)[1:]]
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    for pid in below:  # ranks in sessions of their own (torchrun): never left running
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate()`` until true; raise ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def steps_by_number(records: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """One record per step number: the last completion of each step (a redone step counts once)."""
    out: dict[int, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r["t"]):
        out[int(r["step"])] = r
    return out


def samples_between(steps: dict[int, dict[str, Any]], t0: float, t1: float) -> float:
    """Samples of the steps whose (last) completion time lies in ``[t0, t1)``."""
    return float(sum(r["samples"] for r in steps.values() if t0 <= r["t"] < t1))


def rate_between(steps: dict[int, dict[str, Any]], t0: float, t1: float) -> float:
    """Samples per second over ``[t0, t1)`` (completed steps only)."""
    if t1 <= t0:
        return 0.0
    return samples_between(steps, t0, t1) / (t1 - t0)


def steady_rate(steps: dict[int, dict[str, Any]], skip: int = 0) -> float:
    """Samples/s from the completion of step ``skip`` to the last step (warm-up excluded)."""
    recs = sorted(steps.values(), key=lambda r: r["t"])[skip:]
    if len(recs) < 2:
        return 0.0
    done = sum(r["samples"] for r in recs[1:])
    return done / (recs[-1]["t"] - recs[0]["t"])


# -- a spotring ring: in-process coordinator, worker processes ---------------------------


_DOUBLE_MAIN = ("import sys; from tests.fakes.nccl import install; install(); "
                "from trainer.__main__ import main; sys.exit(main(sys.argv[1:]))")


class Ring:
    """A coordinator in this process and ``python -m trainer worker`` children.

    Each worker writes ``<workdir>/<name>.jsonl`` (``--metrics-file``) and logs to
    ``<workdir>/<name>.log``. ``env`` is added to every worker's environment (e.g. the digits
    job's ``DIGITS_BATCH`` / ``DIGITS_EPOCHS``); ``device`` is every worker's ``--device``
    (default ``cpu``: on a GPU host the worker's own default, ``auto``, would put the ring on
    the GPU and its CPU baseline would not compare). Use as a context manager: leaving it kills
    every worker still running and stops the coordinator.
    """

    def __init__(self, workdir: Path, job: Path = DEFAULT_JOB, env: dict[str, str] | None = None,
                 initial_world: int = 1, heartbeat_timeout_s: float = 5.0,
                 device: str = "cpu", nccl_double: bool = False) -> None:
        from trainer.control.coordinator import Coordinator

        self.nccl_double = nccl_double  # workers run NCCL's semantics on CPU (tests/fakes/nccl)
        self.device = device  # every worker's --device (never the worker's own default, auto)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.job = Path(job)
        self.env = dict(env or {})
        token = os.urandom(16).hex().encode()
        self.token_file = self.workdir / "token"
        self.token_file.write_bytes(token)
        self.coordinator = Coordinator("127.0.0.1", 0, token, initial_world=initial_world,
                                       heartbeat_timeout_s=heartbeat_timeout_s)
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "Ring":
        self.coordinator.start()
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.procs.values(), signal.SIGKILL, grace=5.0)
        self.coordinator.stop()

    def add_worker(self, name: str, slowdown: float = 1.0, extra: Sequence[str] = (),
                   nice: int = 0, cpus: str = "") -> subprocess.Popen:
        """Start one worker process called ``name`` (``nice`` > 0 lowers its CPU priority;
        ``cpus``, a ``taskset -c`` list, pins it)."""
        host, port = self.coordinator.address
        args = ["taskset", "-c", cpus] if cpus else []
        args += ["nice", "-n", str(nice)] if nice else []
        args += [PYTHON, *(["-c", _DOUBLE_MAIN] if self.nccl_double else ["-m", "trainer"]),
                 "--log-level", "WARNING", "worker",
                "--coordinator", f"{host}:{port}", "--token-file", str(self.token_file),
                "--job", str(self.job), "--name", name, "--slowdown", str(slowdown),
                "--metrics-file", str(self.metrics_path(name)), "--device", self.device, *extra]
        proc = spawn(args, self.workdir / f"{name}.log", self.env)
        self.procs[name] = proc
        return proc

    def metrics_path(self, name: str) -> Path:
        return self.workdir / f"{name}.jsonl"

    def metrics(self, name: str) -> list[dict[str, Any]]:
        """The step records of worker ``name`` so far."""
        return read_jsonl(self.metrics_path(name))

    def step(self) -> int:
        """The newest committed step the coordinator has heard of."""
        return int(self.coordinator.stats().get("step", 0) or 0)

    def wait_step(self, step: int, timeout: float) -> None:
        """Block until the ring committed ``step``; raise ``TimeoutError`` with the logs' tails."""
        try:
            wait_for(lambda: self.step() >= step, timeout, f"ring step {step}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; worker logs: {self.tails()}") from None

    def tails(self, lines: int = 5) -> str:
        out = []
        for name in self.procs:
            text = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
            out.append(f"[{name}] " + " | ".join(text[-lines:]))
        return "\n".join(out)


def digits_env(global_batch: int, steps: int, samples: int = 1437) -> dict[str, str]:
    """Environment for examples/digits.py: global batch and enough epochs for ``steps``."""
    epochs = max(1, -(-steps * global_batch // samples))
    return {"DIGITS_BATCH": str(global_batch), "DIGITS_EPOCHS": str(epochs)}


# -- memory ----------------------------------------------------------------------------------


def proc_status_kb(pid: int, key: str) -> int | None:
    """``key`` (``VmRSS``, ``VmHWM``: the peak resident set) of process ``pid`` in kB, from
    ``/proc/<pid>/status``; None when the process is gone or the key is missing."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# -- the baseline worker (plain DDP under torchrun, or a plain loop) ---------------------------


def _make_batch(job: Any, ids: Any, device: Any) -> Any:
    """The batch of ``ids`` on ``device`` as a good plain loop makes it, and as the spotring
    worker's input pipeline does (:class:`trainer.data.Feed`): a ``TensorDataset`` is gathered
    straight into pinned host memory and copied without blocking; other datasets are
    collated (``job.batch``) and then pinned and copied."""
    import torch
    from torch.utils.data import TensorDataset

    from trainer.worker.devices import pin

    ds = job.train_set
    if device.type != "cuda":
        return job.batch(ids)
    if isinstance(ds, TensorDataset) and job.collate_fn is None:
        out = []
        for t in ds.tensors:
            host = torch.empty((len(ids), *t.shape[1:]), dtype=t.dtype, pin_memory=True)
            torch.index_select(t, 0, ids, out=host)
            out.append(host.to(device, non_blocking=True))
        return out
    return pin(job.batch(ids), device)


def _baseline_main(argv: Sequence[str] | None = None) -> int:
    """One baseline rank: train ``--steps`` steps (0: until killed), one metrics line per step.

    ``--mode ddp``: plain ``DistributedDataParallel`` with its defaults (25 MB buckets,
    gradients all-reduced inside ``backward``, bucketed and overlapped), on ``--device``
    (``cpu``; ``cuda`` takes GPU ``LOCAL_RANK % count`` and passes it as ``device_ids``) over
    ``--backend`` (``gloo``, the default, also with CUDA tensors: several ranks may share one
    GPU; ``nccl``). ``--mode plain``: one process and no process group at all, the plain
    single-device loop a user writes (run it directly, not under torchrun). ``--mode
    equal``: equal local batches, local forward/backward, the same ``--slowdowns`` emulation
    as ``python -m trainer worker --slowdown`` (sleep ``(F - 1) x batch x`` a running median
    of compute s/sample), then one flat all-reduce of the gradients: the equal-batch ring that
    heterogeneity-aware sizing is measured against. Every mode runs the forward pass and the
    loss under the job's ``precision`` (autocast, a GradScaler for fp16) as a spotring worker
    does, and reads the loss every step (one device synchronisation, as the worker's step).
    ``--mode probe``: no training; times ``--probe-steps`` local forward/backward passes of
    this rank's share and as many bare all-reduces of a flat buffer the size of the gradients
    (over ``--backend``), and writes one JSON line (rank 0): the reduction's share of an
    unoverlapped step.

    The job file is built with ``trainer.job.load_job`` exactly as a spotring worker builds
    it; each step takes ``global_batch`` random sample ids (seeded by the step number, so a
    restarted run continues the same stream) split evenly over the ranks. ``--epoch-loop``
    instead walks the job's epochs exactly as a spotring worker does (the seeded per-epoch
    order of :mod:`trainer.data.sampler`, the short last step of an epoch) and runs the job's
    ``evaluate`` on rank 0 at every epoch end (its time is the metrics key ``eval_s``): the
    same work as a spotring ring of equal workers, so a ratio against it measures the ring's
    overhead only.
    """
    ap = argparse.ArgumentParser(description="baseline worker (run under torchrun; "
                                 "--mode plain: run directly)")
    ap.add_argument("--job", default=str(DEFAULT_JOB))
    ap.add_argument("--mode", choices=("ddp", "equal", "plain", "probe"), default="ddp")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1)")
    ap.add_argument("--slowdowns", default="", help="comma list, one factor per rank (equal)")
    ap.add_argument("--global-batch", type=int, default=None, help="default: the job's")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: never)")
    ap.add_argument("--probe-steps", type=int, default=8, help="--mode probe: timed repeats")
    ap.add_argument("--ckpt", default=None, help="save after every step / load at start")
    ap.add_argument("--metrics-file", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epoch-loop", action="store_true",
                    help="walk the job's epochs as a spotring worker does (seeded order, short "
                    "last step) and evaluate on rank 0 at each epoch end (metrics key eval_s)")
    args = ap.parse_args(argv)

    import contextlib

    import torch
    import torch.distributed as dist

    from trainer.worker.devices import resolve
    from trainer.job import load_job
    from trainer.data.sampler import CursorState, epoch_order, scale_sizes
    from trainer.collective.step import PRECISIONS

    torch.set_num_threads(max(1, args.threads))
    device = resolve(args.device)
    grouped = args.mode != "plain"
    if grouped:
        dist.init_process_group(args.backend)
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    job = load_job(args.job, args.seed)
    model, opt = job.model.to(device), job.optimizer
    if args.mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        net = model
    dtype = PRECISIONS[job.precision]
    scaler = torch.amp.GradScaler(device.type) if job.precision == "fp16" else None

    def cast() -> Any:
        return (torch.autocast(device.type, dtype=dtype) if dtype is not None
                else contextlib.nullcontext())

    slow = [float(f) for f in args.slowdowns.split(",") if f] or [1.0]
    factor = slow[rank % len(slow)]
    global_batch = args.global_batch or job.global_batch
    step = 0
    if args.ckpt and os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, weights_only=False, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        log.info("rank %d: resumed from %s at step %d", rank, args.ckpt, step)
    params = [p for p in model.parameters() if p.requires_grad]
    n = len(job)
    sizes = [global_batch // world + (1 if r < global_batch % world else 0) for r in range(world)]
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    if args.mode == "probe":
        return _probe(args, job, model, opt, params, device, cast, rank, world, sizes[rank])
    metrics = open(args.metrics_file, "a") if rank == 0 else None
    per_sample: list[float] = []
    cursor = CursorState()
    order = epoch_order(args.seed, 0, n)
    if grouped:
        dist.barrier()
    while not args.steps or step < args.steps:
        samples = global_batch
        if args.epoch_loop:  # the spotring worker's data walk: same order, short last step
            samples = cursor.step_total(n, global_batch)
            part = scale_sizes(sizes, samples)
            start = cursor.cursor + sum(part[:rank])
            ids = order[start : start + part[rank]]
        else:
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
            ids = torch.randint(0, n, (global_batch,), generator=gen)[lo:hi]
        t0 = time.perf_counter()
        x, y = _make_batch(job, ids, device)
        opt.zero_grad(set_to_none=True)
        with cast():
            loss = job.loss_fn(net(x), y)
        # ddp: all-reduces (averages) the gradients inside backward
        (scaler.scale(loss) if scaler is not None else loss).backward()
        wait_s = 0.0
        if args.mode == "equal":
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            compute = time.perf_counter() - t0
            if factor > 1.0:  # as the trainer's Runtime.slow: a running median of s/sample
                per_sample.append(compute / sizes[rank])
                del per_sample[:-15]
                time.sleep((factor - 1.0) * sizes[rank] * statistics.median(per_sample))
            flat = torch.cat([p.grad.reshape(-1) for p in params]).mul_(sizes[rank] / global_batch)
            t1 = time.perf_counter()
            dist.all_reduce(flat)
            wait_s = time.perf_counter() - t1
            o = 0
            for p in params:
                p.grad.copy_(flat[o : o + p.numel()].view_as(p))
                o += p.numel()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        loss_v = loss.item()  # one synchronisation per step, as the spotring worker's
        step += 1
        eval_s = 0.0
        if args.epoch_loop:
            cursor = cursor.advance(n, samples)
            if cursor.cursor == 0:  # an epoch ended: rank 0 evaluates, as spotring's does
                order = epoch_order(args.seed, cursor.epoch, n)
                if rank == 0 and job.evaluate is not None:
                    t_eval = time.perf_counter()
                    job.evaluate(model)
                    model.train()
                    eval_s = time.perf_counter() - t_eval
        if args.ckpt and rank == 0:
            tmp = args.ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.ckpt)
        if metrics:
            step_s = time.perf_counter() - t0
            metrics.write(json.dumps({
                "t": time.time(), "step": step, "generation": 0, "world": world,
                "batch": int(ids.numel()), "compute_s": step_s - wait_s, "wait_s": wait_s,
                "step_s": step_s, "samples": samples, "loss": loss_v, "eval_s": eval_s,
            }) + "\n")
            metrics.flush()
    if grouped:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _probe(args: argparse.Namespace, job: Any, model: Any, opt: Any, params: list, device: Any,
           cast: Any, rank: int, world: int, local: int) -> int:
    """``--mode probe``: the local step and a bare all-reduce of the gradients' size, timed
    apart (medians of ``--probe-steps``, after one untimed round), written as one JSON line
    by rank 0: ``compute_s`` (forward, backward and optimiser step of ``local`` samples),
    ``allreduce_s``, ``grad_mb`` and ``reduction_share`` = allreduce / (compute +
    allreduce): the share of a step the reduction would take if nothing overlapped it."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ids = torch.arange(min(local, len(job)))
    compute, reduce = [], []
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=device)
    for k in range(args.probe_steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        x, y = _make_batch(job, ids, device)
        opt.zero_grad(set_to_none=True)
        with cast():
            loss = job.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        sync()
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        dist.all_reduce(flat)
        sync()
        t3 = time.perf_counter()
        if k:
            compute.append(t1 - t0)
            reduce.append(t3 - t2)
    c, r = statistics.median(compute), statistics.median(reduce)
    if rank == 0:
        with open(args.metrics_file, "w") as f:
            f.write(json.dumps({
                "world": world, "local_batch": int(ids.numel()), "compute_s": c,
                "allreduce_s": r, "grad_mb": flat.numel() * flat.element_size() / 2**20,
                "reduction_share": r / (c + r), "compute_runs": compute, "allreduce_runs": reduce,
            }) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def torchrun(nproc: int, worker_args: Sequence[str], log_path: Path,
             env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the real ``torchrun --standalone`` with ``nproc`` baseline ranks of this file
    (``env`` added to their environment)."""
    return spawn([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}",
                  str(Path(__file__).resolve()), *worker_args], log_path, env)


def plain(worker_args: Sequence[str], log_path: Path,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the ``--mode plain`` baseline: this file as one process, no torchrun, no group."""
    return spawn([PYTHON, str(Path(__file__).resolve()), "--mode", "plain", *worker_args],
                 log_path, env)


if __name__ == "__main__":
    setup_logging()
    sys.exit(_baseline_main())
