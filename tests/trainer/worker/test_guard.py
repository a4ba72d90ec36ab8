"""``torch.distributed`` called by a job's code fails naming the context; the trainer's own
groups (built as objects) are untouched. Run in a subprocess: the guard changes the module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = """
import datetime, threading
import torch, torch.distributed as dist
from trainer.worker import guard
assert guard.install() and not guard.install()  # idempotent
from torch.distributed import get_rank
for call in (lambda: get_rank(), lambda: dist.all_reduce(torch.ones(1)),
             lambda: dist.init_process_group("gloo")):
    try:
        call()
    except RuntimeError as e:
        assert "ctx.rank" in str(e) and "no default process group" in str(e), e
    else:
        raise AssertionError("not guarded")
assert dist.is_initialized() is False
store = dist.HashStore()
pgs = [None, None]
def make(r):
    pgs[r] = dist.ProcessGroupGloo(dist.PrefixStore("g/", store), r, 2,
                                   datetime.timedelta(seconds=20))
ts = [threading.Thread(target=make, args=(r,)) for r in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
ts = [torch.ones(2) * (r + 1) for r in range(2)]
works = [pgs[r].allreduce([ts[r]]) for r in range(2)]
[w.wait() for w in works]
assert ts[0].tolist() == [3.0, 3.0]  # the trainer's kind of collective still works
print("ok")
"""


def test_the_job_s_torch_distributed_calls_name_the_context() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(REPO),
                                                      "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
