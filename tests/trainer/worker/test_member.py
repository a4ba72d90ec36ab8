"""The member skeleton: what every mode gets from it without a copy (the commit bookkeeping,
the metrics line, the head's duties, the failure report), against a real control store and
with a stand-in mode; and that the three real modes leave that bookkeeping to it."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from torch.utils.data import TensorDataset

from trainer.errors import JobCodeError
from trainer.job import Job, StepContext
from trainer.protocol import messages as mb
from trainer.protocol.store import StoreServer
from trainer.protocol.store_client import ControlStore
from trainer.state.training import TrainingState
from trainer.worker.decision import Leave, MemberOutcome
from trainer.worker.member import Member
from trainer.worker.modes.base import Commit, Duties, Unsettled
from trainer.worker.outputs import Outputs

MODES = Path(__file__).resolve().parents[3] / "trainer" / "worker" / "modes"


class _Mode:
    """A stand-in mode: the head is rank 0; the whole model is gathered on demand."""

    def __init__(self, member: Member) -> None:
        self.m = member
        self.gathered = 0
        self.calls: list[str] = []  # epoch ends seen, in order with the evaluations

    def epoch_ended(self, epoch: int) -> None:
        self.calls.append(f"epoch {epoch} ended")

    def is_head(self) -> bool:
        return self.m.rank == 0

    @contextmanager
    def whole_model(self) -> Iterator[bool]:
        self.gathered += 1
        yield self.is_head()

    def checksum(self) -> str:
        return self.m.w.state.checksum()

    def problem(self) -> str | None:
        return None

    def close(self) -> None:
        pass

    def unsettled(self) -> Unsettled | None:
        return Unsettled(4, self.m.id, 10, 1, (1, 2))  # a step in flight


class _Heartbeat:
    export = 0
    snapshot_now = 0  # the coordinator's requests for a snapshot now (none here)
    stats: str | None = None
    report = None

    def lost_is_recent(self) -> bool:  # the coordinator answers
        return False


@pytest.fixture
def store() -> Iterator[ControlStore]:
    server = StoreServer("127.0.0.1", 0, b"t")
    server.start()
    try:
        yield ControlStore(*server.address, b"t")
    finally:
        server.stop()


def _member(store: ControlStore, tmp: Path, rank: int = 0, evaluate: Any = None,
            **fields: Any) -> Member:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if fields.get("scheduler") == "steplr":
        fields["scheduler"] = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    job = Job(model=model, optimizer=opt, loss_fn=torch.nn.functional.mse_loss,
              train_set=TensorDataset(torch.zeros(10, 2), torch.zeros(10, 1)),  # 10 per epoch
              global_batch=4, epochs=2, evaluate=evaluate, **fields)
    out = Outputs("job.py", metrics_file=tmp / "m.jsonl", record_samples=tmp / "s.jsonl",
                  output=tmp / "model.pt")
    w = SimpleNamespace(job=job, state=TrainingState(model, job.optimizer, None, "fp",
                                                     scheduler=job.scheduler,
                                                     extra=job.extra_state),
                        outputs=out, cfg=SimpleNamespace(job="job.py", record_digests=False),
                        notice=None,
                        failure=None, unsettled=None)
    m = Member(w, store, 3, _Heartbeat(), _Mode)  # type: ignore[arg-type]
    m.rank, m.plan = rank, mb.Plan(4, (3, 8) if rank == 0 else (8, 3), ("a", "b"))
    m.export_seen = m.hb.export  # as forming does: requests before it are not this one's
    return m


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_commit_moves_the_progress_records_the_samples_and_writes_the_line(
        store: ControlStore, tmp_path: Path) -> None:
    m = _member(store, tmp_path)
    m.commit(Commit(4, 0.5, [1, 2], {"batch": 2}))
    m.commit(Commit(4, 0.25, [5], {"batch": 1}))
    p = m.w.state.progress
    assert (p.step, p.cursor.cursor, p.samples_done) == (2, 8, 8)
    assert [(r["step"], r["member"], r["ids"]) for r in _lines(tmp_path / "s.jsonl")] == [
        (0, 3, [1, 2]), (1, 3, [5])]
    lines = _lines(tmp_path / "m.jsonl")
    assert [(r["step"], r["loss"], r["batch"], r["member"], r["generation"], r["world"])
            for r in lines] == [(1, 0.5, 2, "a/3", 4, 2), (2, 0.25, 1, "a/3", 4, 2)]
    report = mb.ProgressReport.parse(m.hb.stats)  # the head reports its progress
    assert (report.step, report.samples_done, report.loss) == (2, 8, 0.25)
    m.commit(Commit(2, 0.1, [9], quiet=True))  # rolled forward: counted, nothing written
    assert m.w.state.progress.step == 3 and len(_lines(tmp_path / "m.jsonl")) == 2
    assert len(_lines(tmp_path / "s.jsonl")) == 3


def test_a_member_records_the_samples_of_a_gone_one_under_its_id(store: ControlStore,
                                                                  tmp_path: Path) -> None:
    m = _member(store, tmp_path)
    m.record_samples(7, 1, [4, 5], member=5)
    assert _lines(tmp_path / "s.jsonl") == [
        {"epoch": 1, "step": 7, "member": 5, "ids": [4, 5], "by": 3}]


def _generation(store: ControlStore, gen: int, members: tuple[int, ...], formed: int,
                step: int) -> None:
    """A generation as the coordinator and its members leave it in the store: the plan,
    ``formed`` of its members' formed reports (each at ``step``) and their count."""
    store.set(mb.k_plan(gen), mb.Plan(gen, members, tuple(f"n{i}" for i in members)).to_json())
    store.add(mb.k_formed_count(gen), 0)
    for i in members[:formed]:
        store.set(mb.k_formed(gen, i), mb.Formed("c", step).to_json())
        store.add(mb.k_formed_count(gen), 1)


