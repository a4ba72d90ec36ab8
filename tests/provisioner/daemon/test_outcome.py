"""How a run ends and what it lost: the verdict and the ledger (pure)."""

import pytest

from provisioner.daemon.outcome import (EXIT_FAILED, EXIT_LOST, Ledger, advance, restarted,
                                        totals, verdict)


def v(stats, **kw):
    args = dict(interrupted=False, crash_loop=None, until_epochs=None, elapsed_s=0.0,
                duration_s=None)
    args.update(kw)
    return verdict(stats, **args)


def test_a_lost_job_never_exits_zero_and_says_why():
    got = v({"outcome": "lost", "finished": True, "lost": True,
             "failure": "no member holding the state is left"})
    assert got.exit_code == EXIT_LOST and got.job_over and got.outcome == "lost"
    assert "no member holding the state" in got.failure
    got = v({"outcome": "failed", "finished": True, "failure": "ValueError in the dataset"})
    assert got.exit_code == EXIT_FAILED and got.job_over and "ValueError" in got.failure


def test_done_limits_and_interruptions():
    assert v({"outcome": "running", "epoch": 3}) is None
    done = v({"outcome": "done", "finished": True})
    assert done.exit_code == 0 and done.job_over and done.failure is None
    # a run cut by a limit says so, never "done"; the work asked for is over: fleet ended
    epochs = v({"outcome": "running", "epoch": 30}, until_epochs=30)
    assert epochs.outcome == "limit" and epochs.reason.startswith("stopped at the limit")
    assert epochs.exit_code == 0 and epochs.job_over
    steps = v({"outcome": "running", "step": 500}, until_steps=500)
    assert steps.outcome == "limit" and "step 500 (--until-steps 500" in steps.reason
    assert v({"outcome": "running", "step": 499}, until_steps=500) is None
    # --duration pauses the run: the same command goes on, --on-exit decides the fleet
    limit = v({"outcome": "running"}, elapsed_s=7200, duration_s=3600, duration_text="1h")
    assert limit.reason.startswith("stopped at the limit: --duration 1h")
    assert limit.outcome == "duration" and not limit.job_over
    stopped = v({"outcome": "lost"}, interrupted=True)
    assert stopped.outcome == "interrupted" and stopped.exit_code == 130
    broken = v({}, crash_loop="4 workers exited before any joined the ring")
    assert broken.exit_code == 2 and broken.job_over


def test_the_first_coordinators_losses_are_its_own():
    led = advance(Ledger(), {"step": 50, "steps_lost": 2, "generation": 4})
    assert totals(led, {"step": 60, "steps_lost": 2}, spend=6.2)["steps_lost"] == 2
    assert totals(led, {"step": 60, "steps_lost": 2}, spend=6.2)["money_lost_usd"] == \
        pytest.approx(6.2 * 2 / 62)


def test_a_restart_that_adopts_the_ring_costs_nothing():
    led = advance(Ledger(), {"step": 500, "steps_lost": 1, "generation": 3})
    led = restarted(led)
    assert not led.settled and led.lost_before == 1 and led.lives == 2
    led = advance(led, {"step": 0, "steps_lost": 0})  # not formed yet: nothing known
    assert not led.settled
    led = advance(led, {"step": 512, "steps_lost": 0, "adopted": True, "generation": 3})
    fig = totals(led, {"step": 520, "steps_lost": 0, "adopted": True}, spend=1.0)
    assert fig["steps_lost"] == 1 and fig["restart_steps_lost"] == 0
    assert fig["daemon_restarts"] == 1 and fig["adopted"]


def test_a_restart_that_resumes_from_a_snapshot_loses_the_steps_since():
    led = restarted(advance(Ledger(), {"step": 500, "steps_lost": 0, "generation": 2}))
    # the generation that resumes is published before it forms (benchmarks/chaos.py: a look
    # then counted all 2,087 steps as redone from step 0): nothing known yet
    led = advance(led, {"step": 0, "generation": 1})
    assert not led.settled
    led = advance(led, {"step": 450, "resumed_from": 450, "generation": 1})
    fig = totals(led, {"step": 470, "resumed_from": 450}, spend=1.0)
    assert fig["steps_lost"] == 50 and fig["resumed_from"] == 450
    # ...and with nothing to resume from, everything
    led = restarted(advance(Ledger(), {"step": 500, "generation": 2}))
    led = advance(led, {"step": 3, "generation": 1})
    assert totals(led, {"step": 3}, spend=1.0)["steps_lost"] == 500


def test_a_lost_job_lost_everything_since_its_newest_snapshot():
    stats = {"outcome": "lost", "lost": True, "step": 230, "steps_lost": 1,
             "snapshot": {"step": 200, "time": 0.0, "bytes": 10}}
    fig = totals(advance(Ledger(), stats), stats, spend=10.0)
    assert fig["steps_lost"] == 31 and fig["snapshot_step"] == 200
    assert fig["money_lost_usd"] == pytest.approx(10.0 * 31 / 231)
    no_snap = {"outcome": "lost", "lost": True, "step": 230, "steps_lost": 0}
    fig = totals(advance(Ledger(), no_snap), no_snap, spend=10.0)
    assert fig["steps_lost"] == 230 and fig["money_lost_usd"] == 10.0  # all of it


def test_the_ledger_round_trips_through_the_state_meta():
    led = restarted(advance(Ledger(), {"step": 7, "steps_lost": 1}))
    assert Ledger.from_meta(led.as_meta()) == led
    assert Ledger.from_meta(None) == Ledger()


def test_the_runs_end_records_the_ledger_at_the_rings_last_step(tmp_path):
    # The telemetry last looked at step 238; the run ended (Ctrl-C) at step 255. A rerun
    # that resumes from the snapshot at 40 has lost 215 steps, not 198: the end keeps the
    # ledger at the ring's last step, as it keeps the ring.
    from provisioner.daemon.outcome import Verdict
    from provisioner.daemon.run.session import RunSession
    from provisioner.daemon.state import State

    state = State(tmp_path / "state.sqlite")
    try:
        state.set_meta("ledger", advance(Ledger(), {"step": 238, "generation": 1}).as_meta())
        ring = {"step": 255, "generation": 1, "steps_lost": 0}
        RunSession._record_end(state, 1.0, Verdict("interrupted", "interrupted", 130, False),
                               ring, fleet_kept=False, stopped=True)
        led = Ledger.from_meta(state.get_meta("ledger"))
        assert led.last_step == 255 and state.get_meta("ring")["step"] == 255
        rerun = advance(restarted(led), {"step": 40, "generation": 1, "resumed_from": 40})
        assert rerun.restart_lost == 215
    finally:
        state.close()
