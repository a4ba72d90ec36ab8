"""A pipeline snapshot holds the committed state of the step it names, buffers included.

At D > 0 a snapshot (or an export of the trained model) is taken at the commit of wave
``N - 1`` while waves ``N .. N + D - 1`` are already computed: each stage's live BatchNorm
buffers hold its own changes of those waves (:meth:`trainer.pipeline.stagestate.StagePack.
apply`). The snapshot must hold the buffers as committed with step ``N`` (as the ring
commits buffers with the step, issue 26.3), or a run resumed from it counts those waves'
statistics twice.

In parts: a stage's pack shows its committed buffers in place for a context's span and its
live ones again after it. Through real processes: two two-stage rings of the same job at
D = 2, side by side; one stops after step ``N`` (its model at the end, every wave applied, is
the committed state of step ``N``), the other goes on past ``N`` and snapshots at ``N``. The
snapshot's model equals the first's bit for bit, parameters and buffers. Before the fix the
snapshot's ``num_batches_tracked`` was 16 ahead (67 against 51: the 8 micro-batches of each
of the two waves in flight).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.trainer.jobs import pipe
from tests.trainer.ringutil import Ring, finish_checksums
from trainer.pipeline.stagestate import StagePack
from trainer.state import export
from trainer.state import snapshot as snap


JOB = "tests/trainer/jobs/pipe.py"
AT = 6  # the snapshot's step (waves 6 and 7 are in flight when it is taken)
ENV = {"PIPE_D": "2", "PIPE_EPOCHS": "1", "PIPE_LAYER_MS": "0.05"}
MICROS = 64 // 8  # micro-batches per wave (pipe.py: PIPE_BATCH 64, PIPE_MICRO 8)
WAVES = pipe.N_TRAIN // 64  # one epoch


def _ring(tmp: Path, env: dict[str, str], **coord: object) -> Ring:
    tmp.mkdir()
    return Ring(tmp, job=JOB, env={**ENV, **env}, initial_world=2, heartbeat_timeout_s=8.0,
                **coord)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_snapshot_taken_with_waves_in_flight_holds_the_committed_state(tmp_path: Path
                                                                        ) -> None:
    shots = tmp_path / "b" / "snapshots"
    ended = _ring(tmp_path / "a", {"SPOTRING_UNTIL_STEPS": str(AT)})
    going = _ring(tmp_path / "b", {}, snapshot=snap.SnapshotSettings(
        str(shots), every_s=3600.0, every_steps=AT, keep=5))
    try:
        out = tmp_path / "a" / "model.pt"
        for name in ("a", "b"):
            ended.worker(name, "--output", str(out))
            going.worker(name)
        for ring in (ended, going):
            ring.wait_for("the job to finish", lambda r=ring: r.coord.stats().get("finished"),
                          180)
            assert all(p.wait(60) == 0 for p in ring.procs.values()), ring.logs()
            assert ring.coord.stats()["outcome"] == "done", ring.logs()
            assert all(f["identical"] for f in ring.formed()), ring.formed()
            assert len({c for _, c in finish_checksums(ring.coord.events())}) == 1
        assert ended.coord.stats()["step"] == AT and going.coord.stats()["step"] == WAVES
        committed = torch.load(out, weights_only=True)  # the end: every wave applied
        (taken,) = [p for p in shots.glob(f"step-{AT:010d}-*") if p.suffix != ".json"]
        got = export.model_of(export.read_snapshot(taken))
    finally:
        ended.close()
        going.close()
    bn = "1.num_batches_tracked"  # pipe.py's BatchNorm1d is layer 1
    assert int(got[bn]) == int(committed[bn]), (got[bn], committed[bn])
    assert list(got) == list(committed)
    differ = [k for k in committed if not torch.equal(got[k], committed[k])]
    assert not differ, differ


def _wave(bn: torch.nn.BatchNorm1d, pack: StagePack, x: torch.Tensor) -> tuple[torch.Tensor,
                                                                             list[torch.Tensor]]:
    """One wave's forward and backward through ``bn``, packed (gradients and own buffer
    changes)."""
    before = pack.live_buffers()
    bn(x).square().mean().backward()
    return pack.pack(before, torch.device("cpu"))


def test_the_pack_shows_the_committed_buffers_in_place_and_the_live_ones_after() -> None:
    """Wave 0 applied while wave 1 is in flight (D = 1): inside ``committed_in_place`` the
    stage's buffers are the committed ones (wave 0's statistics only), after it exactly the
    live ones again (wave 1's own change too), also when the context raised."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(3)
    ref = torch.nn.BatchNorm1d(3)  # one process that ran wave 0 only
    ref.load_state_dict(bn.state_dict())
    opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    pack = StagePack(list(bn.parameters()), list(bn.buffers()))
    x0, x1 = torch.randn(8, 3), torch.randn(8, 3) + 2.0
    flat0, _ = _wave(bn, pack, x0)
    _, own1 = _wave(bn, pack, x1)
    pack.apply(flat0, opt, [own1])  # wave 0 reduced (one VW: its own pack) and applied
    ref(x0)
    live = [b.clone() for b in bn.buffers()]
    with pack.committed_in_place():
        shown = [b.clone() for b in bn.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(shown, pack.committed, strict=True))
    assert int(bn.num_batches_tracked) == 2 and int(shown[2]) == 1
    for a, b in zip(shown, ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert not torch.allclose(shown[0], live[0])  # wave 1 moved the live mean
    assert all(torch.equal(a, b) for a, b in zip(bn.buffers(), live, strict=True))
    with pytest.raises(RuntimeError), pack.committed_in_place():
        raise RuntimeError("a gather broke")
    assert all(torch.equal(a, b) for a, b in zip(bn.buffers(), live, strict=True))
