"""Device handling that needs no GPU: the local rank, and the modes refused on a GPU."""

from __future__ import annotations

import pytest
import torch

from trainer.worker import devices


def test_the_pipeline_and_hybrid_modes_are_refused_on_a_gpu_in_one_line() -> None:
    gpu = torch.device("cuda", 1)
    assert devices.refusal("ring", gpu) is None
    assert devices.refusal("pipeline", torch.device("cpu")) is None
    for mode in ("pipeline", "hybrid"):
        line = devices.refusal(mode, gpu)
        assert line is not None and "\n" not in line
        assert line.startswith("--device cuda:1: the " + mode) and "--device cpu" in line


@pytest.mark.parametrize("env,rank", [({}, 0), ({"LOCAL_RANK": "3"}, 3),
                                      ({"SPOTRING_LOCAL_RANK": "2"}, 2),
                                      ({"LOCAL_RANK": "x", "SPOTRING_LOCAL_RANK": "1"}, 1)])
def test_the_local_rank_comes_from_torchrun_or_the_local_driver(monkeypatch, env, rank) -> None:
    for var in ("LOCAL_RANK", "SPOTRING_LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert devices.local_rank() == rank
