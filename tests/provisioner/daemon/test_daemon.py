"""The daemon loop on the local driver, stepped by hand with an injected clock."""

import sys
from collections import Counter
import time
import urllib.request
from datetime import timedelta

import pytest

from pricing.model import Availability, Offering
from pricing.sources.trace import TraceSource
from pricing.sources import synthetic
from provisioner.config import parse_settings
from provisioner.daemon.loop.scheduler import JOB_IDS
from provisioner.daemon.wiring import build_daemon
from provisioner.drivers.base import LaunchRequest
from provisioner.drivers.local import LocalDriver
from provisioner.errors import UserError
from provisioner.daemon.view.metrics import Metrics
from provisioner.daemon.state import State
from provisioner.timing import Intervals
from tests.fakes.ring import FakeRing as FakeCoordinator
from tests.fakes.wait import wait_for

from tests.conftest import REPO  # noqa: E402

FAKE = REPO / "tests" / "fakes" / "local_worker.py"


class Clock:
    def __init__(self):
        self.t = synthetic.DEFAULT_START

    def __call__(self):
        return self.t

    def advance(self, s):
        self.t += timedelta(seconds=s)


def quiet_market(**kw):
    """The generated market with no outages unless asked (tests script revocations)."""
    p = synthetic.GeneratorParams(outages_per_hour=kw.pop("outages_per_hour", 0.0), **kw)
    return synthetic.generate(p)


@pytest.fixture
def world(tmp_path):
    made = []

    def make(settings=None, snapshot=None, coordinator=None, state_path=None, **kw):
        snap = snapshot or quiet_market()
        clock = kw.pop("clock", None) or Clock()
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        avail = synthetic.AvailabilityIndex(snap.availability)
        drv = LocalDriver(tmp_path / "cloud",
                          lambda s: [sys.executable, str(FAKE), str(out), s.instance_id],
                          clock=clock, availability=avail, notice_window_s=30,
                          hard_kill_every=kw.pop("hard_kill_every", 0), terminate_grace_s=0.5)
        s = settings or parse_settings({"fleet": {"max_size": 3, "markets": ["spot"],
                                                  "max_zone_share": 0.5}})
        st = State(state_path or tmp_path / "state.sqlite")
        d = build_daemon(s, drv, TraceSource([], snapshot=snap), st, now=clock,
                   coordinator=coordinator if coordinator is not None else FakeCoordinator(),
                   **kw)
        made.append(d)
        return d, clock, drv, st

    yield make
    for d in made:
        d.driver.terminate([i.id for i in d.driver.list(d.job_id)])


def test_first_round_launches_the_plan_and_accounts_spend(world):
    d, clock, drv, st = world()
    d.recover(); d.poll_prices(); d.plan_and_reconcile()
    live = st.live_instances()
    assert len(live) == 3 and len(drv.list(d.job_id)) == 3
    assert all(r.offering.market == "spot" for r in live)
    assert st.decisions() and "max_size" in st.decisions()[-1][2]
    for _ in range(12):  # an hour in 5-minute rounds
        clock.advance(300)
        d.poll_prices(); d.watch_notices(); d.plan_and_reconcile(); d.record_metrics()
    # independent check: Σ instance-seconds × the price in force, from the trace itself
    src = d.source
    expected = 0.0
    t0 = synthetic.DEFAULT_START
    for r in st.instances():
        end = r.ended_at or clock.t.timestamp()
        for k in range(int(r.launched_at), int(end), 10):
            now = t0 + timedelta(seconds=k - t0.timestamp())
            q = {q.offering: q.price_per_hour for q in src.fetch(now=now).quotes}
            expected += q[r.offering] * min(10, end - k) / 3600
    assert st.spend(clock.t.timestamp()) == pytest.approx(expected, rel=0.01)
    assert st.metric_series("spend")[-1][2] == pytest.approx(st.spend(clock.t.timestamp()))


