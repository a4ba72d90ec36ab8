"""Shared test fixtures: the path to the real traces in ../shared/data; the runs registry
(``SPOTRING_STATE_HOME``) private to this test session, so the suite neither reads nor writes
the registry of the user who runs it (a run name such as ``--name own-try`` taken there by an
earlier session would be refused)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SPOTRING_DATA", REPO.parent / "shared" / "data"))
_STATE_HOME = tempfile.mkdtemp(prefix="spotring-test-state-")


def pytest_configure(config: pytest.Config) -> None:
    # every run and subprocess of the session registers here (a test may set its own)
    os.environ["SPOTRING_STATE_HOME"] = _STATE_HOME


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_STATE_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public traces (read at run time, never copied into the project)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real traces not found at {SHARED_DATA} (set SPOTRING_DATA)")
    return SHARED_DATA
