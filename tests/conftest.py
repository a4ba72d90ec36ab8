"""Shared test fixtures: the path to the real traces in ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SPOTRING_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public traces (read at run time, never copied into the project)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real traces not found at {SHARED_DATA} (set SPOTRING_DATA)")
    return SHARED_DATA
