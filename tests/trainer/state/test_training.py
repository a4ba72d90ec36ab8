"""The training state and its progress: assembled in one place, through the codec and back."""

from __future__ import annotations

import pytest
import torch

from trainer.data import batching
from trainer.data.sampler import CursorState
from trainer.errors import BadState
from trainer.state import codec
from trainer.state.progress import Progress
from trainer.state.training import TrainingState


def _state(seed: int = 0) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(8, 3)).sum().backward()
    opt.step()  # an optimiser with state
    return TrainingState(model, opt, None, "fp-1")


def test_progress_moves_only_by_a_commit_and_crosses_epochs() -> None:
    p = Progress()
    p = p.advance(10, 4).advance(10, 4)
    assert (p.step, p.cursor, p.samples_done) == (2, CursorState(0, 8), 8)
    p = p.advance(10, 2)  # the epoch's short last step
    assert (p.step, p.epoch, p.cursor.cursor, p.samples_done) == (3, 1, 0, 10)
    with pytest.raises(ValueError, match="past the end"):
        p.advance(10, 11)
    with pytest.raises(AttributeError):
        p.step = 9  # type: ignore[misc]  # frozen: one way to change it


def test_steps_lost_stay_with_the_worker() -> None:
    mine = Progress(5, CursorState(1, 4), 40).lost(2).lost(1)
    assert mine.lost_steps == 3 and "lost_steps" not in mine.to_plain()
    theirs = Progress(9, CursorState(2, 0), 72).to_plain()
    got = mine.from_plain(theirs)
    assert (got.step, got.cursor, got.samples_done, got.lost_steps) == (
        9, CursorState(2, 0), 72, 3)


def test_the_tree_travels_through_the_codec_and_loads_bit_for_bit() -> None:
    src = _state(0)
    src.progress = Progress(12, CursorState(1, 64), 832)
    src.speed = batching.observe(src.speed, [batching.StepTiming("a/1", 32, 0.01)])
    src.sizes, src.metrics = {"a/1": 32, "b/2": 32}, {"accuracy": 0.5}
    dst = _state(1)
    assert dst.checksum() != src.checksum()
    tree = codec.decode(codec.encode(src.to_tree()))  # no pickle on the way
    dst.load(tree)
    assert dst.checksum() == src.checksum()
    assert dst.progress == src.progress and dst.sizes == src.sizes
    assert dst.metrics == src.metrics and dst.speed == src.speed
    assert tree["job"] == "fp-1" and tree["step"] == 12  # the snapshot format keeps its keys


def test_a_tree_of_another_model_is_refused_before_anything_loads() -> None:
    src, dst = _state(0), _state(1)
    tree = src.to_tree()
    tree["model"] = {k: v[:1] if v.dim() else v for k, v in tree["model"].items()}
    before = dst.checksum()
    with pytest.raises(BadState):
        dst.load(tree)
    assert dst.checksum() == before
    with pytest.raises(BadState, match="does not fit"):
        dst.load({**src.to_tree(), "speed": "fast"})


def test_the_meta_is_the_plain_part_a_stage_travels_with() -> None:
    src, dst = _state(0), _state(1)
    src.progress, src.metrics = Progress(3, CursorState(0, 24), 24), {"r2": 0.2}
    dst.load_meta(codec.decode(codec.encode(src.meta())))
    assert dst.progress == src.progress and dst.metrics == {"r2": 0.2}
    assert dst.checksum() != src.checksum()  # the layers travel apart


def test_the_meta_carries_the_scheduler_and_the_hyperparameters_it_sets() -> None:
    def state(steps: int) -> TrainingState:
        s = _state(0)
        s.scheduler = torch.optim.lr_scheduler.OneCycleLR(s.optimizer, max_lr=0.5,
                                                          total_steps=20)
        for _ in range(steps):
            s.optimizer.step()
            s.scheduler.step()
        return s

    src, dst = state(7), state(0)
    assert dst.optimizer.param_groups[0]["lr"] != src.optimizer.param_groups[0]["lr"]
    dst.load_meta(codec.decode(codec.encode(src.meta())))
    assert dst.digests()["scheduler"] == src.digests()["scheduler"]
    for k in ("lr", "betas"):
        assert dst.optimizer.param_groups[0][k] == src.optimizer.param_groups[0][k]
    assert isinstance(dst.optimizer.param_groups[0]["betas"], tuple)
    before = dst.scheduler.state_dict()
    with pytest.raises(ValueError, match="parameter groups"):
        dst.load_meta({**src.meta(), "groups": []})
    assert dst.scheduler.state_dict() == before  # nothing of it loaded


def test_checksum_sees_every_parameter_bit() -> None:
    m = torch.nn.Linear(3, 3)
    c = codec.checksum(m)
    with torch.no_grad():
        m.bias[0] = torch.nextafter(m.bias[0], torch.tensor(10.0))
    assert codec.checksum(m) != c


def _host_copy_holds_the_instant(device: torch.device) -> None:
    from trainer.state.snapshot import host_copy

    st = _state()
    st.model.to(device)
    image = torch.randn(2, 3, 4, 4, device=device).to(memory_format=torch.channels_last)
    tree = {"state": st.to_tree(), "image": image, "pair": (image[0], 7), "names": ["a", 1.5]}
    copy = host_copy(tree)
    before = codec.checksum(copy["state"])
    sent = codec.decode(codec.encode({"image": image, "pair": (image[0], 7)}))  # a joiner's
    assert torch.equal(sent["image"], image.cpu()) and sent["pair"][1] == 7
    with torch.no_grad():
        for p in st.model.parameters():
            p.add_(1.0)  # training goes on with the originals
        image.zero_()
    assert codec.checksum(copy["state"]) == before
    assert copy["image"].device.type == "cpu" and copy["image"].abs().sum() > 0
    assert copy["image"].is_contiguous(memory_format=torch.channels_last)  # strides kept
    assert isinstance(copy["pair"], tuple) and copy["pair"][1] == 7
    assert copy["names"] == ["a", 1.5]


def test_a_host_copy_holds_the_instant_it_was_taken() -> None:
    _host_copy_holds_the_instant(torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_host_copy_of_gpu_state_is_pinned_and_complete() -> None:
    """The copies are queued without blocking; one synchronisation makes them whole."""
    _host_copy_holds_the_instant(torch.device("cuda"))