def test_a_dropped_member_keeps_its_step_in_flight_for_the_worker(store: ControlStore,
                                                                  tmp_path: Path) -> None:
    m = _member(store, tmp_path)
    assert m._leave(Leave(MemberOutcome.DRAINED)) is MemberOutcome.DRAINED
    assert m.w.unsettled is None  # only a dropped membership may leave one unsettled
    assert m._leave(Leave(MemberOutcome.REFUSED)) is MemberOutcome.REFUSED
    assert m.w.unsettled == Unsettled(4, 3, 10, 1, (1, 2))


@pytest.mark.parametrize("between, agreed, kept", [
    ([(5, 2, 11)], 0, True),             # the generation after it formed past the step
    ([(5, 2, 10)], 0, False),            # ... at the step: it was discarded, computed again
    ([(5, 1, 11), (6, 2, 10)], 0, False),  # 5 broke while forming: 6 decides
    ([(5, 0, 0), (6, 1, 0)], 11, True),  # none formed between: this generation decides
    ([(5, 0, 0), (6, 1, 0)], 10, False),
    ([], 11, None),                      # 5 and 6 are gone from the store: cannot tell
])
def test_a_rejoined_worker_records_its_dropped_step_if_the_ring_kept_it(
        store: ControlStore, tmp_path: Path, between: list[tuple[int, int, int]], agreed: int,
        kept: bool | None, caplog: pytest.LogCaptureFixture) -> None:
    for gen, formed, step in between:
        _generation(store, gen, (8, 9), formed, step)
    m = _member(store, tmp_path)  # the worker again, as a new member (3), forming 7
    m.w.state.progress = dataclasses.replace(m.w.state.progress, step=agreed)
    m.settle(Unsettled(4, 2, 10, 1, (1, 2)), 7)
    recs = _lines(tmp_path / "s.jsonl")
    if kept:
        assert recs == [{"epoch": 1, "step": 10, "member": 2, "ids": [1, 2], "by": 3}]
    else:
        assert recs == []
    assert ("no longer known" in caplog.text) == (kept is None)


def test_the_export_request_is_the_head_s_duty_whatever_the_mode(store: ControlStore,
                                                                  tmp_path: Path) -> None:
    """The coordinator's request (its export counter, seen by the heartbeat) is claimed
    once, by the head, and written from inside the mode's whole-model context."""
    m = _member(store, tmp_path)
    m.commit(Commit(2, 0.1))
    assert not (tmp_path / "model.pt").exists() and m.mode.gathered == 0
    m.hb.export = 1  # the coordinator asked
    m.commit(Commit(2, 0.1))
    assert (tmp_path / "model.pt").exists() and m.mode.gathered == 1
    (tmp_path / "model.pt").unlink()
    m.commit(Commit(2, 0.1))  # claimed: not written again
    assert not (tmp_path / "model.pt").exists()
    (tmp_path / "x").mkdir()
    other = _member(store, tmp_path / "x", rank=1)
    other.hb.export = 1
    other.commit(Commit(2, 0.1))
    assert not (tmp_path / "x" / "model.pt").exists()  # not the head: not its duty


def test_duties_agreed_in_a_reduction_reach_every_member_that_takes_part(
        store: ControlStore, tmp_path: Path) -> None:
    """A mode that agrees on the duties in its reduction (the pipeline) hands them over:
    every member enters the whole-model context (VW 0 gathers), only the head writes."""
    head, other = _member(store, tmp_path, 0), _member(store, tmp_path, 1)
    for m in (head, other):
        m.commit(Commit(2, 0.1, duties=Duties(export=True)))
        assert m.mode.gathered == 1
    assert (tmp_path / "model.pt").exists()


def test_the_evaluation_runs_on_the_head_at_an_epoch_end(store: ControlStore,
                                                         tmp_path: Path) -> None:
    calls: list[str] = []
    m = _member(store, tmp_path, evaluate=lambda model: calls.append("evaluate") or {"acc": 0.75})
    m.mode.calls = calls
    m.commit(Commit(6, 0.1))
    assert not calls
    m.commit(Commit(4, 0.1))  # the epoch (10 samples) ends
    # the members compare their digests first: none waits for the head's evaluation
    assert calls == ["epoch 0 ended", "evaluate"] and m.w.state.metrics == {"acc": 0.75}
    assert mb.ProgressReport.parse(m.hb.stats).metrics == {"acc": 0.75}


