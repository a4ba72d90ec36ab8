"""The training code people already have, through an elastic ring (issue 26): real gloo
processes running the two shipped examples, each through a join, a SIGKILL and a notice.

``examples/gpt.py``: a dict batch, a model that returns its loss (``forward_loss``), warmup +
cosine (``scheduler``), clipping, accumulation (``micro_batch``), ``max_steps``.
``examples/images.py``: BatchNorm, label smoothing, mixup in ``collate_fn``, an EMA in
``extra_state`` updated in ``after_step``, a per-epoch schedule.

Every member writes its state's digests (parameters, buffers, optimiser, scheduler, extra
state) in each metrics line (``--record-digests``): at every step two members both computed,
they must be equal. The data: every position of the order trained exactly once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.ringutil import Ring, finish_checksums, per_epoch_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB = "tests/trainer/jobs/paced.py"
STORY = {"gpt": (12, 24), "images": (30, 60)}  # (kill b at, notice to c at)


@pytest.fixture(scope="module", params=["gpt", "images"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, Any]]:
    example = request.param
    tmp = tmp_path_factory.mktemp(example)
    pace, hold = tmp / "pace", tmp / "hold"
    pace.write_text("")
    kill, term = STORY[example]
    ring = Ring(tmp, job=JOB, env={"PACED_EXAMPLE": example, "PACED_FILE": str(pace),
                                   "PACED_HOLD": str(hold)},
                initial_world=3, heartbeat_timeout_s=3.0, rollcall_s=0.5)
    try:
        ring.worker("a", "--record-digests")
        ring.worker("b", "--record-digests", "--fault", f"kill@{kill}")  # no notice
        ring.worker("c", "--record-digests", "--fault", f"term@{term}")  # a notice
        ring.wait_for("generation 1", lambda: len(ring.formed()) >= 1, 120)
        ring.worker("j", "--record-digests")  # joins hot
        ring.wait_for("b lost and c drained", lambda: (
            ring.procs["b"].poll() is not None and ring.procs["c"].poll() is not None), 200)
        if not ring.active("j"):  # a slow start (a loaded machine): the ring waits for it
            hold.write_text("")
        ring.wait_for("the joiner in", lambda: ring.active("j"), 200)
        hold.unlink(missing_ok=True)
        pace.unlink()
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 200)
        for p in ring.procs.values():
            p.wait(30)
        yield {"example": example, "stats": ring.coord.stats(), "formed": ring.formed(),
               "codes": {n: p.returncode for n, p in ring.procs.items()},
               "events": ring.coord.events(), "samples": ring.samples(),
               "metrics": ring.metrics(), "logs": ring.logs()}
    finally:
        ring.close()


def test_the_story_ends_done_with_its_exit_codes(run: dict[str, Any]) -> None:
    codes = run["codes"]
    assert codes["b"] == -9 and codes["c"] == 0, (codes, run["logs"])
    assert codes["a"] == codes["j"] == 0, (codes, run["logs"])
    stats = run["stats"]
    assert stats["outcome"] == "done", stats
    assert stats["steps_lost"] <= 1, stats  # one kill: at most one step


def test_every_step_two_members_computed_holds_identical_state(run: dict[str, Any]) -> None:
    """Parameters, buffers, optimiser, scheduler and extra state: one digest per step,
    whoever computed it (the joiner from its first step on), and the same lr."""
    by_step: dict[int, set[str]] = {}
    members: dict[int, set[str]] = {}
    lrs: dict[int, set[float]] = {}
    world: dict[int, int] = {}
    for r in run["metrics"]:
        by_step.setdefault(r["step"], set()).add(r["digest"])
        members.setdefault(r["step"], set()).add(r["member"].split("/")[0])
        lrs.setdefault(r["step"], set()).add(r["lr"])
        world[r["step"]] = max(world.get(r["step"], 0), r["world"])
    shared = [s for s, m in members.items() if len(m) >= 2]
    # every step a ring of two or more computed is compared (a step the killed member
    # computed and never recorded aside); on a loaded machine the joiner may start late,
    # and the steps the survivor trained alone meanwhile have nobody to compare with
    several = [s for s, w in world.items() if w >= 2]
    assert len(shared) >= len(several) - 2 and len(shared) >= run["stats"]["step"] * 0.3
    assert any("j" in members[s] for s in shared)  # the joiner's steps are compared too
    differ = {s: by_step[s] for s in shared if len(by_step[s]) != 1}
    assert not differ, differ
    assert all(len(v) == 1 for v in lrs.values())
    for part in ("scheduler", "parameters", "buffers", "optimizer"):
        assert f"{part}:" in next(iter(by_step[shared[0]]))
    assert all(f["identical"] for f in run["formed"]), run["formed"]
    assert len({c for _, c in finish_checksums(run["events"])}) == 1


def test_each_position_of_the_order_exactly_once(run: dict[str, Any]) -> None:
    counts = per_epoch_counts(run["samples"])
    total = sum(sum(c.values()) for c in counts.values())
    assert total == run["stats"]["samples_done"]
    for epoch, c in counts.items():
        assert set(c.values()) == {1}, (epoch, [k for k, v in c.items() if v > 1][:5])
    if run["example"] == "images":
        from examples.images import Digits

        assert sorted(counts) == list(range(6))
        assert all(len(c) == len(Digits("train")) for c in counts.values())


def test_the_schedule_and_the_user_s_state_went_where_the_user_code_says(
        run: dict[str, Any]) -> None:
    stats, last = run["stats"], max(run["metrics"], key=lambda r: r["step"])
    if run["example"] == "gpt":
        from examples.gpt import warmup_cosine

        assert stats["step"] == 60  # max_steps
        assert last["lr"] == pytest.approx(3e-3 * warmup_cosine(6, 60)(60))
        assert stats["metrics"]["val_loss"] < math.log(256) * 0.75  # it learned
        assert any(r.get("grad_norm") is not None for r in run["metrics"])  # clipped
    else:
        assert stats["epoch"] == 6
        assert last["lr"] == pytest.approx(0.0, abs=1e-9)  # cosine over the epochs, per epoch
        lrs = Counter(r["lr"] for r in run["metrics"] if r["member"].startswith("a/"))
        assert len(lrs) == 7  # stepped at the 6 epoch ends only (the first lr, then 6)
        assert stats["metrics"]["ema_accuracy"] > 0.9, stats["metrics"]


@pytest.mark.timeout(120)
def test_a_ring_starts_from_the_user_s_own_checkpoint(tmp_path: Path) -> None:
    """``--resume CKPT`` (26.7): the torchvision reference's checkpoint (``model``,
    ``optimizer``, ``lr_scheduler``, ``epoch``) starts the first generation; a second worker
    without the flag trains the same state; the finished epochs are not trained again."""
    import torch

    from examples.images import make_job

    job = make_job(0)
    with torch.no_grad():
        for p in job.model.parameters():
            p.add_(0.01)
    job.optimizer.step()  # (no gradients: nothing moves; the scheduler's order kept)
    job.scheduler.step()
    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"model": job.model.state_dict(), "optimizer": job.optimizer.state_dict(),
                "lr_scheduler": job.scheduler.state_dict(), "epoch": 1,
                "model_ema": job.extra_state["ema"].state_dict()}, ckpt)
    ring = Ring(tmp_path, job="examples/images.py", env={"IMAGES_EPOCHS": "2"},
                initial_world=2, heartbeat_timeout_s=3.0, rollcall_s=0.5)
    try:
        ring.worker("a", "--record-digests", "--resume", str(ckpt))
        ring.worker("b", "--record-digests")
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 100)
        for p in ring.procs.values():
            p.wait(30)
        assert {n: p.returncode for n, p in ring.procs.items()} == {"a": 0, "b": 0}, ring.logs()
        counts = per_epoch_counts(ring.samples())
        assert sorted(counts) == [1] and set(counts[1].values()) == {1}  # epoch 0 was done
        steps = sorted({r["step"] for r in ring.metrics()})
        assert steps[0] == 24 and ring.coord.stats()["epoch"] == 2  # 23 steps an epoch
        first = [r for r in ring.metrics() if r["step"] == 24]
        assert len({r["digest"] for r in first}) == 1 and len(first) == 2
        assert first[0]["lr"] == pytest.approx(job.scheduler.get_last_lr()[0])
    finally:
        ring.close()
