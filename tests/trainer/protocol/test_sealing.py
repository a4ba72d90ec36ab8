"""Issue 30.7: the control port's frames are encrypted (an on-path observer reads no weights),
and refused handshakes are logged at a bounded rate."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from tests.fakes.wait import wait_for
from trainer.errors import AuthError, TokenRefused
from trainer.protocol import admission
from trainer.protocol.store import LOG_EVERY_S, StoreServer
from trainer.protocol.store_client import ControlStore
from trainer.state import codec

TOKEN = b"sealing-test-token"


def _pair() -> tuple[admission.Channel, admission.Channel]:
    hello, sn = admission.server_hello()
    answer, cn = admission.client_answer(TOKEN, hello)
    proof, server_chan = admission.server_check(TOKEN, sn, answer)
    return admission.client_check(TOKEN, hello, cn, proof), server_chan


def test_a_state_payload_is_not_readable_on_the_wire() -> None:
    weights = torch.full((256,), 1.2345678, dtype=torch.float32)
    body = codec.encode({"w": weights, "step": 7}).numpy().tobytes()
    client, server = _pair()
    frame = client.seal(body)
    assert weights.numpy().tobytes()[:16] not in frame and b'"step"' not in frame
    assert server.feed(frame) == [body]  # the peer holding the token reads it back whole
    other_client, _ = _pair()  # another connection's keys differ: the same body differs
    assert other_client.seal(body)[4:] != frame[4:]
    bad = bytearray(client.seal(body))
    bad[len(bad) // 2] ^= 0x40
    with pytest.raises(AuthError):
        server.feed(bytes(bad))


def test_refused_handshakes_write_one_warning_per_period(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    srv = StoreServer("127.0.0.1", 0, TOKEN, handshake_s=2.0)
    srv.start()
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="trainer.protocol.store"):
            for _ in range(12):
                with pytest.raises(TokenRefused):
                    ControlStore(*srv.address, b"a wrong token")
        assert wait_for(lambda: srv.counters["refused"] == 12, 60)
        elapsed = time.monotonic() - t0
        lines = [r for r in caplog.records if "refused a connection" in r.getMessage()]
        assert 1 <= len(lines) <= 1 + int(elapsed / LOG_EVERY_S), caplog.text
        assert "1 refused so far" in lines[0].getMessage()
    finally:
        srv.stop()
