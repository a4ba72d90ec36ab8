"""The one ``wait_for`` of the tests: poll a condition with a deadline.

Design: tests that wait on processes, threads or fakes poll; the deadline is generous (a
loaded 2-core machine), the step short, and the last look is taken after the deadline, so a
condition that became true at the very end is not reported as a timeout.

Rule: ``assert wait_for(...)`` (it returns False on timeout); pass ``abort`` to fail at once
when waiting is pointless (e.g. the process under test exited): it returns a message or None.
"""

from __future__ import annotations

import time
from typing import Callable

#: How long a test waits for processes it started to boot and train (a daemon, its workers):
#: at load 15-20 on two cores one ``import torch`` took 45 s of wall time, and three workers
#: boot at once. The waits return as soon as the condition holds, so this is a guard against
#: a hang, not a margin a quiet machine ever spends.
BOOT_S = 600.0


def wait_for(predicate: Callable[[], object], timeout_s: float, *, step_s: float = 0.05,
             abort: Callable[[], str | None] | None = None) -> bool:
    """True as soon as ``predicate()`` is truthy; False when ``timeout_s`` passed. Raises
    AssertionError with ``abort()``'s message when it returns one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if abort is not None:
            why = abort()
            if why:
                raise AssertionError(why)
        time.sleep(step_s)
    return bool(predicate())