def test_the_scheduler_and_after_step_run_on_every_member_on_step_on_the_head_only(
        store: ControlStore, tmp_path: Path) -> None:
    """Issue 26: the scheduler steps once per committed step (on every member, so the lr
    stays the same everywhere); after_step runs on every member, on_step on the head only,
    with a context naming the step, the lr for the next step, the rank and the run id."""
    seen: dict[int, list[StepContext]] = {0: [], 1: []}
    logged: list[StepContext] = []
    members = []
    for rank in (0, 1):
        (tmp_path / str(rank)).mkdir()
        members.append(_member(store, tmp_path / str(rank), rank, scheduler="steplr",
                               after_step=seen[rank].append, on_step=logged.append))
    for m in members:
        m.commit(Commit(4, 0.5))
        m.commit(Commit(4, 0.5, quiet=True))
        assert m.w.job.optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    assert [(c.step, c.rank, c.world, c.lr) for c in seen[0] + seen[1]] == [
        (1, 0, 2, 0.05), (2, 0, 2, 0.025), (1, 1, 2, 0.05), (2, 1, 2, 0.025)]
    assert [c.step for c in logged] == [1] and logged[0].run_id == members[0].w.state.run_id
    assert _lines(tmp_path / "0" / "m.jsonl")[0]["lr"] == 0.05


def test_evaluate_every_n_steps_and_its_step_in_the_progress_report(store: ControlStore,
                                                                   tmp_path: Path) -> None:
    m = _member(store, tmp_path, evaluate=lambda model: {"mse": 1.0}, eval_every_steps=2)
    m.commit(Commit(2, 0.1))
    assert m.w.state.metrics_step == -1
    m.commit(Commit(2, 0.1))
    assert m.w.state.metrics_step == 2
    assert mb.ProgressReport.parse(m.hb.stats).metrics_step == 2


def test_a_scheduler_stepped_in_evaluate_is_caught_and_named(store: ControlStore,
                                                             tmp_path: Path) -> None:
    """The anchor's bug: ``scheduler.step()`` in evaluate runs on rank 0 only; the members
    would train with different learning rates. It ends the run with the cause named."""
    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        m.w.job.scheduler.step()
        return {}

    m = _member(store, tmp_path, evaluate=evaluate, scheduler="steplr")
    m.commit(Commit(6, 0.1))
    with pytest.raises(JobCodeError, match="evaluate changed optimizer, scheduler .*learning "
                                           "rate 0.025 -> 0.0125.*Job.scheduler"):
        m.commit(Commit(4, 0.1))


def test_a_failure_is_reported_once_and_stops_the_generation(store: ControlStore,
                                                             tmp_path: Path) -> None:
    m = _member(store, tmp_path)
    assert m.fail("job job.py: the job's forward raised") is MemberOutcome.FAILED
    got = mb.JobFailure.parse(store.get(mb.k_error(3)))
    assert got.message == "job job.py: the job's forward raised" and got.step == 0
    assert store.add(mb.ERRORS, 0) == 1 and store.add(mb.k_broken(4), 0) == 1
    assert m.w.failure == got.message


def test_a_mode_that_cannot_train_the_job_fails_it_naming_the_job(store: ControlStore,
                                                                  tmp_path: Path) -> None:
    m = _member(store, tmp_path)
    m.mode.problem = lambda: "Job.pipeline must be a trainer.pipeline.PipelineSettings"
    m.plan = None
    assert m.live() is MemberOutcome.FAILED
    assert mb.JobFailure.parse(store.get(mb.k_error(3))).message == (
        "job job.py: Job.pipeline must be a trainer.pipeline.PipelineSettings")


@pytest.mark.parametrize("mode", ["ring", "pipeline", "hybrid"])
def test_the_modes_leave_the_bookkeeping_to_the_skeleton(mode: str) -> None:
    """No mode moves the progress, writes a metrics line, takes a snapshot, writes the model,
    reports progress or a failure itself: each hands its updates to ``Member.commit``."""
    tree = ast.parse((MODES / f"{mode}.py").read_text())
    banned_attrs = {"progress"}  # assigned
    banned_calls = {"step_record", "write_model", "snapshot", "finish_model", "evaluate",
                    "start_snapshots", "fail", "k_error", "k_done"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr in banned_attrs | {"stats"}:
                    found.append(f"assigns .{t.attr} (line {node.lineno})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in banned_calls):
            found.append(f"calls .{node.func.attr} (line {node.lineno})")
    commits = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(
        n.func, ast.Attribute) and n.func.attr == "commit"]
    assert not found, found
    assert commits, f"{mode} applies no update through Member.commit"
