"""Shared test fixtures: the path to the real traces in ../shared/data; the runs registry
(``SPOTRING_STATE_HOME``) private to this test session, so the suite neither reads nor writes
the registry of the user who runs it (a run name such as ``--name own-try`` taken there by an
earlier session would be refused); and the order files run in.

``./dev test`` runs the files side by side (pytest-xdist, ``--dist loadfile``: a file's tests
stay in one process, in their order, with their module fixtures). The files holding ``slow``
tests (multi-process rings, end-to-end runs: most of the suite's time) are collected first,
so the longest work starts at once and the quick files fill the gaps, instead of one long
file starting last and running alone. Order inside a file is kept. Every test already runs
in its own tmp dir, ports are taken from the kernel (port 0) and each process of the session
has its own registry (above), so files can run at the same time; the network-namespace tests
use names and subnets of their own (tests/fakes/netns.py).

``SPOTRING_TEST_CPU=FILE`` appends one line per test to FILE: the processor seconds it cost
(the test process's and its waited-for children's, so the processes a run starts count) and
its wall seconds, then when it started (Unix time) and which xdist worker ran it (a timeline of
the run): the suite is CPU-bound on two cores, so its time is cut where the CPU goes,
which ``--durations`` (wall time) does not show."""

from __future__ import annotations

import os
import resource
import shutil
import time
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: a file keeps its order


def _cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    out = os.environ.get("SPOTRING_TEST_CPU")
    if not out:
        yield
        return
    cpu, wall, start = _cpu_s(), time.monotonic(), time.time()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(out, "a") as fh:
        fh.write(f"{_cpu_s() - cpu:.2f} {time.monotonic() - wall:.2f} {start:.1f} {worker} "
                 f"{item.nodeid}\n")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public traces (read at run time, never copied into the project)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real traces not found at {SHARED_DATA} (set SPOTRING_DATA)")
    return SHARED_DATA
