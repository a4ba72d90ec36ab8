"""A worker's ring name is its instance's id (and its GPU): one parse and one print for every
cloud's ids, and the matching the daemon does with it."""

from __future__ import annotations

import pytest

from provisioner.drivers.gcp import instance_name
from provisioner.drivers.identity import (WorkerName, by_instance, drain_instance,
                                          formed_names, holds_the_ring_alone, instance_of,
                                          instance_phase, left, per_instance)
from tests.fakes.ring import FakeRing

GCP_ID = f"us-central1-a/{instance_name('job', 'tok', 0)}"


@pytest.mark.parametrize("instance", ["i-0123456789abcdef0", GCP_ID, "loc-1a2b3c4d5e-0"])
@pytest.mark.parametrize("gpu", [None, 0, 7])
def test_print_and_parse_round_trip_every_drivers_ids(instance: str, gpu: int | None) -> None:
    name = WorkerName(instance, gpu)
    text = str(name)
    assert text == (instance if gpu is None else f"{instance}/{gpu}")
    assert WorkerName.parse(text) == name
    assert instance_of(text) == instance


@pytest.mark.parametrize("bad", ["", "a b", "i-1/", "zone/123", "i-1\n", "x" * 201])
def test_ids_no_driver_gives_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        WorkerName(bad)


def test_a_gpu_index_is_a_small_non_negative_integer() -> None:
    with pytest.raises(ValueError):
        WorkerName("i-1", -1)
    with pytest.raises(ValueError):
        WorkerName("i-1", 1024)


def test_a_name_no_driver_gives_matches_no_instance() -> None:
    assert instance_of("host name-123") == "host name-123"


def test_members_grouped_summed_and_left_per_instance() -> None:
    members = {f"{GCP_ID}/0": 100.0, f"{GCP_ID}/1": 120.0, "i-1": 50.0}
    assert by_instance(members) == {GCP_ID: [f"{GCP_ID}/0", f"{GCP_ID}/1"], "i-1": ["i-1"]}
    assert per_instance(members) == {GCP_ID: 220.0, "i-1": 50.0}
    assert left(["i-1", GCP_ID, "i-2"], [f"{GCP_ID}/1"]) == ["i-1", "i-2"]
    assert instance_phase(["joining", "active"]) == "active"
    assert instance_phase(["draining", "draining"]) == "draining"
    assert instance_phase([]) == "booting"


def test_draining_an_instance_drains_each_of_its_workers() -> None:
    ring = FakeRing()
    ring.speeds = {f"{GCP_ID}/0": 1.0, f"{GCP_ID}/1": 1.0, "i-other": 1.0}
    assert drain_instance(ring, GCP_ID, "planned")
    assert sorted(ring.drains) == [(f"{GCP_ID}/0", "planned"), (f"{GCP_ID}/1", "planned")]
    assert not drain_instance(ring, "i-missing", "planned")
    assert len(ring.drains) == 2


def test_an_instance_whose_workers_hold_the_ring_alone_is_known() -> None:
    from tests.fakes.ring import Member

    ring = [Member(f"{GCP_ID}/0", 1.0), Member(f"{GCP_ID}/1", 1.0),
            Member("i-new/0", 0.0, state="joining")]
    assert holds_the_ring_alone(GCP_ID, ring)  # the joiner has no state yet
    assert not holds_the_ring_alone(GCP_ID, ring + [Member("i-2/0", 1.0)])
    assert holds_the_ring_alone(GCP_ID, ring + [Member("i-2/0", 1.0)], leaving=["i-2"])
    assert not holds_the_ring_alone("i-booting", ring)  # no worker in the ring: nothing held


def test_an_instance_has_left_once_a_generation_without_it_formed() -> None:
    events = [{"kind": "formed", "name": f"{GCP_ID}/0,i-1"}, {"kind": "leave",
                                                              "name": f"{GCP_ID}/0"},
              {"kind": "generation", "name": "i-1"}]
    # dropped from the members at the publish, but the others may still be stepping with it
    assert left([GCP_ID], ["i-1"], formed_names(events)) == []
    events.append({"kind": "formed", "name": "i-1"})
    assert left([GCP_ID], ["i-1"], formed_names(events)) == [GCP_ID]
    assert formed_names([]) == []