def test_notice_drains_first_and_replaces_in_another_zone(world):
    coord = FakeCoordinator()
    d, clock, drv, st = world(coordinator=coord)
    d.poll_prices(); d.plan_and_reconcile()
    before = {r.id: r.offering for r in st.live_instances()}
    coord.speeds = {i: 100.0 for i in before}
    victim = sorted(before)[0]
    assert drv.revoke(victim, window_s=30)
    t_notice = time.monotonic()
    d.watch_notices()
    assert (victim, "revocation notice") in coord.drains
    rows = {r.id: r for r in st.instances()}
    assert rows[victim].draining_since is not None  # drained (it may have left already)
    new = [r for r in rows.values() if r.id not in before]
    assert len(new) == 1 and new[0].offering.zone != before[victim].zone
    assert d.notice_to_launch_s and d.notice_to_launch_s[0] < time.monotonic() - t_notice + 1
    kinds = [e.kind for e in st.events()]
    assert kinds.index("notice") < len(kinds) - 1 - kinds[::-1].index("launch")
    # the worker drains and exits: its instance is closed, no second replacement
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and victim in {r.id for r in st.live_instances()}:
        time.sleep(0.05)
        d.watch_notices()
    assert victim not in {r.id for r in st.live_instances()}
    assert len(st.live_instances()) == 3


def test_hard_kill_from_trace_is_replaced(world):
    p = synthetic.GeneratorParams(outages_per_hour=0.0, capacity=2)
    snap = synthetic.generate(p)
    # script an outage: every offering of the first zone loses all capacity after 10 minutes
    zone = "local-1a"
    outage = tuple(Availability(a.offering, synthetic.DEFAULT_START + timedelta(minutes=10),
                                         0, 2, "test") for a in snap.availability
                   if a.offering.zone == zone)
    snap = type(snap)(quotes=snap.quotes, availability=snap.availability + outage, gpus=snap.gpus)
    d, clock, drv, st = world(snapshot=snap, hard_kill_every=1)
    d.poll_prices(); d.plan_and_reconcile()
    in_zone = [r.id for r in st.live_instances() if r.offering.zone == zone]
    assert in_zone
    clock.advance(700)
    d.poll_prices(); d.watch_notices()
    killed = [e for e in st.events(kinds=["killed"])]
    assert {e.instance_id for e in killed} == set(in_zone)
    live = st.live_instances()
    assert len(live) == 3 and all(r.offering.zone != zone for r in live)


def test_restart_finishes_open_intent_and_adopts_unknown_instances(world, tmp_path):
    d, clock, drv, st = world()
    d.poll_prices()
    off = Offering("local", "local-1", "local-1b", "p3.2xlarge")
    # the daemon wrote its intent, the cloud call happened, then SIGKILL before finish_launch
    st.begin_launch("tok-crash", off, 2, clock.t.timestamp())
    first = drv.launch(LaunchRequest(off, 2, d.job_id, "tok-crash"))
    # tagged with the job, launched by no intent this state knows (a lost state file, another
    # directory): adopted, never killed without proof
    other = Offering("local", "local-1", "local-1b", "p2.xlarge")
    unknown = drv.launch(LaunchRequest(other, 1, d.job_id, "tok-unknown")).instances[0].id
    st.close()
    d2, *_ = world(state_path=tmp_path / "state.sqlite", clock=clock)
    d2.recover()
    live = {r.id for r in d2.state.live_instances()}
    assert live == {i.id for i in first.instances} | {unknown}
    assert {i.id for i in drv.list(d.job_id)} == live  # nothing killed
    assert len(drv.list(d.job_id)) == 3  # no duplicate from repeating the launch
    assert d2.state.open_intents() == []
    adopted = {e.instance_id: e.detail for e in d2.state.events(kinds=["adopted"])}
    assert "unknown to this state" in adopted[unknown]
    # an instance that died while the daemon was down is closed at the next start
    drv.terminate([sorted(first.instances, key=lambda i: i.id)[0].id])
    d3, *_ = world(state_path=tmp_path / "state.sqlite", clock=clock)
    d3.recover()
    assert {r.id for r in d3.state.live_instances()} == live - {
        sorted(first.instances, key=lambda i: i.id)[0].id}
    assert d3.state.events(kinds=["gone"])


