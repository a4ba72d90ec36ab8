"""Issue 13's attacks, each against a real coordinator and real workers on loopback.

One ring (two worker processes training the digits example for long enough) serves every
test of this module; each test mounts one attack by someone who knows only host:port (or,
where said, a token holder who misbehaves), then checks that it failed and that the ring
kept training: the step moved on, the generation and members are the ones from before, the
job is not over and nobody was lost.
"""

from __future__ import annotations

import datetime
import io
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.ringutil import TOKEN, Ring, _context
from trainer.collective import groups as rg
from trainer.collective import sync
from trainer.errors import BadState, ControlLost, JoinRefused, TokenRefused
from trainer.protocol import messages as mb
from trainer.protocol.store import StoreServer
from trainer.protocol.store_client import ControlStore
from trainer.worker.client import connect, join

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ring]:
    tmp = tmp_path_factory.mktemp("security")
    r = Ring(tmp, job="examples/digits.py", env={"DIGITS_EPOCHS": "400"}, initial_world=2,
             heartbeat_timeout_s=5.0, rollcall_s=0.5)
    try:
        r.worker("w1")
        r.worker("w2")
        r.wait_for("the ring to train", lambda: r.coord.stats()["step"] >= 5, 120)
        yield r
    finally:
        r.close()


def _before(ring: Ring) -> dict[str, Any]:
    plan = ring.coord.plan()
    assert plan is not None
    return {"step": ring.coord.stats()["step"], "plan": plan,
            "lost": len(ring.events("lost"))}


def _still_training(ring: Ring, before: dict[str, Any], steps: int = 5) -> None:
    ring.wait_for("the ring to keep training",
                  lambda: ring.coord.stats()["step"] >= before["step"] + steps, 120)
    stats = ring.coord.stats()
    assert not stats["finished"] and stats["outcome"] == "running"
    assert ring.coord.plan() == before["plan"]  # no generation was forged or forced
    assert len(ring.events("lost")) == before["lost"]
    assert all(m.name in ("w1", "w2") for m in ring.coord.members())


def _raw(ring: Ring) -> socket.socket:
    return socket.create_connection(ring.coord.address, timeout=5)


def test_no_token_no_store_whatever_the_client(ring: Ring) -> None:
    """Forged generations, drains, verdicts, heartbeats, stats, an id and a hello: every
    write needs a connection, and no connection is served without the token."""
    before = _before(ring)
    host, port = ring.coord.address
    with pytest.raises(TokenRefused):
        ControlStore(host, port, b"guessed-token")
    with pytest.raises(JoinRefused, match="token"):
        connect(host, port, b"guessed-token", budget_s=2)
    # torch's own TCPStore client (the protocol of the store this replaced) gets nowhere
    with pytest.raises(Exception):  # noqa: B017 - any error: it must not connect
        torch.distributed.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=3))
    # raw writes: a TCPStore-style SET of gen/latest, then garbage of every length
    for payload in (b"\x00\x00\x00\x0agen/latest\x00\x00\x00\x0199", os.urandom(48),
                    os.urandom(4096), b"GET / HTTP/1.1\r\n\r\n"):
        s = _raw(ring)
        try:
            s.sendall(payload)
            s.settimeout(6)
            got = b""
            while True:  # the server answers nothing but its greeting and a refusal
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            assert len(got) <= len(b"SPOTRING-CTL1") + 16 + 32
        finally:
            s.close()
    _still_training(ring, before)
    assert ring.coord.stats()["rejected"]["refused"] >= 3


def test_a_stranger_cannot_join_a_generation_or_redirect_its_rendezvous(ring: Ring) -> None:
    """The NaN-gradient attack needs a place in a generation's process group: its
    rendezvous keys live in the authenticated store, out of a stranger's reach."""
    before = _before(ring)
    gen = before["plan"].generation
    host, port = ring.coord.address
    for target in (f"g{gen + 1}/0", f"g{gen}/1", mb.LATEST, mb.k_plan(gen + 1)):
        with pytest.raises(ControlLost):
            ControlStore(host, port, TOKEN[:-1] + b"?").set(target, b"attacker:1")
    _still_training(ring, before)


def test_a_thousand_idle_connections_do_not_keep_an_honest_joiner_out(ring: Ring) -> None:
    before = _before(ring)
    socks = []
    try:
        for _ in range(1000):
            socks.append(_raw(ring))
        t0 = time.monotonic()
        store = connect(*ring.coord.address, TOKEN, budget_s=10)
        member = join(store, mb.Hello("honest", 1.0, before["plan"].job), timeout_s=10)
        took = time.monotonic() - t0
        store.close()
    finally:
        for s in socks:
            s.close()
    assert member >= 1 and took < 5.0, took
    assert ring.coord.stats()["rejected"]["evicted"] >= 1000 - 256
    # the honest joiner holds the token but never trains (it is this test): it is dropped
    # like any joiner that never forms, and the two workers go on
    ring.wait_for("the silent joiner to be dropped", lambda: not any(
        m.name == "honest" for m in ring.coord.members()), 30)
    _still_training(ring, _before(ring))


def test_a_token_holder_writing_garbage_is_ignored_and_counted(ring: Ring) -> None:
    """Malformed hellos, stats, drains and reports from a process that holds the token: each
    is ignored and counted; the coordinator is not wedged and the job does not end."""
    before = _before(ring)
    store = ControlStore(*ring.coord.address, TOKEN)
    try:
        i = store.add(mb.IDS, 1)
        store.set(mb.k_hello(i), b"\xff\x00 not a hello")
        store.set(mb.STATS, b'{"finished": true, "step": "all of them"}')
        w1 = next(m.id for m in ring.coord.members() if m.name == "w1")
        store.set(mb.k_done(w1), b"garbage")  # w1 has not finished: a lie, and malformed
        store.add(mb.DONES, 1)
        verdict = store.get(mb.k_verdict(i))
    finally:
        store.close()
    assert verdict.startswith(b"refused: malformed")
    ring.wait_for("the malformed writes counted", lambda: ring.coord.stats()["malformed"] >= 2)
    _still_training(ring, before)  # rank 0's next report replaces the garbage stats


