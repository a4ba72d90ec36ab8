"""The control store: the token handshake, sealed frames, and the store's semantics."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from trainer.errors import AuthError, ControlLost, ControlTimeout, Malformed, TokenRefused
from trainer.protocol import admission
from trainer.protocol import store as wire
from trainer.protocol.store import StoreServer
from trainer.protocol.store_client import ControlStore

TOKEN = b"store-test-token"


@pytest.fixture()
def server() -> Iterator[StoreServer]:
    s = StoreServer("127.0.0.1", 0, TOKEN, handshake_s=1.0, max_pending=8)
    s.start()
    yield s
    s.stop()


def test_handshake_proves_the_token_both_ways() -> None:
    hello, sn = admission.server_hello()
    answer, cn = admission.client_answer(TOKEN, hello)
    proof, server_chan = admission.server_check(TOKEN, sn, answer)
    client_chan = admission.client_check(TOKEN, hello, cn, proof)
    with pytest.raises(AuthError):
        admission.server_check(b"other", sn, answer)
    with pytest.raises(AuthError):  # a server that does not hold the token
        admission.client_check(TOKEN, hello, cn, bytes(reversed(proof)))
    with pytest.raises(TokenRefused):
        admission.client_check(TOKEN, hello, cn, admission.REFUSED)
    # frames: in order they open; altered, replayed or reordered they do not
    f1, f2 = client_chan.seal(b"one"), client_chan.seal(b"two")
    assert server_chan.feed(f1 + f2[:5]) == [b"one"]
    assert server_chan.feed(f2[5:]) == [b"two"]
    with pytest.raises(AuthError):
        server_chan.feed(f1)  # a replay
    fresh = admission.client_check(TOKEN, hello, cn, proof)
    srv = admission.server_check(TOKEN, sn, answer)[1]
    bad = bytearray(fresh.seal(b"set gen/latest 9"))
    bad[6] ^= 1
    with pytest.raises(AuthError):
        srv.feed(bytes(bad))


def test_request_bodies_are_checked() -> None:
    body = wire.encode_request(wire.SET, [b"k", b"v"], 5)
    assert wire.decode_request(body) == (wire.SET, 5, [b"k", b"v"])
    for bad in (b"", b"\x63\x00\x00\x00\x00\x00\x00", body[:-1], body + b"x"):
        with pytest.raises(Malformed):
            wire.decode_request(bad)


def test_store_semantics(server: StoreServer) -> None:
    c = ControlStore(*server.address, TOKEN, timeout_s=1.0)
    c.set("a", b"1")
    assert c.get("a") == b"1" and c.check(["a"]) and not c.check(["a", "b"])
    assert c.add("n", 2) == 2 and c.add("n", -1) == 1
    assert c.multi_get(["a", "n"]) == [b"1", b"1"]
    assert c.compare_set("a", b"1", b"2") == b"2" and c.compare_set("a", b"1", b"3") == b"2"
    assert c.compare_set("new", b"", b"x") == b"x"
    c.append("a", b"+")
    assert c.get("a") == b"2+" and c.delete_key("a") and not c.check(["a"])
    with pytest.raises(ControlTimeout):
        c.get("missing")
    threading.Timer(0.1, lambda: server.local_set("late", b"v")).start()
    c.wait(["late"])  # a local write wakes the remote waiter
    assert server.local_get("n") == b"1"
    c.set("text", b"not a number")
    with pytest.raises(ControlLost, match="refused a request"):
        c.add("text", 1)
    assert c.get("text") == b"not a number"  # refused, changed nothing, connection fine
    assert server.counters["malformed"] == 1
    c.close()


def test_a_wrong_token_is_refused_and_counted(server: StoreServer) -> None:
    with pytest.raises(TokenRefused, match="token-file"):
        ControlStore(*server.address, b"wrong")
    time.sleep(0.1)
    assert server.counters["refused"] == 1


def test_silent_connections_are_closed_and_the_oldest_make_room(server: StoreServer) -> None:
    socks = [socket.create_connection(server.address) for _ in range(20)]
    try:
        c = ControlStore(*server.address, TOKEN)  # served despite the 20 silent ones
        c.set("ok", b"1")
        time.sleep(1.5)  # past handshake_s: the remaining silent ones are closed
        assert server.counters["evicted"] >= 20 - 8
        assert server.counters["unauthenticated_closed"] >= 20
        assert c.get("ok") == b"1"  # an authenticated connection is not affected
    finally:
        for s in socks:
            s.close()


def test_a_client_reconnects_after_the_server_comes_back() -> None:
    s1 = StoreServer("127.0.0.1", 0, TOKEN)
    s1.start()
    port = s1.address[1]
    c = ControlStore("127.0.0.1", port, TOKEN)
    c.set("k", b"1")
    s1.stop()
    with pytest.raises(ControlLost):
        c.get("k")
    s2 = StoreServer("127.0.0.1", port, TOKEN)
    s2.start()
    try:
        c.set("k", b"2")  # the next call connects again
        assert c.get("k") == b"2"
    finally:
        s2.stop()


def test_stopping_with_clients_waiting_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """A coordinator that ends while workers still wait on keys (the daemon's Ctrl-C with a
    kept fleet) stops quietly: no task traceback per open connection."""
    s = StoreServer("127.0.0.1", 0, TOKEN)
    s.start()
    clients = [ControlStore("127.0.0.1", s.address[1], TOKEN) for _ in range(3)]
    waiting = []
    for c in clients:
        c.set("up", b"1")
        t = threading.Thread(target=lambda c=c: _wait_quietly(c), daemon=True)
        t.start()
        waiting.append(t)
    time.sleep(0.3)  # the waits are in the server
    with caplog.at_level("ERROR"):
        s.stop()
        for t in waiting:
            t.join(10)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    assert not any(t.is_alive() for t in waiting)


def _wait_quietly(c: ControlStore) -> None:
    try:
        c.wait(["never-set"], timeout=30.0)
    except (ControlLost, ControlTimeout):
        pass
