"""Out of memory in a pipeline stage, in parts: the runner finishes its schedule with spoiled
messages (two stages as threads over a real gloo group), an agreement never keeps a spoiled
wave, the members' caps travel in the forming table, and what each mode now honours."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.trainer.jobs.tight import Tight
from tests.trainer.ranks import on_ranks
from trainer.pipeline import agree
from trainer.pipeline import table as tb
from trainer.pipeline.agree import Agreement
from trainer.pipeline.local import _gloo
from trainer.pipeline.runner import Micro, StageRunner
from trainer.pipeline.schedule import schedule
from trainer.worker.modes.base import HYBRID_LACKS, PIPELINE_LACKS, lacking


def _two_stages(limit: int, sizes: list[int]) -> dict[int, tuple[object, torch.nn.Module]]:
    """Stage 0 (``Tight(Linear)``: more than ``limit`` samples per pass run out of memory)
    and stage 1 (``Linear`` + loss), 1F1B over ``sizes``; each rank's stats and module."""
    torch.manual_seed(0)
    mods = [torch.nn.Sequential(Tight(torch.nn.Linear(4, 8), limit)),
            torch.nn.Sequential(torch.nn.Linear(8, 1))]
    x, y = torch.randn(sum(sizes), 4), torch.randn(sum(sizes), 1)
    offs = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    micros = [Micro(i, n, n / sum(sizes)) for i, n in enumerate(sizes)]
    store = dist.HashStore()

    def rank(r: int) -> tuple[object, torch.nn.Module]:
        pg = _gloo(dist.PrefixStore("g/", store), r, 2, datetime.timedelta(seconds=30))
        run = StageRunner(mods[r], pg=pg, prev=0 if r else None, next_=None if r else 1,
                          loss_fn=torch.nn.functional.mse_loss, device=torch.device("cpu"))
        stats = run.run(schedule("1f1b", len(micros), 2, r), micros, 0,
                        (lambda i: x[offs[i]:offs[i + 1]]) if r == 0 else None,
                        (lambda i: y[offs[i]:offs[i + 1]]) if r == 1 else None,
                        lambda: False)
        return stats, mods[r]

    return on_ranks(rank, 2)


def _grads(mod: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in mod.parameters() if p.grad is not None])


def test_a_stage_out_of_memory_finishes_its_schedule_and_spoils_the_wave() -> None:
    got = _two_stages(limit=3, sizes=[4, 2, 4])  # micro-batches 0 and 2 do not fit
    (s0, m0), (s1, m1) = got[0], got[1]
    assert s0.oom == 4 and s1.oom == 0  # the largest pass that ran out
    assert torch.isnan(_grads(m0)).all() and torch.isnan(_grads(m1)).any()  # no usable pack


def test_a_schedule_that_fits_is_untouched() -> None:
    got = _two_stages(limit=4, sizes=[4, 2, 4])
    assert got[0][0].oom == got[1][0].oom == 0
    assert all(bool(torch.isfinite(_grads(m)).all()) for _, m in got.values())


def test_a_spoiled_wave_and_the_later_ones_are_handed_out_but_never_kept() -> None:
    pg = _gloo(dist.PrefixStore("a/", dist.HashStore()), 0, 1, datetime.timedelta(seconds=30))
    a = Agreement(None, pg, 1, lambda: False)
    try:
        for wave, oom in ((0, 0), (1, 4), (2, 0)):
            row = torch.zeros(1, agree.ROW, dtype=torch.float64)
            row[0, agree.OOM] = oom
            a.submit(wave, None, row)
        assert [a.wait(w).wave for w in (0, 1, 2)] == [0, 1, 2]
        assert a.newest == 0 and a.spoiled == 1 and not any(w >= 1 for w in a.reduced)
        a.forget(1)  # discarded everywhere: submitted again
        a.submit(1, None, torch.zeros(1, agree.ROW, dtype=torch.float64))
        assert a.wait(1).wave == 1 and a.newest == 1 and a.spoiled is None
    finally:
        a.stop()
        a.join(5)


def test_a_member_s_cap_travels_in_the_forming_table() -> None:
    rows = [tb.Row(10.0, cap=4), tb.Row(20.0)]
    got = tb.decode(torch.stack([tb.encode(r, 2, 3) for r in rows]), 2, 3)
    assert [r.cap for r in got] == [4, 0]


def test_the_pipeline_honours_the_job_s_scheduler() -> None:
    assert lacking(SimpleNamespace(scheduler=object()), PIPELINE_LACKS, "pipeline") is None


@pytest.mark.parametrize("field", ["grad_clip", "micro_batch", "max_steps", "eval_every_steps"])
def test_clipping_memory_limits_and_evaluations_are_honoured_in_both_modes(field: str) -> None:
    job = SimpleNamespace(**{field: 8})
    assert lacking(job, PIPELINE_LACKS, "pipeline") is None
    assert lacking(job, HYBRID_LACKS, "hybrid (staleness > 0)") is None


@pytest.mark.parametrize(("fields", "mode", "field"), [
    (PIPELINE_LACKS, "pipeline", f) for f in PIPELINE_LACKS])
def test_what_a_mode_still_refuses_is_one_line_naming_the_field_and_the_mode(
        fields: tuple[str, ...], mode: str, field: str) -> None:
    why = lacking(SimpleNamespace(**{field: 1.0}), fields, mode)
    assert why is not None and "\n" not in why
    assert f"Job.{field}" in why and f"the {mode} mode" in why
