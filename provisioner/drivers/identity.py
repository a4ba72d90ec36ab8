"""Who a ring member is: the instance a driver launched, and which of its GPUs it trains on.

Design: a worker's ring name is a :class:`WorkerName`, the driver's own instance id
(``i-0abc...`` on AWS, ``<zone>/<name>`` on GCP, ``loc-...`` locally) and, for an instance
that runs one worker per GPU, the GPU's index after a slash: ``i-0abc/3``,
``us-central1-a/sr-1a2b3c4d-9f8e7d6c5b-0/1``. The boot scripts (terraform/*/templates) and
the local driver print names with it; the daemon parses a member's name with it to find the
instance, in one place (:func:`instance_of`), never by comparing strings. The split is
unambiguous: no instance id ends in ``/<digits>`` (AWS ids start ``i-``, GCE names with a
letter, local ids ``loc-``), and :class:`WorkerName` refuses one that would.

The helpers below are the questions the daemon asks the ring about an instance (pure, over
member names): which members are its (:func:`by_instance`), how fast the instance is as a
whole (:func:`per_instance`, the sum of its GPUs' workers: the planner's throughput is per
instance), which draining instances have no worker left in the ring (:func:`left`: gone from
the members and from the newest formed generation), and whether its
workers hold the ring's state alone (:func:`holds_the_ring_alone`: a planned drain waits for
a replacement to join then); :func:`drain_instance` asks the ring to let every worker of an
instance go.

Rule for callers: match ring members to instances only through this module.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

#: What an instance id may hold: no whitespace, no control characters (a name is printed into
#: systemd units and logs), at most 200 characters (the trainer takes names of 256).
_INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}")


@dataclass(frozen=True, order=True)
class WorkerName:
    """A ring member's name: ``instance`` (the driver's id) and ``gpu`` (None: the only
    worker of its instance). ``str()`` prints it, :meth:`parse` reads it back."""

    instance: str
    gpu: int | None = None

    def __post_init__(self) -> None:
        if not _INSTANCE.fullmatch(self.instance) or self.instance.endswith("/"):
            raise ValueError(f"instance id {self.instance!r}: expected letters, digits and "
                             f"._:/@- (at most 200, no whitespace)")
        last = self.instance.rpartition("/")[2]
        if last.isdigit():
            raise ValueError(f"instance id {self.instance!r}: its last part is a number, which "
                             f"would read as a GPU index")
        if self.gpu is not None and not (isinstance(self.gpu, int) and 0 <= self.gpu < 1024):
            raise ValueError(f"gpu {self.gpu!r}: expected an index from 0 to 1023")

    def __str__(self) -> str:
        return self.instance if self.gpu is None else f"{self.instance}/{self.gpu}"

    @classmethod
    def parse(cls, text: str) -> "WorkerName":
        """``"i-0abc/2"`` -> ``WorkerName("i-0abc", 2)``; ``"i-0abc"`` -> ``WorkerName("i-0abc")``.

        Raises ValueError for a name no driver gives (empty, whitespace, ...).
        """
        head, slash, tail = text.rpartition("/")
        if slash and head and tail.isascii() and tail.isdigit():
            return cls(head, int(tail))
        return cls(text)


def instance_of(member_name: str) -> str:
    """The instance id a member's name belongs to; a name no driver gives is its own
    "instance" (so it matches nothing the daemon holds)."""
    try:
        return WorkerName.parse(member_name).instance
    except ValueError:
        return member_name


def by_instance(member_names: Iterable[str]) -> dict[str, list[str]]:
    """Member names grouped by instance id, each group sorted."""
    out: dict[str, list[str]] = defaultdict(list)
    for name in member_names:
        out[instance_of(name)].append(name)
    return {iid: sorted(names) for iid, names in out.items()}


def per_instance(values: Mapping[str, float]) -> dict[str, float]:
    """Per-member figures (samples/s) summed per instance: an instance's speed is its
    workers' together."""
    out: dict[str, float] = defaultdict(float)
    for name, value in values.items():
        out[instance_of(name)] += float(value)
    return dict(out)


def left(instance_ids: Iterable[str], member_names: Iterable[str],
         formed_names: Iterable[str] = ()) -> list[str]:
    """Those of ``instance_ids`` whose workers have left the ring: none among
    ``member_names`` (the ring's members and joiners), and none in the ring's newest formed
    generation (``formed_names``). A worker leaves the member list when the generation
    without it is *published*; until the others have *formed* it they may still be finishing
    a step with it, so its instance is not gone until then (in the given order)."""
    present = set(by_instance(member_names)) | set(by_instance(formed_names))
    return [iid for iid in instance_ids if iid not in present]


def formed_names(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The members of the ring's newest formed generation, from the coordinator's events
    (``formed``: ``name`` holds the members' names, comma-joined)."""
    for e in reversed(events):
        if e.get("kind") == "formed":
            return [n for n in str(e.get("name") or "").split(",") if n]
    return []


def instance_phase(states: Sequence[str]) -> str:
    """One instance's phase from its members' states: ``active`` when any member trains,
    else the first member's state (``joining``, ``draining``...)."""
    return "active" if "active" in states else (states[0] if states else "booting")


def holds_the_ring_alone(instance_id: str, members: Iterable[Any],
                         leaving: Iterable[str] = ()) -> bool:
    """Would the ring be left with no active member if ``instance_id``'s workers left?

    ``members``: the ring's members (``name`` and ``state``); ``leaving``: instances already
    draining. True when ``instance_id`` has an active worker and no instance outside
    ``leaving`` has one: its workers hold the training state alone (a joiner receives it only
    once it has joined), so draining it now would empty the ring.
    """
    gone = set(leaving) | {instance_id}
    active = [instance_of(m.name) for m in members if str(m.state) == "active"]
    return instance_id in active and all(iid in gone for iid in active)


class _Ring(Protocol):
    def drain(self, member_name: str, reason: str) -> bool: ...

    def members(self) -> Sequence[Any]: ...


def drain_instance(ring: _Ring, instance_id: str, reason: str) -> bool:
    """Ask ``ring`` to let every worker of ``instance_id`` leave at its next step boundary.

    Returns True when at least one of them is a member or an admitted joiner (one already
    leaving, e.g. on its own metadata notice, counts: the ring lets it go).
    """
    names = by_instance(m.name for m in ring.members()).get(instance_id, [])
    for name in names:
        ring.drain(name, reason)
    return bool(names)
