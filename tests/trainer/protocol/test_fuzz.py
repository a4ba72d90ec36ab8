"""Issue 30.6: every parser of network or disk input, driven with deeply nested, huge,
truncated and type-confused input (hypothesis), fails only as ``Malformed`` (or the state's
``BadState``); and a coordinator fed such input under every key a token holder may write
keeps answering honest joins."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.trainer.control.test_decide import World
from trainer.errors import BadState, Malformed
from trainer.protocol import messages as mb
from trainer.protocol import store as wire
from trainer.state import codec
from trainer.state import snapshot as snap

# one valid example of each message: truncated and type-confused variants start from these
VALID: dict[str, bytes] = {
    "hello": mb.Hello("w", 3.0, "job1").to_json().encode(),
    "formed": mb.Formed("c", 3).to_json().encode(),
    "stats": mb.ProgressReport(1, 5, 0, 40, 2, 0.5, {"accuracy": 0.9}).to_json().encode(),
    "speed": mb.Speed(10.0, 8).to_json().encode(),
    "done": mb.Done("c", 40, {"accuracy": 0.9}).to_json().encode(),
    "error": mb.JobFailure(3, "boom").to_json().encode(),
    "report": mb.Report(7, "w", mb.Plan(1, (7,), ("w",)).to_json()).to_json().encode(),
    "plan": mb.Plan(2, (7, 8), ("a", "b"), joined=(8,)).to_json().encode(),
    "manifest": snap.Manifest("step-0000000001-00000000", 1, 0, 0, 1, "a" * 64, "job1",
                              1.0).to_json().encode(),
}

PARSERS: dict[str, Callable[[bytes], Any]] = {
    "hello": mb.Hello.parse, "formed": mb.Formed.parse, "stats": mb.ProgressReport.parse,
    "speed": mb.Speed.parse, "done": mb.Done.parse, "error": mb.JobFailure.parse,
    "report": mb.Report.parse, "plan": mb.Plan.from_json, "manifest": snap.Manifest.parse,
    "reports": lambda raw: mb.parse_reports(raw), "drain": mb.parse_drain,
    "state": codec.decode, "request": wire.decode_request, "response": wire.decode_response,
}

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c,
                                                                           max_size=4),
                     max_leaves=20)


@st.composite
def hostile(draw: Any) -> bytes:
    """Deeply nested, huge, truncated or type-confused bytes."""
    kind = draw(st.sampled_from(["nested", "huge", "truncated", "confused", "bytes"]))
    if kind == "nested":
        n = draw(st.integers(17, 200_000))
        return draw(st.sampled_from([b"[" * n, b'{"a":' * n, b"[" * n + b"]" * n]))
    if kind == "huge":
        n = draw(st.integers(1 << 16, (1 << 20) + 64))
        return draw(st.sampled_from([b'{"name": "' + b"x" * n + b'"}', b"1" * n,
                                     b'{"step": ' + b"9" * min(n, 4000) + b"}"]))
    base = VALID[draw(st.sampled_from(sorted(VALID)))]
    if kind == "truncated":
        return base[:draw(st.integers(0, len(base) - 1))]
    if kind == "confused":
        d = json.loads(base)
        key = draw(st.sampled_from(sorted(d)))
        d[key] = draw(_json)
        return json.dumps(d).encode()
    return draw(st.binary(max_size=200))


def _only_malformed(parse: Callable[[bytes], Any], raw: bytes) -> None:
    try:
        parse(raw)
    except (Malformed, BadState):
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(st.sampled_from(sorted(PARSERS)), hostile())
def test_every_parser_fails_only_as_malformed(which: str, raw: bytes) -> None:
    _only_malformed(PARSERS[which], raw)


KEYS = [mb.k_drain, mb.k_done, mb.k_error, mb.k_speed]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(st.lists(hostile(), min_size=1, max_size=4))
def test_the_coordinator_keeps_answering_joins_whatever_a_token_holder_writes(
        junk: list[bytes]) -> None:
    w = World()
    a = w.hello(mb.Hello("a", 10.0, "job1").to_json())
    b = w.hello(mb.Hello("b", 10.0, "job1").to_json())
    w.tick()
    w.form_all()
    w.beat(a, b)
    w.tick()
    for raw in junk:  # under every key a member writes, and as a hello of its own
        bad = w.hello(raw)
        for key in KEYS:
            w.kv[key(b)] = raw
        w.kv[mb.STATS] = raw
        w.kv[mb.SNAPSHOTS] = raw
        w.kv[mb.SNAPSHOT] = raw
        w.kv[mb.k_formed(1, b)] = raw
        for counter in (mb.DRAINS, mb.DONES, mb.ERRORS):
            w.add(counter)
        w.beat(a, b)
        w.tick()
        assert w.kv.get(mb.k_verdict(bad), b"").startswith((b"refused", b"ok"))
    honest = w.hello(mb.Hello("honest", 5.0, "job1").to_json())
    w.beat(a, b)
    w.tick()
    if w.ring.outcome is mb.JobOutcome.RUNNING:
        assert w.kv[mb.k_verdict(honest)] == b"ok"
    else:  # junk under done/error may end the job (a token holder can): it still answers
        assert w.kv[mb.k_verdict(honest)].startswith(b"finished")


def test_a_restarted_coordinator_reads_hostile_reports_without_falling_over() -> None:
    w = World()
    w.kv[mb.REPORTS] = b"\n".join([b"[" * 100_000, b'{"member_id": 1' * 3, b"\xff" * 10,
                                   b'{"member_id": 1e999, "name": "x"}',
                                   b'{"member_id": ' + b"9" * 400 + b', "name": "x"}'] * 1000)
    w.tick()
    a = w.hello(mb.Hello("a", 10.0, "job1").to_json())
    b = w.hello(mb.Hello("b", 10.0, "job1").to_json())
    for _ in range(80):
        w.tick()
    assert w.kv[mb.k_verdict(a)] == b"ok" and w.kv[mb.k_verdict(b)] == b"ok"
    assert w.ring.malformed > 0
