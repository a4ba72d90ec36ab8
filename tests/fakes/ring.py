"""A stand-in for the trainer's coordinator in daemon tests, implementing the daemon's
:class:`provisioner.daemon.ports.RingCoordinator` Protocol: it records drains and reports
the members, speeds, progress and events a test sets (the real ring runs in
tests/test_main_job.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Member:
    name: str
    samples_per_s: float
    state: str = "active"


class FakeRing:
    def __init__(self) -> None:
        self.drains: list[tuple[str, str]] = []
        self.speeds: dict[str, float] = {}
        self.progress: dict[str, Any] = {"epoch": 0, "samples_done": 0, "steps_lost": 0}
        self.log: list[dict[str, Any]] = []
        self.running = False

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", 0)

    def start(self) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False

    def drain(self, member_name: str, reason: str) -> bool:
        self.drains.append((member_name, reason))
        return member_name in self.speeds

    def members(self) -> list[Member]:
        return [Member(n, s) for n, s in sorted(self.speeds.items())]

    def stats(self) -> dict[str, Any]:
        return dict(self.progress)

    def events(self) -> list[dict[str, Any]]:
        return list(self.log)
