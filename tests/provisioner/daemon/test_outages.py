"""The built-in market's job-time outages: placed by the job's progress, not the clock."""

import pytest

from pricing.sources.synthetic import (JOB_OUTAGES, GeneratorParams, JobOutage,
                                       next_job_outage)
from provisioner.daemon.run.outages import JobTimeOutages, job_progress, pick_victim


def test_default_schedule_is_two_notices_and_a_kill_inside_the_job():
    sched = GeneratorParams().job_outages
    assert sched == JOB_OUTAGES
    assert sum(o.notice for o in sched) >= 2 and sum(not o.notice for o in sched) >= 1
    assert all(0 < o.at < 1 for o in sched)


def test_outage_fractions_outside_the_job_are_refused():
    for at in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction of the job"):
            JobOutage(at)


def test_next_outage_follows_progress_in_order_and_waits_for_a_deferred_one():
    sched = (JobOutage(0.7), JobOutage(0.2), JobOutage(0.45, notice=False))
    assert next_job_outage(sched, 0.19, 0) is None
    assert next_job_outage(sched, 0.2, 0) == JobOutage(0.2)
    # past two fractions but only the first carried out: the second is due, never skipped
    assert next_job_outage(sched, 0.8, 0) == JobOutage(0.2)
    assert next_job_outage(sched, 0.8, 1) == JobOutage(0.45, notice=False)
    assert next_job_outage(sched, 0.8, 3) is None


def test_progress_is_epochs_done_over_the_run_length():
    assert job_progress({"epoch": 15}, 30) == 0.5
    assert job_progress({"epoch": 45}, 30) == 1.0
    assert job_progress({}, 30) == 0.0
    assert job_progress({"epoch": 3}, 0) == 0.0


def test_victim_is_the_newest_active_member_and_never_the_last_one():
    live = [("a", 1.0), ("b", 3.0), ("c", 2.0), ("boot", 9.0)]
    assert pick_victim(live, {"a", "b", "c"}) == "b"
    assert pick_victim(live, {"a"}) is None
    assert pick_victim(live, {"a"}, booting=True) == "boot"
    assert pick_victim([("a", 1.0)], {"a"}, booting=True) is None


class Ring:
    """A scripted ring: the epoch moves as the test says; revocations are recorded."""

    def __init__(self, members):
        self.epoch = 0
        self.members = dict(members)  # id -> launch time
        self.revoked = []

    def revoke(self, iid, hard, source):
        self.revoked.append((self.epoch, iid, "kill" if hard else "notice", source))
        self.members.pop(iid)
        return True

    def outages(self, total=30, fired=0):
        saved = []
        return JobTimeOutages(JOB_OUTAGES, total, stats=lambda: {"epoch": self.epoch},
                              active=lambda: set(self.members),
                              live=lambda: list(self.members.items()), revoke=self.revoke,
                              fired=fired, on_fired=saved.append), saved


@pytest.mark.parametrize("hours_per_epoch", [0.001, 0.05, 2.0])
def test_outages_land_at_the_same_epochs_whatever_the_machine_speed(hours_per_epoch):
    """The clock never enters: a fast machine (few simulated hours per epoch) meets the same
    revocations at the same epochs as a slow one."""
    ring = Ring({f"w{i}": float(i) for i in range(6)})
    jt, saved = ring.outages()
    clock = 0.0
    for epoch in range(31):
        ring.epoch = epoch
        clock += hours_per_epoch
        jt.tick()
    assert [(e, kind) for e, _, kind, _ in ring.revoked] == [(6, "notice"), (14, "kill"),
                                                              (21, "notice")]
    assert [iid for _, iid, _, _ in ring.revoked] == ["w5", "w4", "w3"]  # newest first
    assert "job-time outage at 45% of the job" in ring.revoked[1][3]
    assert saved == [1, 2, 3]


def test_a_continued_run_does_not_repeat_outages_already_carried_out():
    ring = Ring({f"w{i}": float(i) for i in range(6)})
    jt, _ = ring.outages(fired=2)
    for epoch in range(31):
        ring.epoch = epoch
        jt.tick()
    assert [(e, kind) for e, _, kind, _ in ring.revoked] == [(21, "notice")]


def test_an_outage_waits_for_a_second_member_then_takes_a_booting_instance():
    ring = Ring({"only": 0.0})
    booting = {"new": 5.0}
    jt = JobTimeOutages((JobOutage(0.2),), 100, stats=lambda: {"epoch": ring.epoch},
                        active=lambda: set(ring.members),
                        live=lambda: list(ring.members.items()) + list(booting.items()),
                        revoke=lambda iid, hard, src: ring.revoked.append((ring.epoch, iid))
                        or True)
    for epoch in range(20, 40):
        ring.epoch = epoch
        jt.tick()
    assert ring.revoked == [(35, "new")]  # waited 15% of the job, never took the last member


def test_nothing_is_placed_without_a_known_length_or_after_the_job():
    ring = Ring({"a": 0.0, "b": 1.0})
    jt, _ = ring.outages(total=0)
    ring.epoch = 20
    assert jt.tick() is None
    done = JobTimeOutages(JOB_OUTAGES, 30, stats=lambda: {"epoch": 29, "finished": True},
                          active=lambda: {"a", "b"}, live=lambda: [("a", 0.0), ("b", 1.0)],
                          revoke=lambda *a: pytest.fail("revoked after the job"))
    assert done.tick() is None
