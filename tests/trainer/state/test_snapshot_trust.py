"""Issue 30.2 / 30.5 on the storage side: manifests signed with a key derived from the job
token; a forged one (size and SHA-256 recomputed by whoever can write the folder) is refused
with one line and never deleted; a header nested 200,000 deep is refused, not a crash."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import pytest
import torch

from trainer.errors import BadState
from trainer.protocol.admission import derive_key
from trainer.state import codec
from trainer.state import snapshot as snap

KEY = derive_key(b"job-token", b"snapshot manifest")


def _upload(vault: snap.Vault, step: int, data: bytes) -> snap.Manifest:
    name = snap.name_for(step)
    vault.put(name, 0, data)
    m = snap.Manifest(name, step, 0, step, len(data), hashlib.sha256(data).hexdigest(), "job",
                      time.time())
    return snap.Manifest.parse(vault.commit(name, m.to_json().encode()))


def test_a_forged_snapshot_is_refused_and_the_older_one_listed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    vault = snap.Vault(snap.DirStore(tmp_path), keep=3, key=KEY)
    try:
        good = _upload(vault, 10, b"honest state")
        assert good.mac and good.verify(KEY) and not good.verify(b"another job's key" * 2)
        # the attacker writes the folder: NaN weights, step +100000, size and digest right
        evil = b"forged state"
        name = snap.name_for(100010)
        (tmp_path / name).write_bytes(evil)
        forged = snap.Manifest(name, 100010, 0, 0, len(evil), hashlib.sha256(evil).hexdigest(),
                               "job", time.time(), mac="00" * 32)
        (tmp_path / f"{name}.json").write_text(forged.to_json())
        (tmp_path / "step-0000000099-abcdef01.json").write_text("[" * 200_000)
        with caplog.at_level(logging.WARNING, logger="trainer.state.snapshot"):
            assert vault.latest() == good
            assert [m.step for m in vault.manifests()] == [10]
            vault.manifests()  # asked again: no second line
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 2 and any("HMAC" in r for r in refused)
        listed = json.loads(vault.published())
        assert [d["step"] for d in listed] == [10]
        _upload(vault, 20, b"newer")
        _upload(vault, 30, b"newest")
        _upload(vault, 40, b"newest+")  # keep=3 forgets step 10, never the refused ones
        assert (tmp_path / f"{name}.json").exists() and (tmp_path / name).exists()
        assert [m.step for m in vault.manifests()] == [20, 30, 40]
    finally:
        vault.close()


def test_a_state_header_nested_deep_or_type_confused_is_bad_state_not_a_crash() -> None:
    for header in (b"[" * 200_000, b'{"v": 1, "tensors": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                   b'{"v": 1, "tensors": 7}', b"\xff\xfe", b'{"v": 1'):
        raw = codec._LEN.pack(len(header)) + header
        with pytest.raises(BadState):
            codec.decode(raw)
    good = codec.encode({"w": torch.ones(3), "step": 1})
    assert codec.decode(good)["step"] == 1


def test_manifest_parse_refuses_what_is_not_one() -> None:
    for raw in (b"[" * 100_000, b"{}", b'{"name": [1], "step": {}}', b"x" * (1 << 20),
                json.dumps({"name": "step-0000000001-00000000", "step": 1, "epoch": 0,
                            "samples_done": 0, "bytes": 1, "sha256": "a" * 64, "time": "x"})):
        with pytest.raises(ValueError):
            snap.Manifest.parse(raw)
