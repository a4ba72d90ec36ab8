"""The local driver: idempotent launches, restart-safe listing, notices and kills."""

import os
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from pricing.model import Offering
from provisioner.drivers.base import (INTERRUPTION, PREEMPTED, TERMINATED_NOTICE, CloudDriver,
                                      LaunchRequest)
from provisioner.drivers.local import LocalDriver, slowdown_for
from provisioner.errors import CapacityError, DriverError

from tests.conftest import REPO  # noqa: E402
from tests.fakes.wait import wait_for  # noqa: E402

FAKE = REPO / "tests" / "fakes" / "local_worker.py"
V = Offering("local", "r1", "r1-a", "local.v100")
K = Offering("local", "r1", "r1-b", "local.k80")
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Clock:
    def __init__(self):
        self.t = T0

    def __call__(self):
        return self.t




@pytest.fixture
def env(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    clock = Clock()
    avail = {}
    extra = []

    def command(spec):
        return [sys.executable, str(FAKE), str(out), spec.instance_id, *extra]

    def make(**kw):
        return LocalDriver(tmp_path / "cloud", command, clock=clock,
                           availability=lambda o, t: avail.get(o), notice_window_s=30,
                           terminate_grace_s=1.0, **kw)

    drivers = []

    def factory(**kw):
        d = make(**kw)
        drivers.append(d)
        return d

    yield factory, clock, avail, out, extra
    for d in drivers:
        d.terminate([i.id for i in d.list("job")])


def test_is_a_cloud_driver_and_launch_is_idempotent(env):
    make, clock, avail, out, _ = env
    d = make()
    assert isinstance(d, CloudDriver)
    r1 = d.launch(LaunchRequest(V, 2, "job", "tok-1"))
    r2 = d.launch(LaunchRequest(V, 2, "job", "tok-1"))
    assert [i.id for i in r1.instances] == [i.id for i in r2.instances]
    assert wait_for(lambda: len(list(out.glob("*.started"))) == 2, 10.0)
    time.sleep(0.2)
    assert len(list(out.glob("*.started"))) == 2  # no second process
    # a restarted daemon (new driver object) finds them by job tag
    d2 = make()
    assert sorted(i.id for i in d2.list("job")) == sorted(i.id for i in r1.instances)
    assert d2.list("other-job") == []
    started = (out / f"{r1.instances[0].id}.started").read_text().split()
    assert started[1] == "1.0"
    assert started[2] == V.zone  # SPOTRING_ZONE: the hybrid mode groups workers by zone


def test_launch_interrupted_midway_finishes_with_the_same_token(env, monkeypatch):
    make, *_ = env
    d = make()
    real = LocalDriver._spawn
    calls = []

    def crash_on_second(self, iid, req):
        calls.append(iid)
        if len(calls) == 2:
            raise KeyboardInterrupt("daemon killed mid-launch")
        return real(self, iid, req)

    monkeypatch.setattr(LocalDriver, "_spawn", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        d.launch(LaunchRequest(V, 3, "job", "tok-x"))
    monkeypatch.setattr(LocalDriver, "_spawn", real)
    first = d.list("job")
    assert len(first) == 1
    d2 = make()
    res = d2.launch(LaunchRequest(V, 3, "job", "tok-x"))
    assert len(res.instances) == 3 and first[0].id in {i.id for i in res.instances}
    assert len(d2.list("job")) == 3


def test_feed_revocation_notice_then_kill_at_window_end(env):
    make, clock, avail, out, extra = env
    extra.append("--ignore-term")
    d = make()
    ids = [i.id for i in d.launch(LaunchRequest(V, 2, "job", "tok-1")).instances]
    assert wait_for(lambda: len(list(out.glob("*.started"))) == 2, 10.0)
    avail[V] = 2
    assert d.notices() == []
    avail[V] = 1
    clock.t = T0 + timedelta(seconds=10)
    notes = d.notices()
    assert len(notes) == 1 and notes[0].kind == INTERRUPTION
    assert notes[0].deadline == clock.t + timedelta(seconds=30)
    victim = notes[0].instance_id
    assert wait_for(lambda: (out / f"{victim}.noticed").exists(), 10.0)
    assert d.notices() == []  # delivered once, and the noticed one is not revoked twice
    assert len(d.list("job")) == 2  # still alive inside its window
    clock.t = T0 + timedelta(seconds=41)
    assert wait_for(lambda: len(d.list("job")) == 1, 10.0)
    assert [n.kind for n in d.notices()] == [TERMINATED_NOTICE]
    # full offering: a launch is a capacity error
    with pytest.raises(CapacityError):
        d.launch(LaunchRequest(V, 1, "job", "tok-2"))
    assert set(ids) > {i.id for i in d.list("job")}


def test_hard_kill_and_manual_revoke_from_another_driver(env):
    make, clock, avail, out, _ = env
    d = make(hard_kill_every=1)
    ids = [i.id for i in d.launch(LaunchRequest(K, 2, "job", "tok-1")).instances]
    assert wait_for(lambda: len(list(out.glob("*.started"))) == 2, 10.0)
    avail[K] = 1
    notes = d.notices()
    assert [n.kind for n in notes] == [PREEMPTED] and notes[0].deadline is None
    assert wait_for(lambda: len(d.list("job")) == 1, 10.0)
    survivor = d.list("job")[0].id
    assert float((out / f"{survivor}.started").read_text().split()[1]) == 4.0
    # provision revoke: another process's driver object on the same state dir
    other = make()
    assert other.revoke(survivor, window_s=5)
    assert not other.revoke(survivor)  # already noticed
    notes = [(n.instance_id, n.kind) for n in d.notices()]
    # the notice first; on a loaded machine the fake worker may have drained and exited
    # before this read, and then its exit comes in the same batch (handled once each)
    assert notes[:1] == [(survivor, INTERRUPTION)]
    assert notes[1:] in ([], [(survivor, TERMINATED_NOTICE)]), notes
    assert wait_for(lambda: (out / f"{survivor}.noticed").exists(), 10.0)
    assert wait_for(lambda: d.list("job") == [], 10.0)  # the fake worker drains and exits
    assert not other.revoke("loc-nope")
    assert set(ids) == {ids[0], ids[1]}


def test_terminate_is_idempotent_and_not_a_notice(env):
    make, clock, avail, out, extra = env
    extra.append("--ignore-term")
    d = make()
    ids = [i.id for i in d.launch(LaunchRequest(V, 1, "job", "tok-1")).instances]
    t0 = time.monotonic()
    d.terminate(ids + ["loc-unknown"])
    assert time.monotonic() - t0 < 3 and d.list("job") == []
    d.terminate(ids)
    assert d.notices() == []


def test_slowdown_table_and_catalog():
    assert slowdown_for("local.k80") == 4.0
    assert slowdown_for("p3.2xlarge") == pytest.approx(1.0)
    assert slowdown_for("p2.xlarge") > 1.5
    with pytest.raises(DriverError, match="m5.large"):
        slowdown_for("m5.large")


def test_an_instance_runs_one_worker_per_gpu(tmp_path):
    """``gpus_per_instance=2``: two worker processes per instance, named ``<id>/0`` and
    ``<id>/1`` with their local rank; the instance lives while one does, and a notice, a kill
    or a terminate reaches both."""
    out = tmp_path / "out"
    out.mkdir()
    script = ("import os, signal, sys, time\n"
              "out, name = sys.argv[1], sys.argv[2]\n"
              "signal.signal(signal.SIGTERM, lambda *a: (open(os.path.join(out, name + '.noticed'),"
              " 'w').close(), sys.exit(0)))\n"
              "tmp = os.path.join(out, name + '.tmp')\n"
              "open(tmp, 'w').write("
              "os.environ['SPOTRING_LOCAL_RANK'] + ' ' + os.environ['SPOTRING_INSTANCE_ID'])\n"
              "os.rename(tmp, os.path.join(out, name + '.started'))\n"  # whole, or not there
              "while True: time.sleep(0.05)\n")
    names = []

    def command(spec):
        names.append(spec.name)
        return [sys.executable, "-c", script, str(out), spec.name.replace("/", "+")]

    d = LocalDriver(tmp_path / "cloud", command, clock=Clock(), terminate_grace_s=1.0,
                    gpus_per_instance=2)
    ids = [i.id for i in d.launch(LaunchRequest(V, 2, "job", "tok-1")).instances]
    assert sorted(names) == sorted(f"{i}/{k}" for i in ids for k in (0, 1))
    assert wait_for(lambda: len(list(out.glob("*.started"))) == 4, 60.0)
    for iid in ids:
        for k in (0, 1):
            assert (out / f"{iid}+{k}.started").read_text() == f"{k} {iid}"
    assert sorted(i.id for i in d.list("job")) == sorted(ids)
    assert d.revoke(ids[0], window_s=30)  # a notice: both of its workers drain
    assert wait_for(lambda: {p.name for p in out.glob(f"{ids[0]}*.noticed")}
                    == {f"{ids[0]}+0.noticed", f"{ids[0]}+1.noticed"}, 10.0)
    assert wait_for(lambda: [i.id for i in d.list("job")] == [ids[1]], 10.0)
    d.terminate([ids[1]])
    assert d.list("job") == []
    with pytest.raises(DriverError, match="gpus_per_instance"):
        LocalDriver(tmp_path / "cloud2", command, gpus_per_instance=0)


@pytest.mark.slow
def test_provision_run_trains_with_two_workers_per_local_instance(tmp_path):
    """`provision run` on the local cloud with ``[local] gpus_per_instance = 2``: each instance
    runs two real workers, ``<id>/0`` and ``<id>/1``, both in the ring, and the job trains to
    its end with no step lost."""
    import subprocess

    from provisioner.daemon.state import State

    cfg = tmp_path / "cfg.toml"
    cfg.write_text("[local]\ngpus_per_instance = 2\n[fleet]\nmax_size = 1\n")
    # No outages of the built-in market (a second instance was seen once on a loaded
    # machine, not captured: likely an outage, which the paced clock meets sooner in samples
    # there), and 3x the example's epochs: beside busy processes one worker's start (its
    # torch import) came after the other had trained the 8 epochs alone.
    env = {**os.environ, "DIGITS_EPOCHS": "24"}
    done = subprocess.run([sys.executable, "-m", "provisioner.cli", "run", "--config", str(cfg),
                           "--workdir", str(tmp_path / "wd"), "--outages-per-hour", "0",
                           "--duration", "12h"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    st = State.read_only(tmp_path / "wd" / "state.sqlite")
    try:
        instances = st.instances()
        assert len(instances) == 1, "\n".join(  # what launched the others, when it fails
            [*map(str, instances), *(f"{t:.0f} {targets} {why[:200]}"
                                     for t, targets, why in st.decisions()),
             *(f"{e.t:.1f} {e.kind} {e.instance_id} {e.detail[:200]}" for e in st.events())])
        (instance,) = instances
        joined = {e.instance_id for e in st.events(kinds=["ring-join"])}
        assert joined == {f"{instance.id}/0", f"{instance.id}/1"}
        ring = st.get_meta("ring")
        assert ring["outcome"] == "done" and ring["steps_lost"] == 0
    finally:
        st.close()
