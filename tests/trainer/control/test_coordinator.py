"""The coordinator's protocol with simulated members (authenticated store clients in this
process, no gloo)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from trainer.control.coordinator import Coordinator
from trainer.protocol import messages as mb
from trainer.protocol.store_client import ControlStore
from trainer.worker.client import join

TOKEN = b"coordinator-test-token"


class _Sim:
    """A simulated member: admitted by the real handshake, beats until told to stop."""

    def __init__(self, coord: Coordinator, name: str) -> None:
        host, port = coord.address
        self.store = ControlStore(host, port, TOKEN)
        self.id = join(self.store, mb.Hello(name, 100.0, "job-a"))
        self.alive = threading.Event()
        self.alive.set()
        self.stop = threading.Event()
        self._beat_store = self.store.clone()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self.stop.is_set():
            if self.alive.is_set():
                self._beat_store.add(mb.k_heartbeat(self.id), 1)
            time.sleep(0.03)

    def form(self, gen: int) -> None:
        self.store.set(mb.k_formed(gen, self.id), mb.Formed("c0ffee", 10).to_json())
        self.store.add(mb.k_formed_count(gen), 1)


@pytest.fixture()
def coord() -> Iterator[Coordinator]:
    c = Coordinator("127.0.0.1", 0, TOKEN, heartbeat_timeout_s=30.0, rollcall_s=0.3,
                    initial_world=3)
    c.start()
    yield c
    c.stop()


def _wait(pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_a_failure_while_the_next_generation_forms_recovers_without_the_heartbeat_timeout(
        coord: Coordinator) -> None:
    sims = [_Sim(coord, n) for n in ("a", "b", "c")]
    _wait(lambda: coord.plan() is not None)
    assert coord.plan().generation == 1  # type: ignore[union-attr]
    for s in sims:
        s.form(1)
    _wait(lambda: coord.stats()["generation"] == 1 and any(
        e["kind"] == "formed" for e in coord.events()))
    joiner = _Sim(coord, "j")
    _wait(lambda: coord.plan().generation == 2)  # type: ignore[union-attr]
    # Before generation 2 forms, c dies in generation 1's last step: a reports it.
    sims[2].alive.clear()
    t0 = time.monotonic()
    sims[0].store.add(mb.k_broken(1), 1)
    _wait(lambda: coord.plan().generation == 3, 10)  # type: ignore[union-attr]
    took = time.monotonic() - t0
    plan = coord.plan()
    assert plan is not None and plan.lost == (sims[2].id,)
    assert set(plan.members) == {sims[0].id, sims[1].id, joiner.id}
    assert took < 10  # well under the 30 s heartbeat timeout: the roll call decided
    assert coord.stats()["generation"] == 3
    lost = [e for e in coord.events() if e["kind"] == "lost"]
    assert [e["name"] for e in lost] == ["c"]
    time.sleep(0.3)
    assert coord.plan().generation == 3  # type: ignore[union-attr]  # and it stays there
    for s in [*sims, joiner]:
        s.stop.set()


def test_members_and_drain_by_name(coord: Coordinator) -> None:
    sims = [_Sim(coord, n) for n in ("a", "b", "c")]
    _wait(lambda: coord.plan() is not None)
    for s in sims:
        s.form(1)
    _wait(lambda: all(m.state == "active" for m in coord.members()))
    assert [m.name for m in coord.members()] == ["a", "b", "c"]
    assert coord.drain("b", "spot notice")
    _wait(lambda: coord.plan().generation == 2)  # type: ignore[union-attr]
    plan = coord.plan()
    assert plan is not None and plan.drained == (sims[1].id,)
    assert [m.name for m in coord.members()] == ["a", "c"]
    kinds = [e["kind"] for e in coord.events()]
    assert "drain" in kinds and "leave" in kinds
    for s in sims:
        s.stop.set()


def test_a_member_that_reported_its_end_makes_the_job_completing_before_the_next_tick(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    # A member reports its end and its process exits; on a loaded machine the daemon can see
    # the exit before the protocol thread's next tick reads the report. The job must read as
    # completing from the report itself, or the daemon replaces an instance that finished
    # (a second instance launched after the end of `provision run`, seen in CI).
    sims = [_Sim(coord, n) for n in ("a", "b", "c")]
    _wait(lambda: coord.plan() is not None)
    for s in sims:
        s.form(1)
    _wait(lambda: all(m.state == "active" for m in coord.members()))
    assert coord.stats()["completing"] is False
    with coord._lock:  # no tick after this one: the protocol thread is starved
        monkeypatch.setattr(coord, "_tick", lambda: None)
    sims[0].store.set(mb.k_done(sims[0].id), mb.Done("c0ffee", 10, {}).to_json())
    sims[0].store.add(mb.DONES, 1)
    stats = coord.stats()
    assert stats["completing"] is True and stats["finished"] is False
    for s in sims:
        s.stop.set()


def test_the_end_of_the_job_is_recorded_beside_its_snapshots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trainer.protocol.admission import derive_key
    from trainer.state import snapshot as snap

    c = Coordinator("127.0.0.1", 0, TOKEN, heartbeat_timeout_s=30.0, rollcall_s=0.3,
                    initial_world=1,
                    snapshot=snap.SnapshotSettings(str(tmp_path / "snaps"), every_s=60.0))
    c.start()
    try:
        m = _Sim(c, "a")
        _wait(lambda: c.plan() is not None)
        m.form(1)
        _wait(lambda: c.stats()["generation"] == 1 and not c._busy())
        assert snap.recorded_end(snap.DirStore(tmp_path / "snaps"), None) is None
        m.store.set(mb.k_done(m.id), mb.Done("c0ffee", 12).to_json())
        m.store.add(mb.DONES, 1)
        _wait(lambda: c.stats()["finished"])
        store = snap.DirStore(tmp_path / "snaps")
        end = snap.recorded_end(store, derive_key(TOKEN, b"snapshot manifest"))
        assert end is not None and end["outcome"] == "done"
        assert snap.recorded_end(store, derive_key(b"other", b"snapshot manifest")) is None
        m.stop.set()
    finally:
        c.stop()