def test_the_coordinator_and_the_ring_listen_on_loopback_only(ring: Ring) -> None:
    host, port = ring.coord.address
    listening = _listening()
    assert [a for a, p, _ in listening if p == port] == ["127.0.0.1"]
    for name in ("w1", "w2"):
        pid = ring.procs[name].pid
        inodes = _socket_inodes(pid)
        mine = [(a, p) for a, p, ino in listening if ino in inodes]
        assert mine, f"{name} listens on nothing?"
        assert {a for a, _ in mine} == {"127.0.0.1"}, mine  # gloo too: no 0.0.0.0


def _listening() -> list[tuple[str, int, int]]:
    """(address, port, inode) of every IPv4 TCP socket listening in this network namespace."""
    out = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] != "0A":
            continue
        addr, port = f[1].split(":")
        ip = socket.inet_ntoa(bytes.fromhex(addr)[::-1])
        out.append((ip, int(port, 16), int(f[9])))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


# -- a pickle from a peer is never loaded ----------------------------------------------------------


class _Boom:
    """Unpickling this creates a file: the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _pickle_source(port: int, marker: str, q: Any) -> None:
    store = ControlStore("127.0.0.1", port, b"pickle-test")
    pg = rg.form_group(store, 1, 0, 2, 30.0, lambda: False, hostname="127.0.0.1").pg
    table = torch.zeros(2, 3, dtype=torch.float64)
    table[0, 0], table[0, 2] = 99, 99  # claims the newest step
    rg.allreduce(pg, table, lambda: False)
    buf = io.BytesIO()
    torch.save({"model": _Boom(marker), "step": 99}, buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    head = torch.tensor([payload.numel(), *sync._digest_words(payload)], dtype=torch.int64)
    rg.send(pg, [(head, 1, 1), (payload, 1, 2)], lambda: False)
    q.put("sent")


def _receiver(port: int, q: Any) -> None:
    store = ControlStore("127.0.0.1", port, b"pickle-test")
    pg = rg.form_group(store, 1, 1, 2, 30.0, lambda: False, hostname="127.0.0.1").pg
    try:
        sync.sync_state(pg, 1, 2, 5, False, dict, lambda: False)
        q.put("loaded")
    except BadState as e:
        q.put(f"rejected: {e}")


def test_a_pickle_claimed_as_the_newest_state_is_rejected_and_never_run(tmp_path: Path
                                                                         ) -> None:
    """Even from a member that holds the token: the state is decoded as tensors and plain
    data, so a pickle is refused (BadState) and its code never runs."""
    marker = tmp_path / "pwned"
    server = StoreServer("127.0.0.1", 0, b"pickle-test")
    server.start()
    ctx = _context()
    q = ctx.Queue()
    port = server.address[1]
    ps = [ctx.Process(target=_pickle_source, args=(port, str(marker), q)),
          ctx.Process(target=_receiver, args=(port, q))]
    try:
        for p in ps:
            p.start()
        got = sorted(q.get(timeout=60) for _ in ps)
    finally:
        for p in ps:
            p.join(10)
            if p.exitcode is None:
                p.kill()
        server.stop()
    assert got[0].startswith("rejected") and got[1] == "sent", got
    assert not marker.exists()


def test_the_token_file_is_created_0600_atomically(tmp_path: Path) -> None:
    from trainer.protocol.admission import read_token_file, token_file_warning, write_token_file

    path = tmp_path / "token"
    old = os.umask(0)
    try:
        token = write_token_file(path)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_token_file(path) == token and len(token) >= 32
    assert token_file_warning(path) is None
    assert [p.name for p in tmp_path.iterdir()] == ["token"]  # no temporary left behind
    path.chmod(0o644)
    assert "chmod 600" in (token_file_warning(path) or "")


def test_a_coordinator_asked_for_loopback_is_unreachable_from_another_host(tmp_path: Path
                                                                          ) -> None:
    """Two hosts for real: a network namespace joined to this one by a veth pair. The
    coordinator listens where it is told: on 127.0.0.1 the other host cannot reach it; on
    the veth address it can."""
    from tests.fakes.netns import Netns, NetnsUnavailable

    try:
        ns = Netns.create("srsec", host_addr="10.213.7.1", ns_addr="10.213.7.2")
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    try:
        probe = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], "
                 "int(sys.argv[2])), timeout=3).close(); print('open')\n"
                 "except OSError as e: print('closed', e)")
        for host, expect in (("127.0.0.1", "closed"), ("10.213.7.1", "open")):
            from trainer.control.coordinator import Coordinator

            c = Coordinator(host, 0, TOKEN)
            c.start()
            try:
                port = c.address[1]
                out = ns.run(["python3", "-c", probe, "10.213.7.1", str(port)])
                assert out.split()[0] == expect, (host, out)
            finally:
                c.stop()
    finally:
        ns.destroy()


def test_netns_helper_runs_commands_inside(tmp_path: Path) -> None:
    from tests.fakes.netns import Netns, NetnsUnavailable

    try:
        ns = Netns.create("srchk", host_addr="10.213.8.1", ns_addr="10.213.8.2")
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    try:
        out = ns.run(["ip", "-4", "-o", "addr", "show"])
        assert "10.213.8.2" in out
    finally:
        ns.destroy()
    assert subprocess.run(["ip", "netns", "list"], capture_output=True,
                          text=True).stdout.find("srchk") < 0