def test_fresh_state_never_terminates_the_jobs_instances(world, tmp_path):
    """A daemon on a fresh state file (started from another directory, the file lost) finds
    a running fleet of its job: it adopts all of it and plans with it, killing nothing."""
    d, clock, drv, st = world()
    d.recover(); d.poll_prices(); d.plan_and_reconcile()
    fleet = {r.id for r in st.live_instances()}
    assert len(fleet) == 3
    st.close()
    d2, *_ = world(state_path=tmp_path / "fresh.sqlite", clock=clock)
    d2.recover(); d2.poll_prices(); d2.plan_and_reconcile()
    assert {r.id for r in d2.state.live_instances()} == fleet
    assert {i.id for i in drv.list(d.job_id)} == fleet
    assert not d2.state.events(kinds=["terminated", "drain"])


def test_an_instance_this_state_terminated_is_terminated_again(world, tmp_path):
    """Proof: this state recorded a completed termination of the instance, yet the cloud
    still lists it (a termination that did not stick): the restart ends it."""
    d, clock, drv, st = world()
    d.recover(); d.poll_prices(); d.plan_and_reconcile()
    victim = sorted(r.id for r in st.live_instances())[0]
    real = drv.terminate
    drv.terminate = lambda ids: None  # the cloud call "succeeds" but nothing happens
    d.actuator.terminate_ids([victim], "test")
    drv.terminate = real
    assert victim in {i.id for i in drv.list(d.job_id)}
    st.close()
    d2, *_ = world(state_path=tmp_path / "state.sqlite", clock=clock)
    d2.recover()
    assert victim not in {i.id for i in drv.list(d.job_id)}


def test_measured_slow_type_changes_the_next_plan(world):
    s = parse_settings({"fleet": {"max_size": 6, "markets": ["spot"], "max_zone_share": 1.0},
                        "objective": {"kind": "min-cost", "target_samples_per_s": 700}})
    coord = FakeCoordinator()
    d, clock, drv, st = world(settings=s, coordinator=coord)
    d.poll_prices(); d.plan_and_reconcile()
    first = dict(d._last_targets)
    p3 = [r.id for r in st.live_instances() if r.offering.instance_type == "p3.2xlarge"]
    assert p3, first
    prior = d.throughput.samples_per_s("p3.2xlarge")
    coord.speeds = {i: prior / 2 for i in p3}
    d.record_metrics()
    assert d.throughput.samples_per_s("p3.2xlarge") == pytest.approx(prior / 2)
    d.plan_and_reconcile()
    assert d._last_targets != first
    assert sum(d._last_targets.values()) > sum(first.values())


def test_scheduler_jobs_metrics_port_and_clean_stop(world):
    m = Metrics()
    d, clock, drv, st = world(metrics=m, intervals=Intervals(0.2, 0.1, 0.2, 0.1), speed=1.0)
    port = m.serve(0)
    try:
        d.start()
        jobs = {j.id: j for j in d.scheduler.get_jobs()}
        assert set(jobs) == set(JOB_IDS)
        assert all(j.coalesce and j.max_instances == 1 for j in jobs.values())
        time.sleep(0.5)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "spotring_fleet_size{" in body and "spotring_spend_usd" in body
        with pytest.raises(UserError, match="already in use"):
            Metrics().serve(port)
    finally:
        d.stop("terminate")
        m.close()
    assert st.live_instances() == [] and drv.list(d.job_id) == []
    assert st.events()[-1].kind == "stopped"


