"""A run's state in and out (issue 26.7): the trained model out of a durable snapshot
(``python -m trainer export``), and the user's own checkpoint as a run's start."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch

from trainer.__main__ import main
from trainer.errors import BadState, SnapshotError
from trainer.state import codec, export
from trainer.state.snapshot import Manifest, name_for
from trainer.state.training import TrainingState


def _state() -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    ema = torch.optim.swa_utils.AveragedModel(model)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    sched.step()
    return TrainingState(model, opt, None, "fp", scheduler=sched, extra={"ema": ema})


def _snapshot(directory: Path, state: TrainingState, step: int) -> Path:
    data = codec.encode({**state.to_tree(), "step": step}).numpy().tobytes()
    name = name_for(step)
    (directory / name).write_bytes(data)
    (directory / f"{name}.json").write_text(Manifest(
        name, step, 0, 0, len(data), hashlib.sha256(data).hexdigest(), "fp",
        time.time()).to_json())
    return directory / name


def test_export_writes_the_newest_snapshot_s_model_and_never_overwrites(tmp_path: Path,
                                                                        capsys) -> None:
    st = _state()
    _snapshot(tmp_path, st, 3)
    newest = _snapshot(tmp_path, st, 9)
    out = tmp_path / "out" / "model.pt"
    assert main(["export", str(tmp_path), "-o", str(out)]) == 0
    assert "step 9" in capsys.readouterr().out
    sd = torch.load(out, weights_only=True)
    assert sd.keys() == st.model.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in st.model.state_dict().items())
    assert main(["export", str(newest), "-o", str(out)]) == 2  # exists: refused
    assert "already exists" in capsys.readouterr().err
    ema = tmp_path / "ema.pt"
    assert main(["export", str(newest), "-o", str(ema), "--extra", "ema"]) == 0
    assert "n_averaged" in torch.load(ema, weights_only=True)
    assert main(["export", str(newest), "-o", str(tmp_path / "x.pt"), "--extra", "swa"]) == 2
    assert "holds ['ema']" in capsys.readouterr().err


def test_a_torn_snapshot_is_refused_naming_it(tmp_path: Path) -> None:
    path = _snapshot(tmp_path, _state(), 4)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match="differ from its manifest"):
        export.read_snapshot(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SnapshotError, match="no complete snapshot"):
        export.read_snapshot(tmp_path / "empty")


@pytest.mark.parametrize("style", ["nanogpt", "torchvision", "bare"])
def test_the_user_s_own_checkpoint_starts_the_state(tmp_path: Path, style: str) -> None:
    src, dst = _state(), _fresh_state()
    sd = src.model.state_dict()
    if style == "nanogpt":  # a compiled model's keys, iter_num
        ckpt = {"model": {f"_orig_mod.{k}": v for k, v in sd.items()},
                "optimizer": src.optimizer.state_dict(), "iter_num": 7,
                "config": {"lr": 0.1}}
    elif style == "torchvision":  # DDP's keys, lr_scheduler, epoch, the EMA by its name
        ckpt = {"model": {f"module.{k}": v for k, v in sd.items()},
                "optimizer": src.optimizer.state_dict(),
                "lr_scheduler": src.scheduler.state_dict(), "epoch": 2,
                "ema": src.extra["ema"].state_dict()}
    else:
        ckpt = dict(sd)
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    kind, got = export.read_checkpoint(path)
    assert kind == "checkpoint"
    loaded = dst.load_checkpoint(export.checkpoint_parts(got, ["ema"]), dataset_size=50,
                                 global_batch=8)
    assert all(torch.equal(v, dst.model.state_dict()[k]) for k, v in sd.items())
    p = dst.progress
    if style == "nanogpt":
        assert "optimizer" in loaded and (p.step, p.epoch, p.cursor.cursor) == (7, 1, 0)
    elif style == "torchvision":
        assert dst.digests()["scheduler"] == src.digests()["scheduler"]
        assert dst.digests()["extra"] == src.digests()["extra"]
        assert (p.step, p.epoch, p.cursor.cursor, p.samples_done) == (14, 2, 0, 100)
    else:
        assert loaded == ["model"] and p.step == 0


def _fresh_state() -> TrainingState:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return TrainingState(model, opt, None, "fp",
                         scheduler=torch.optim.lr_scheduler.StepLR(opt, 2),
                         extra={"ema": torch.optim.swa_utils.AveragedModel(model)})


def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save({"model": torch.nn.Linear(2, 2).state_dict()}, path)
    _, got = export.read_checkpoint(path)
    with pytest.raises(BadState, match="does not match"):
        _fresh_state().load_checkpoint(export.checkpoint_parts(got, []),
                                                 dataset_size=10, global_batch=2)
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(SnapshotError, match="neither a spotring snapshot nor"):
        export.read_checkpoint(tmp_path / "junk.pt")


def test_the_standalone_coordinator_refuses_bad_snapshot_flags(tmp_path: Path, capsys) -> None:
    token = tmp_path / "token"
    token.write_text("x" * 32)
    token.chmod(0o600)
    assert main(["coordinator", "--token-file", str(token), "--snapshot-url",
                 str(tmp_path / "snaps"), "--snapshot-keep", "0"]) == 2
    err = capsys.readouterr().err
    assert "keep=0" in err and "--snapshot-*" in err
    assert json  # (the manifest above is JSON)
