"""Ordinary models through an elastic ring (issue 14): real gloo processes, not digits.

The regression job of tests/trainer/jobs/regression.py (custom Dataset with ``(1,)``-shaped
targets, BatchNorm1d, LayerNorm, Dropout, AdamW, MSE, ``{"mse", "r2"}`` metrics) goes
through a join, a SIGKILL, a SIGTERM and a second join; then vector targets, a job whose
forward raises, and the trained model out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.jobs import regression
from tests.trainer.ringutil import Ring, exported, finish_checksums, per_epoch_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB = "tests/trainer/jobs/regression.py"
EPOCHS = 20


@pytest.fixture(scope="module")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("regression")
    out = tmp / "model.pt"
    pace = tmp / "pace"  # the job goes slowly until both joiners are in
    pace.write_text("")
    ring = Ring(tmp, job=JOB, env={"REG_EPOCHS": str(EPOCHS), "REG_OUT": str(tmp / "r2"),
                                   "REG_PACE_FILE": str(pace)},
                initial_world=3, heartbeat_timeout_s=3.0, rollcall_s=0.5)
    try:
        ring.worker("a", "--output", str(out))
        ring.worker("b", "--output", str(out), "--fault", "kill@40")  # no notice
        ring.worker("c", "--output", str(out), "--fault", "term@70")  # notice
        ring.wait_for("generation 1", lambda: len(ring.formed()) >= 1, 120)
        ring.coord.request_export()  # the trained model, now (the daemon's "model so far")
        ring.worker("j1", "--output", str(out))  # joins hot
        ring.wait_for("step 90", lambda: ring.coord.stats()["step"] >= 90, 150)
        ring.worker("j2", "--output", str(out))  # a second join
        ring.wait_for("the second joiner in the ring", lambda: ring.active("j2"), 240)
        pace.unlink()
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 240)
        for p in ring.procs.values():
            p.wait(30)
        yield {"ring": ring, "tmp": tmp, "out": out, "stats": ring.coord.stats(),
               "codes": {n: p.returncode for n, p in ring.procs.items()},
               "formed": ring.formed(), "events": ring.coord.events(),
               "samples": ring.samples(), "logs": ring.logs(), "exported": exported(tmp)}
    finally:
        ring.close()


def test_every_worker_survives_and_the_story_has_its_exit_codes(elastic: dict[str, Any]
                                                                 ) -> None:
    assert "more than 1 value per channel" not in elastic["logs"]
    codes = elastic["codes"]
    assert codes["b"] == -9 and codes["c"] == 0, codes
    assert codes["a"] == codes["j1"] == codes["j2"] == 0, (codes, elastic["logs"])
    stats = elastic["stats"]
    assert stats["outcome"] == "done" and stats["epoch"] == EPOCHS


def test_members_hold_identical_parameters_buffers_and_optimiser_state(elastic: dict[str, Any]
                                                                        ) -> None:
    formed = elastic["formed"]
    assert len(formed) >= 4
    assert all(f["identical"] for f in formed), formed
    sums = {c for _, c in finish_checksums(elastic["events"])}
    assert len(sums) == 1


def test_the_metrics_evaluate_returns_are_reported_and_it_learned(elastic: dict[str, Any]
                                                                  ) -> None:
    metrics = elastic["stats"]["metrics"]
    assert set(metrics) == {"mse", "r2"} and "accuracy" not in elastic["stats"]
    # (1,)-shaped targets flattened into (b,) broadcast the MSE and gave R^2 0.016. One
    # process reaches 0.92 on this job in 20 epochs; the ring's members normalise BatchNorm
    # over their own 8-16-sample shards (as DDP's ranks do), which costs a little.
    assert metrics["r2"] > 0.8, metrics
    assert float((elastic["tmp"] / "r2").read_text()) == pytest.approx(metrics["r2"])


def test_each_sample_exactly_once_per_epoch(elastic: dict[str, Any]) -> None:
    counts = per_epoch_counts(elastic["samples"])
    assert sorted(counts) == list(range(EPOCHS))
    for epoch, c in counts.items():
        assert sorted(c) == list(range(regression.N_TRAIN)), epoch
        assert set(c.values()) == {1}, epoch


def test_no_member_ever_got_fewer_samples_than_batchnorm_needs(elastic: dict[str, Any]
                                                               ) -> None:
    sizes = [len(r["ids"]) for r in elastic["samples"]]
    assert min(sizes) >= 2, sorted(sizes)[:5]


def test_the_trained_model_is_written_where_asked_in_a_form_torch_loads(
        elastic: dict[str, Any]) -> None:
    sd = torch.load(elastic["out"], weights_only=True)
    model = regression.Net(1)
    model.load_state_dict({k: v for k, v in sd.items()})
    x, y = regression._make(regression.N_TEST, 2, 1)
    model.eval()
    with torch.no_grad():
        mse = float(((model(x) - y) ** 2).mean())
    assert mse == pytest.approx(elastic["stats"]["metrics"]["mse"], rel=1e-4)


def test_an_export_request_writes_the_model_while_the_ring_trains(elastic: dict[str, Any]
                                                                 ) -> None:
    """The ring mode honours ``Coordinator.request_export`` through the member skeleton:
    rank 0 writes the model at the next step boundary, once, long before the end."""
    got = elastic["exported"]
    assert len(got) == 1, (got, elastic["logs"])
    assert 0 < got[0][1] < elastic["stats"]["step"], got


def test_vector_targets_train(tmp_path: Path) -> None:
    ring = Ring(tmp_path, job=JOB, env={"REG_EPOCHS": "2", "TARGET_DIM": "3"},
                initial_world=2)
    try:
        ring.worker("a")
        ring.worker("b")
        ring.wait_for("the job to finish", lambda: ring.coord.stats().get("finished"), 150)
        assert ring.coord.stats()["outcome"] == "done"
        assert ring.procs["a"].wait(30) == 0 and ring.procs["b"].wait(30) == 0
    finally:
        ring.close()


def test_an_error_in_the_jobs_forward_ends_the_job_once_not_as_a_revocation(tmp_path: Path
                                                                             ) -> None:
    ring = Ring(tmp_path, job=JOB, env={"REG_EPOCHS": "3", "REG_FAIL_AT": "12"},
                initial_world=2)
    try:
        ring.worker("a")
        ring.worker("b")
        ring.wait_for("the job to end", lambda: ring.coord.stats().get("finished"), 150)
        stats = ring.coord.stats()
        assert stats["outcome"] == "failed", stats
        assert "forward raised RuntimeError" in stats["failure"] and "step" in stats["failure"]
        assert ring.procs["a"].wait(30) == 2
        # b ends failed too, unless the batch planner drained it first as a straggler (beside
        # a chaos run, load 15-20, it measured 5x slower than a and left at step 2, exit 0)
        code_b = ring.procs["b"].wait(30)
        assert code_b == 2 or (code_b == 0 and "drained at generation" in
                               (tmp_path / "b.log").read_text()), code_b
        assert not ring.events("lost")  # not treated like a revocation
        logs = ring.logs()
        assert logs.count("forward raised RuntimeError") <= 4, logs  # reported, not looped
    finally:
        ring.close()
