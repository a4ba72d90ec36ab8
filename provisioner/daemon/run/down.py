"""``provision down``: terminate the fleet a run left behind (``--on-exit keep``, or a
daemon that died), like ``sky down``.

Design: the run's own files say what is left (:mod:`provisioner.daemon.run.target`). The run's
lock is taken first, exactly as a daemon takes it (:class:`provisioner.daemon.run.lock.RunLock`),
so ``down`` is refused (one line, exit 2) while a daemon holds the run, and no daemon can
start on it and adopt the fleet while ``down`` ends it. The instances to end are the state's
live ones plus those the driver still lists for the job (an instance whose launch was
recorded only by the cloud is not left behind); they are terminated through the daemon's own
write-ahead actuator (:meth:`WriteAheadActuator.terminate_ids`: an intent row, the driver's
``terminate``, the end recorded), on the run's clock: a local run's simulated clock (kept in
the state's ``clock`` meta; it ran on while the fleet was kept, and the fleet was paid for),
real time for a cloud run. The run's end is then marked ``fleet_kept = false`` at that
moment, so ``provision status`` shows no fleet and a next ``provision run`` on the work
directory continues from there with nothing to adopt.

Rule: never touch a run another process holds; a cloud run needs its ``--config`` (the
driver is built from it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from provisioner.daemon.run.lock import Created, RunLock, held_by
from provisioner.daemon.run.target import Target
from provisioner.errors import UserError


@dataclass(frozen=True)
class Down:
    """What ``down`` did."""

    job: str
    terminated: tuple[str, ...]
    spend_usd: float


def _refuse(target: Target, pid: int) -> UserError:
    return UserError(f"{target.what}: a daemon (pid {pid}) still runs it; stop it first "
                     f"(kill -INT {pid}, or Ctrl-C in its terminal: it drains and ends its "
                     f"fleet unless --on-exit keep), then run `provision down` again")


def _clock(state: Any, local: bool) -> Callable[[], float]:
    if not local:
        return time.time
    saved = state.get_meta("clock")
    if not saved:
        return time.time
    from pricing.sources.pace import from_saved

    clock = from_saved(saved)  # where the run's clock is now, at its last rate
    return lambda: clock().timestamp()


def _driver(target: Target) -> Any:
    if target.local:
        from provisioner.drivers.local import LocalDriver

        return LocalDriver(target.root / "cloud", lambda spec: [])
    if target.config is None:
        raise UserError(f"{target.what}: a cloud run; give its --config FILE (its driver "
                        f"section says where the instances are)")
    from provisioner.config import load_settings
    from provisioner.daemon.wiring import cloud_driver

    return cloud_driver(load_settings(target.config))


def end_fleet(job: str, driver: Any, state: Any, clock: Callable[[], float],
              reason: str) -> tuple[str, ...]:
    """End every instance of ``job`` that ``state`` holds or ``driver`` lists, through the
    write-ahead actuator, on ``clock``; open intents are closed, not repeated (nothing is
    launched). Returns the ids ended."""
    from provisioner.daemon.loop.actuator import WriteAheadActuator
    from provisioner.timing import Intervals

    for intent in state.open_intents():
        state.abandon_intent(intent.token, clock(), f"not repeated: {reason}")
    ids = sorted({r.id for r in state.live_instances()} | {i.id for i in driver.list(job)})
    WriteAheadActuator(job, driver, state, clock, Intervals()).terminate_ids(ids, reason)
    now = clock()
    for iid in ids:  # a row left open (its end not recorded by the actuator)
        state.end_instance(iid, now, reason)
    return tuple(ids)


def down(target: Target) -> Down:
    """Terminate what ``target``'s run left (see the module docstring).

    Raises UserError when a daemon holds the run, or when it has no state."""
    from provisioner.daemon.state import State

    holder = held_by(target.lock)
    if holder is not None:
        raise _refuse(target, holder)
    if not target.state.is_file():
        raise UserError(f"{target.what}: no run there ({target.state} does not exist); see "
                        f"`provision list`")
    created = Created()
    lock = RunLock(target.lock, target.what)
    try:
        lock.acquire(created)
    except UserError:
        raise _refuse(target, lock.holder() or -1) from None
    try:
        state = State(target.state)
        try:
            job = (state.get_meta("job") or {}).get("id")
            if not job:
                raise UserError(f"{target.state}: no job recorded (the daemon never started "
                                f"its loop); nothing to terminate")
            driver = _driver(target)
            clock = _clock(state, target.local)
            ids = end_fleet(job, driver, state, clock, "provision down")
            now = clock()
            run = dict(state.get_meta("run") or {})
            if run.get("ended"):
                run["ended"] = {**run["ended"], "fleet_kept": False, "t": now}
                state.set_meta("run", run)
            return Down(job, tuple(ids), state.spend(now))
        finally:
            state.close()
    finally:
        lock.release()
