"""Issue 30.1 on the daemon's side: the drain backstop never terminates an instance whose
workers the ring keeps as the last holders of the state (``MemberInfo.kept``); it still
terminates one that overstays its drain otherwise."""

from __future__ import annotations

from pathlib import Path

from pricing.model import Offering
from provisioner.daemon.loop.actuator import WriteAheadActuator
from provisioner.daemon.state import State
from provisioner.timing import Intervals
from trainer.protocol.messages import MemberInfo

OFF = Offering("local", "r1", "r1-a", "local.v100")


class Driver:
    name = "fake"

    def __init__(self) -> None:
        self.terminated: list[str] = []

    def terminate(self, ids: list[str]) -> None:
        self.terminated += ids


class Ring:
    def __init__(self, members: list[MemberInfo]) -> None:
        self._members = members

    def members(self) -> list[MemberInfo]:
        return self._members


def test_the_backstop_spares_the_kept_holder_and_ends_the_others(tmp_path: Path) -> None:
    state = State(tmp_path / "s.sqlite")
    try:
        state.begin_launch("t", OFF, 2, 0.0)
        state.finish_launch("t", [("i-kept", OFF), ("i-late", OFF)], 0.0)
        for iid in ("i-kept", "i-late"):
            assert state.mark_draining(iid, 0.0)
        ring = Ring([MemberInfo(1, "i-kept/0", 3, 8, 1.0, "draining", 0.0, kept=True),
                     MemberInfo(2, "i-late", 3, 8, 1.0, "draining", 0.0)])
        driver = Driver()
        act = WriteAheadActuator("job", driver, state, lambda: 1000.0, Intervals(),
                                 coordinator=ring)  # type: ignore[arg-type]
        act.drain_backstop(60.0)
        assert driver.terminated == ["i-late"]
    finally:
        state.close()
