"""Rank 0 writes its snapshot to the store itself while the coordinator is away (issue 30,
item 10): who may, what it writes, and that the vault of a restarted coordinator verifies it
like its own. No ring here (tests/trainer/worker/test_durability.py has the real one)."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.protocol.admission import derive_key
from trainer.state import snapshot as snap
from trainer.state.direct import DirectWriter, direct_entry

KEY = derive_key(b"t" * 32, b"snapshot manifest")


def test_who_may_write_to_the_store_itself(tmp_path: Path) -> None:
    d = snap.SnapshotSettings(f"file://{tmp_path}/snaps")
    assert direct_entry(d, "127.0.0.1") == {"url": str(tmp_path / "snaps"),
                                            "endpoint_url": None, "api_endpoint": None}
    assert direct_entry(d, "localhost") is not None
    # workers dial from other hosts: a folder of the coordinator's host is not theirs
    assert direct_entry(d, "0.0.0.0") is None and direct_entry(d, "10.0.0.7") is None
    assert direct_entry(snap.SnapshotSettings("s3://b/p"), "127.0.0.1") is None  # no grant
    s3 = snap.SnapshotSettings("s3://b/p", direct=True, endpoint_url="http://x:1")
    assert direct_entry(s3, "10.0.0.7") == {"url": "s3://b/p", "endpoint_url": "http://x:1",
                                            "api_endpoint": None}
    assert direct_entry(snap.SnapshotSettings(str(tmp_path), direct=False), "::1") is None
    # a malformed entry or no key: no writer (through the coordinator only)
    assert DirectWriter.from_config({"url": ""}, KEY) is None
    assert DirectWriter.from_config([1], KEY) is None
    assert DirectWriter.from_config({"url": str(tmp_path)}, None) is None


class _Away:
    """The coordinator's connection while the daemon restarts."""

    def __init__(self) -> None:
        raise ConnectionRefusedError("the coordinator does not answer")


def _take(s: snap.Snapshotter, step: int) -> None:
    s.take(step, lambda: {"step": step, "w": torch.full((5,), float(step))}, "job", 0,
           step * 4)
    s.wait()


def test_the_coordinator_away_the_snapshot_goes_to_the_store_signed(tmp_path: Path) -> None:
    store = tmp_path / "snaps"
    store.mkdir()
    writer = DirectWriter.from_config(
        direct_entry(snap.SnapshotSettings(str(store)), "127.0.0.1"), KEY)
    s = snap.Snapshotter(_Away, every_steps=10, every_s=3600.0, direct=writer)
    _take(s, 10)
    _take(s, 20)
    assert s.failed is None and s.taken == 2 and s.direct == 2
    # a restarted coordinator's vault (same token) lists them, newest last, and loads them
    vault = snap.Vault(snap.DirStore(store), key=KEY)
    ms = vault.manifests()
    assert [m.step for m in ms] == [10, 20] and all(m.verify(KEY) for m in ms)

    class Conn:  # fetch through the restarted coordinator's vault
        def blob_get(self, name: str, off: int, n: int) -> bytes:
            return vault.get(name, off, n)

    tree = snap.fetch(Conn(), ms[-1])
    assert tree["step"] == 20 and torch.equal(tree["w"], torch.full((5,), 20.0))
    # only snapshot objects, private, nothing staged left behind
    assert sorted(p.name for p in store.iterdir()) == sorted(
        [m.name for m in ms] + [f"{m.name}.json" for m in ms])
    assert all(p.stat().st_mode & 0o077 == 0 for p in store.iterdir())
    # another job's token (or no token): refused, never listed
    assert snap.Vault(snap.DirStore(store), key=b"k" * 32).manifests() == []


def test_a_store_the_worker_cannot_reach_fails_as_before_and_is_retried(
        tmp_path: Path) -> None:
    """A worker on another host: the coordinator's folder is not there. Nothing is created,
    the snapshot fails (both reasons named) and is taken again after RETRY_S."""
    now = [0.0]
    writer = DirectWriter.from_config({"url": str(tmp_path / "elsewhere")}, KEY)
    s = snap.Snapshotter(_Away, every_steps=10, every_s=3600.0, clock=lambda: now[0],
                         direct=writer)
    _take(s, 10)
    assert s.failed and "coordinator" in s.failed and "not on this host" in s.failed
    assert s.direct == 0 and not (tmp_path / "elsewhere").exists()
    assert not s.due(11)
    now[0] += snap.RETRY_S
    assert s.due(12)
    (tmp_path / "elsewhere").mkdir()  # the store reachable again
    _take(s, 12)
    assert s.failed is None and s.direct == 1
    assert [m.step for m in snap.Vault(snap.DirStore(tmp_path / "elsewhere"),
                                       key=KEY).manifests()] == [12]
