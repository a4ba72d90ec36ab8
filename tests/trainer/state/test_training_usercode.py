"""What travels now that user code has a place (issue 26): the LR scheduler and the job's
extra state, through the codec (no pickle) and back; one digest per part."""

from __future__ import annotations

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from trainer.errors import BadState
from trainer.state import codec
from trainer.state.training import PARTS, TrainingState, differing


class Counter:
    """A user's stateful object (a curriculum's position): plain data in its state_dict."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, d: dict[str, int]) -> None:
        self.n = int(d["n"])


def _state(seed: int, *, steps: int = 0) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=50)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    counter = Counter()
    for _ in range(steps):
        model(torch.randn(8, 3)).sum().backward()
        opt.step()
        sched.step()
        ema.update_parameters(model)
        counter.n += 1
    return TrainingState(model, opt, None, "fp", scheduler=sched,
                         extra={"ema": ema, "counter": counter})


def test_the_scheduler_and_extra_state_travel_through_the_codec_and_load() -> None:
    src, dst = _state(0, steps=3), _state(1)
    assert differing(src.checksum(), dst.checksum()) == list(PARTS)
    tree = codec.decode(codec.encode(src.to_tree()))  # no pickle on the way
    dst.load(tree)
    assert dst.checksum() == src.checksum()
    assert dst.scheduler.get_last_lr() == src.scheduler.get_last_lr()
    assert dst.extra["counter"].n == 3 and dst.run_id == src.run_id
    src.scheduler.step()  # the schedule moves on the same on both
    dst.scheduler.step()
    assert src.scheduler.get_last_lr() == dst.scheduler.get_last_lr()


def test_one_digest_per_part_names_what_differs() -> None:
    a, b = _state(0, steps=2), _state(0, steps=2)
    assert a.checksum() == b.checksum() and len(a.checksum()) <= 128
    b.scheduler.step()
    assert differing(a.checksum(), b.checksum()) == ["optimizer", "scheduler"]
    b = _state(0, steps=2)
    b.extra["counter"].n += 1
    assert differing(a.checksum(), b.checksum()) == ["extra"]
    b = _state(0, steps=2)
    b.model[1].running_mean.add_(1.0)
    assert differing(a.checksum(), b.checksum()) == ["buffers"]  # the EMA is a copy


def test_a_state_without_the_job_s_scheduler_or_extra_state_is_refused() -> None:
    src, dst = _state(0, steps=1), _state(1)
    tree = src.to_tree()
    with pytest.raises(BadState, match="no LR scheduler"):
        dst.load({**tree, "scheduler": None})
    with pytest.raises(BadState, match="extra state"):
        dst.load({**tree, "extra": {"ema": tree["extra"]["ema"]}})