def test_real_availability_trace_revokes_and_replaces_elsewhere(world, shared_data):
    """Can't-Be-Late p3.2xlarge availability in 9 AWS zones (real, 195 s ticks), replayed for
    six hours: every revocation the trace implies is noticed and replaced in another zone."""
    from pricing.sources.trace import load_trace

    folder = shared_data / "spot_availability_traces/cant_be_late/availability/1-node/aws-02-15-2023"
    snap = synthetic.fill_prices(load_trace(folder))
    src = TraceSource([], snapshot=snap)
    clock = Clock()
    clock.t = src.start
    d, _, drv, st = world(snapshot=snap, clock=clock)
    avail = synthetic.AvailabilityIndex(snap.availability)
    d.poll_prices(); d.plan_and_reconcile()
    for _ in range(6 * 3600 // 195):
        clock.advance(195)
        d.poll_prices(); d.watch_notices(); d.plan_and_reconcile()
        held = {}
        for r in st.live_instances():
            if r.draining_since is None:
                held[r.offering] = held.get(r.offering, 0) + 1
        assert all(n <= (avail(o, clock.t) or 0) for o, n in held.items())
    notices = st.events(kinds=["notice", "killed"])
    assert notices, "the trace has zone outages in these six hours"
    launches = st.events(kinds=["launch"])
    for n in notices:  # while the zone is avoided, launches go to other zones
        soon = [e for e in launches if n.t <= e.t < n.t + d.intervals.zone_avoid_ttl_s]
        assert all(e.offering != n.offering for e in soon), (n, soon)
    # replacements follow as zones come back (fleet.max_regions = 1 keeps it in one region)
    assert [e for e in launches if e.t > notices[0].t]


def test_plans_only_offerings_the_driver_can_place(world):
    d, clock, drv, st = world()
    zones = sorted({q.offering.zone for q in quiet_market().quotes})
    assert len(zones) > 1
    allowed = zones[-1]
    drv.can_place = lambda off: off.zone == allowed  # e.g. the AWS driver fenced to its subnets
    d.recover(); d.poll_prices(); d.plan_and_reconcile()
    live = st.live_instances()
    assert live and {r.offering.zone for r in live} == {allowed}
    assert {q.offering.zone for q in d.quotes} == {allowed}


def test_offering_out_of_capacity_is_planned_around_not_flapped(world):
    """A launch refused for capacity must not come back in the next plans: the optimiser is
    told, so the fleet settles in another zone instead of being drained as surplus and
    relaunched every round (the reconciler's redirect alone made the next plan re-target the
    full offering, drain the redirected instance and redirect again)."""
    from provisioner.errors import CapacityError

    d, clock, drv, st = world()
    real_launch = drv.launch
    refused = []

    def launch(req):
        if req.offering.zone == "local-1a":
            refused.append(req.offering)
            raise CapacityError(req.offering.key, "InsufficientInstanceCapacity (test)")
        return real_launch(req)

    drv.launch = launch
    d.poll_prices(); d.plan_and_reconcile()
    for _ in range(6):
        clock.advance(60)
        d.poll_prices(); d.watch_notices(); d.plan_and_reconcile()
    assert refused, "the plan never tried the refused zone: the test proves nothing"
    live = st.live_instances()
    assert len(live) == 3 and all(r.offering.zone != "local-1a" for r in live)
    assert not [e for e in st.events(kinds=["drain"])], "a healthy instance was drained"
    assert len(st.instances()) == 3, "instances were launched and removed again"
    # ...and the plan itself (what the dashboard and the decision log show) says so
    assert not [k for k in st.decisions()[-1][1] if "/local-1a/" in k]


def _started(tmp_path, iid):
    path = tmp_path / "out" / f"{iid}.started"
    assert wait_for(path.exists, 20.0), iid
    return path.read_text().split()


def test_the_runs_training_mode_is_fixed_at_its_first_plan_and_given_to_every_launch(
        world, tmp_path):
    """[job] mode = hybrid on a fleet that spans zones: every launch carries SPOTRING_MODE
    and its zone's group; the mode is recorded once, and a restarted daemon keeps it."""
    s = parse_settings({"fleet": {"max_size": 3, "markets": ["spot"], "max_zone_share": 0.5},
                        "job": {"mode": "hybrid"}})
    d, clock, drv, st = world(settings=s)
    d.recover(); d.poll_prices(); d.plan_and_reconcile()
    live = st.live_instances()
    assert len({r.offering.zone for r in live}) >= 2  # the plan spans zones
    saved = st.get_meta("training_mode")
    assert saved["mode"] == "hybrid" and saved["reason"] == "job.mode in the config"
    for r in live:
        _, _, group, mode = _started(tmp_path, r.id)
        assert mode == "hybrid"
        assert group == saved["groups"][r.offering.key] and r.offering.zone in group
    assert [e.detail for e in st.events(kinds=["mode"])] == [
        "hybrid: job.mode in the config"]
    # a later plan does not switch a running job's mode
    clock.advance(300)
    d.poll_prices(); d.plan_and_reconcile()
    assert len(st.events(kinds=["mode"])) == 1
    # a daemon restarted on the state launches in the same mode, whatever its config says,
    # a launch it finishes for the crashed one included (with that offering's group)
    held = Counter(r.offering for r in live)
    offering = min(held, key=lambda o: (held[o], o.key))  # room left in its zone's capacity
    st.begin_launch("job-crashed-launch", offering, 1, clock.t.timestamp())
    d2, *_ = world(settings=parse_settings({"fleet": {"max_size": 3}}),
                   state_path=tmp_path / "state.sqlite", clock=clock)
    d2.recover()
    assert d2.actuator.launch_env["SPOTRING_MODE"] == "hybrid"
    assert d2.actuator.groups == saved["groups"]
    finished = {r.id for r in st.live_instances()} - {r.id for r in live}
    assert finished, [(e.kind, e.detail) for e in st.events()][-8:]
    for iid in finished:
        assert _started(tmp_path, iid)[2:] == [saved["groups"][offering.key], "hybrid"]


def test_on_the_local_cloud_auto_is_the_ring(world, tmp_path):
    d, clock, drv, st = world()
    d.recover(); d.poll_prices(); d.plan_and_reconcile()
    assert st.get_meta("training_mode")["mode"] == "ring"
    r = st.live_instances()[0]
    _, _, zone, mode = _started(tmp_path, r.id)
    assert mode == "ring" and zone == r.offering.zone  # the driver's own zone, no group


def test_an_instance_that_never_joins_is_terminated_at_the_join_deadline(world):
    """A boot that failed (no worker of the instance ever joined the ring) is not paid for
    until the run ends: at the join deadline it is terminated, the event names the setting,
    its offering is skipped and a replacement launched elsewhere; an instance whose worker
    joined is kept however long it lives. The deadline grows to 3x the slowest boot seen."""
    coord = FakeCoordinator()
    s = parse_settings({"fleet": {"max_size": 3, "markets": ["spot"], "max_zone_share": 0.5},
                        "daemon": {"join_deadline_s": 600}})
    d, clock, drv, st = world(settings=s, coordinator=coord)
    d.poll_prices(); d.plan_and_reconcile()
    first = {r.id: r.offering for r in st.live_instances()}
    stuck, *ok = sorted(first)
    coord.speeds = {f"{i}/0": 10.0 for i in ok}  # their workers are in the ring
    clock.advance(300)
    d.plan_and_reconcile()
    assert {r.id for r in st.live_instances()} == set(first)  # before the deadline: kept
    clock.advance(301)
    d.plan_and_reconcile()
    rows = {r.id: r for r in st.instances()}
    assert rows[stuck].ended_at is not None and "never joined" in rows[stuck].end_reason
    (ev,) = st.events(kinds=["join-deadline"])
    assert ev.instance_id == stuck and "daemon.join_deadline_s" in ev.detail
    assert all(rows[i].ended_at is None for i in ok)
    replacement = [r for r in st.live_instances() if r.id not in first]
    assert len(replacement) == 1 and replacement[0].offering != first[stuck]
    clock.advance(3 * 3600)  # members that joined are never cut, however long they live
    d.plan_and_reconcile()
    rows = {r.id: r for r in st.instances()}
    assert all(rows[i].ended_at is None for i in ok)
    assert rows[replacement[0].id].ended_at is not None  # it never joined either


def test_the_join_deadline_grows_with_the_slowest_boot_measured():
    from provisioner.timing import join_deadline

    assert join_deadline(600, []) == 600
    assert join_deadline(600, [100, 150]) == 600
    assert join_deadline(600, [100, 400]) == 1200
    assert join_deadline(3600, [], speed=600) == 300 * 600  # 5 real minutes at 600x


def _watch_planner(d) -> list:
    """Every decision's (market, fleet, now), as the daemon ``d`` gives them to its planner."""
    seen = []
    decide = d.planner.decide

    def spy(market, fleet, progress, now):
        seen.append((market, fleet, now))
        return decide(market, fleet, progress, now)

    d.planner.decide = spy
    return seen


def test_the_planner_is_given_the_hazard_by_age_and_the_age_of_each_instance_held(world):
    # Capacity that has lasted tends to last (pricing.risk.AgeShape): the daemon gives the
    # planner the shape its market's lifetimes show and each running instance's age, so a
    # ring that has run for hours is priced as the safer bet it is (issue 28).
    from dataclasses import replace as _replace
    from pricing.model import Lifetime
    from pricing.risk import AgeShape, age_shape
    snap = quiet_market()
    off = next(q.offering for q in snap.quotes if q.offering.market == "spot")
    t0 = synthetic.DEFAULT_START - timedelta(days=2)
    lives = tuple(Lifetime(off, t0 + timedelta(hours=i), 600.0, True) for i in range(20)) + \
        tuple(Lifetime(off, t0 + timedelta(hours=i), 20 * 3600.0, False) for i in range(5))
    d, clock, drv, st = world(snapshot=_replace(snap, lifetimes=lives))
    seen = _watch_planner(d)
    d.poll_prices(); d.plan_and_reconcile()
    clock.advance(600)
    d.poll_prices(); d.plan_and_reconcile()
    market, fleet, _ = seen[-1]
    assert market.age_shape == age_shape(lives) != AgeShape()
    live = st.live_instances()
    assert sum(len(a) for a in fleet.ages.values()) == len(live) == 3
    assert all(a == pytest.approx(600.0, abs=1.0) for ages in fleet.ages.values() for a in ages)


def test_the_planner_is_told_when_an_avoided_zone_may_grow_again(world):
    # After a revocation the daemon avoids its zone for zone_avoid_ttl_s; the planner is
    # given that zone's offerings as blocked and when the avoidance ends (issue 28: the net
    # waits for spot the job holds there only if that is before the slack ends). (Offerings
    # refused for capacity get the end of capacity_ttl_s the same way.)
    coord = FakeCoordinator()
    d, clock, drv, st = world(coordinator=coord)
    seen = _watch_planner(d)
    d.poll_prices(); d.plan_and_reconcile()
    assert seen[-1][1].blocked == frozenset() and seen[-1][1].blocked_until == {}
    before = {r.id: r.offering for r in st.live_instances()}
    coord.speeds = {i: 100.0 for i in before}
    victim = sorted(before)[0]
    assert drv.revoke(victim, window_s=30)
    d.watch_notices()
    clock.advance(60)
    d.plan_and_reconcile()
    _, fleet, now = seen[-1]
    zone = before[victim].zone
    assert fleet.blocked and all(o.zone == zone for o in fleet.blocked)
    assert set(fleet.blocked_until) == set(fleet.blocked)
    ttl = d.intervals.zone_avoid_ttl_s
    assert all(now < u <= now + ttl for u in fleet.blocked_until.values())


def test_the_planner_is_told_when_an_offering_refused_for_capacity_may_grow_again(world):
    from provisioner.errors import CapacityError

    d, clock, drv, st = world()
    real_launch = drv.launch
    seen = _watch_planner(d)

    def launch(req):
        if req.offering.zone == "local-1a":
            raise CapacityError(req.offering.key, "InsufficientInstanceCapacity (test)")
        return real_launch(req)

    drv.launch = launch
    d.poll_prices(); d.plan_and_reconcile()
    clock.advance(30)
    d.plan_and_reconcile()
    _, fleet, now = seen[-1]
    refused = [o for o in fleet.blocked_until if o.zone == "local-1a"]
    assert refused, "no launch was refused: the test proves nothing"
    ttl = d.intervals.capacity_ttl_s
    assert all(now < fleet.blocked_until[o] <= now + ttl for o in refused)
