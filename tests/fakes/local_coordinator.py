"""A stand-in for trainer.control.coordinator.Coordinator in daemon unit tests: records drains and
reports the members and speeds a test sets (the real ring is exercised in test_main_job)."""

from dataclasses import dataclass


@dataclass
class Member:
    name: str
    samples_per_s: float
    state: str = "active"


class FakeCoordinator:
    def __init__(self):
        self.drains = []
        self.speeds = {}
        self.progress = {"epoch": 0, "samples_done": 0, "steps_lost": 0}

    def drain(self, name, reason):
        self.drains.append((name, reason))
        return name in self.speeds

    def members(self):
        return [Member(n, s) for n, s in sorted(self.speeds.items())]

    def stats(self):
        return dict(self.progress)

    def events(self):  # the ring's membership events (provisioner.daemon.ports.RingCoordinator)
        return []
