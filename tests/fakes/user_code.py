"""A user's project as ``provision run --code`` ships it, and the tiny package its
requirements.txt names, for the boot tests (tests/terraform/test_worker_boot.py,
tests/e2e/test_daemon_aws.py).

Design: the project is ``src/train.py`` (the job) importing ``helper`` beside it (the boot
tests' regression, tests/fakes/instances.py ``BOOT_JOB``) and ``tinypkg``, named in
``requirements.txt`` at the project's root and installed by the worker's boot from a local
folder of wheels (``PIP_FIND_LINKS``, ``PIP_NO_INDEX``: never the internet). The job writes
``imported-<pid>.txt`` in its working folder: where ``helper`` and ``tinypkg`` came from, so
a test sees the worker ran the shipped code with the installed requirement.

Rule for callers: :func:`make_project` and :func:`tiny_wheel_dir` write under the folder they
are given (readable by a fake instance's workers: under /tmp); nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from tests.fakes.instances import BOOT_JOB

TRAIN = '''"""The job of a user's project: it needs helper (beside it) and tinypkg (requirements)."""
import os
from pathlib import Path

import helper
import tinypkg


def make_job(seed: int = 0):
    Path(f"imported-{os.getpid()}.txt").write_text(
        f"{helper.__file__}\\n{tinypkg.__file__}\\n{tinypkg.VALUE}\\n")
    return helper.make_job(seed)
'''


def make_project(root: Path) -> Path:
    """Write the project under ``root``; returns the job file (``root/src/train.py``)."""
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "train.py").write_text(TRAIN)
    (root / "src" / "helper.py").write_text(BOOT_JOB)
    (root / "requirements.txt").write_text("tinypkg==1.0\n")
    (root / "data").mkdir(exist_ok=True)
    (root / "data" / "cache.bin").write_bytes(b"\0" * 4096)
    (root / ".gitignore").write_text("data/\n")
    root.chmod(0o755)
    return root / "src" / "train.py"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def tiny_wheel_dir(folder: Path) -> Path:
    """A folder holding ``tinypkg-1.0-py3-none-any.whl`` (``tinypkg.VALUE == 42``), written
    as a wheel is (PEP 427: METADATA, WHEEL, RECORD with hashes); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    files = {"tinypkg/__init__.py": b"VALUE = 42\n",
             "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\n"
                                               b"Version: 1.0\n",
             "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: spotring-tests\n"
                                            b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n"
                     for name, data in files.items())
    record += "tinypkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(folder / "tinypkg-1.0-py3-none-any.whl", "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr("tinypkg-1.0.dist-info/RECORD", record)
    return folder
