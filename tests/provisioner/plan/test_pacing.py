"""plan.pacing: the outage log that sets how far ahead to bank, by hand."""

from __future__ import annotations

import pytest

from provisioner.plan.pacing import OutageLog


def test_outage_log_measures_outages_from_failure_to_holding_again():
    log = OutageLog()
    log.observe(0.0, held=True, last_failure=None)
    assert log.bank_s(0.0) == 0.0  # nothing seen: no bank
    log.observe(100.0, held=False, last_failure=90.0)  # revoked at 90 s: out since then
    log.observe(200.0, held=False, last_failure=150.0)  # a failed relaunch: the same outage
    assert log.bank_s(1890.0) == pytest.approx(1800.0)  # the running one counts so far
    log.observe(3690.0, held=True, last_failure=150.0)  # back: 3,600 s
    log.observe(4000.0, held=False, last_failure=150.0)  # not held, but no new failure
    assert log.lengths == [3600.0] and log.since is None
    log.observe(5000.0, held=False, last_failure=4800.0)
    log.observe(6000.0, held=True, last_failure=4800.0)
    # length-biased mean: (3,600^2 + 1,200^2) / (3,600 + 1,200) = 3,000 s
    assert log.lengths == [3600.0, 1200.0]
    assert log.bank_s(6000.0) == pytest.approx(3000.0)
