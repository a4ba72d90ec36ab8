"""The protocol's messages (pure): plan round trips, validation of what the store holds, the
verdict of a job that is over."""

from __future__ import annotations

import pytest

from trainer.errors import Malformed
from trainer.protocol import messages as mb
from trainer.protocol.messages import JobOutcome, Plan, finished_verdict, verdict_outcome


def test_plan_json_round_trip() -> None:
    p = Plan(5, (1, 2), ("a", "b"), joined=(2,), drained=(3,), lost=(4,),
             priors={"b/2": 12.5}, reason="why")
    assert Plan.from_json(p.to_json()) == p


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"name": ""}', b'{"name": 5}',
                                 b'{"name": "a", "prior": "fast"}',
                                 b'{"name": "a", "prior": Infinity}', "x" * 10, b"\xff\xfe"])
def test_a_malformed_hello_is_refused_as_malformed(raw: bytes) -> None:
    with pytest.raises(Malformed):
        mb.Hello.parse(raw)


def test_messages_round_trip_and_reject_wrong_types() -> None:
    h = mb.Hello("w", 12.5, "abc")
    assert mb.Hello.parse(h.to_json()) == h
    f = mb.Formed("c0ffee", 10, 1, 0, 100, 2.5)
    assert mb.Formed.parse(f.to_json()) == f
    p = mb.ProgressReport(3, 40, 2, 2560, 2, 0.5, {"accuracy": 0.9, "r2": float("nan")})
    q = mb.ProgressReport.parse(p.to_json())
    assert q.step == 40 and q.metrics["accuracy"] == 0.9
    for bad in (b'{"step": -1}', b'{"step": true}', b'{"metrics": {"a": "x"}}',
                b'{"finished": true, "step": "9"}'):
        with pytest.raises(Malformed):
            mb.ProgressReport.parse(bad)
    with pytest.raises(Malformed):
        mb.Formed.parse(b'{"checksum": 5, "step": 1}')
    with pytest.raises(Malformed):
        mb.Plan.from_json(b'{"generation": 2, "members": [1, 1], "names": ["a", "a"]}')
    with pytest.raises(Malformed):
        mb.Plan.from_json(b'{"generation": 0, "members": [], "names": []}')
    assert mb.parse_drain(b"") == "drain requested"


def test_the_verdict_for_a_job_that_is_over_says_how_it_ended() -> None:
    for outcome in (JobOutcome.DONE, JobOutcome.LOST, JobOutcome.FAILED):
        assert verdict_outcome(finished_verdict(outcome).decode()) is outcome
    assert verdict_outcome("finished: the job is over") is JobOutcome.DONE  # said nothing more
    assert verdict_outcome("refused: a different job") is None
    assert verdict_outcome("ok") is None
