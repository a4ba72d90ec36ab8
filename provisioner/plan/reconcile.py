"""The reconciler: target fleet minus actual fleet = launches, drains and terminations.

Design: a pure function over frozen dataclasses (SkyPilot ``sky/provision/common.py``): it
takes the optimiser's target counts per offering and what the daemon knows it holds, and
returns the actions with a reason each; it never calls a cloud or mutates its inputs.

- Instances already draining (a notice or an earlier scale-down) do not count as held, so a
  notice is answered by a replacement launch *in parallel* with the drain.
- Launches still in flight (open launch intents) count as held, so a slow cloud call is never
  doubled by the next round.
- Surplus is removed newest first (the youngest instance has the least warm-up invested);
  a pending instance is terminated outright, a running one is drained (it leaves the ring at
  a step boundary, no step lost) and terminated by the daemon once it has left.
- Churn limits cap launches and drains per round so one noisy plan cannot replace the
  whole fleet at once.
- A launch into a zone that just revoked, or into an offering out of capacity, moves to the
  first alternative of the same instance type and market in another zone (the caller orders
  ``alternatives`` by preference, e.g. price); with no alternative an avoided zone is still
  used (avoidance only holds "while another exists") and an offering out of capacity is
  skipped.

:func:`apply_round` is the one order in which the daemon and the simulator carry a plan out
(make before break: launches first; nothing removed while a replacement is refused, which
plans again at once), through an :class:`Actuator` each implements.

Rule for callers: pass every live instance, including draining ones; act through
:func:`apply_round`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from pricing.model import Offering


@dataclass(frozen=True)
class Held:
    """One instance the daemon holds."""

    id: str
    offering: Offering
    launched_at: float
    running: bool = True
    draining: bool = False


@dataclass(frozen=True)
class ChurnLimits:
    """At most this many launches (instances) and drains/terminations per round."""

    max_launches: int = 4
    max_removals: int = 2

    def __post_init__(self) -> None:
        if self.max_launches < 0 or self.max_removals < 0:
            raise ValueError("ChurnLimits: limits must be >= 0")


@dataclass(frozen=True)
class Launch:
    offering: Offering
    count: int
    reason: str


@dataclass(frozen=True)
class Removal:
    instance_id: str
    offering: Offering
    reason: str


@dataclass(frozen=True)
class Actions:
    launches: tuple[Launch, ...] = ()
    drains: tuple[Removal, ...] = ()
    terminations: tuple[Removal, ...] = ()
    notes: tuple[str, ...] = field(default=())
    deferred: int = 0  # launches and removals the churn limits left for a later round
    skipped: int = 0  # launches skipped: out of capacity with no alternative

    @property
    def empty(self) -> bool:
        return not (self.launches or self.drains or self.terminations)


def zone_of(offering: Offering) -> tuple[str, str, str]:
    """The key a zone is avoided by: (cloud, region, zone)."""
    return (offering.cloud, offering.region, offering.zone)


def reconcile(
    target: Mapping[Offering, int],
    held: Sequence[Held],
    *,
    in_flight: Mapping[Offering, int] | None = None,
    avoid_zones: frozenset[tuple[str, str, str]] = frozenset(),
    unavailable: frozenset[Offering] = frozenset(),
    alternatives: Sequence[Offering] = (),
    limits: ChurnLimits = ChurnLimits(),
) -> Actions:
    """Actions that move ``held`` (+ ``in_flight`` launches) toward ``target``.

    Returns an :class:`Actions`; counts in ``target`` must be >= 0 (ValueError otherwise).
    """
    for off, n in target.items():
        if n < 0:
            raise ValueError(f"target[{off}]={n}: counts must be >= 0")
    in_flight = dict(in_flight or {})
    active: dict[Offering, list[Held]] = defaultdict(list)
    for h in held:
        if not h.draining:
            active[h.offering].append(h)
    have = Counter({o: len(v) for o, v in active.items()})
    for o, n in in_flight.items():
        have[o] += n

    notes: list[str] = []
    deferred = skipped = 0
    # Surplus: newest first, pending terminated, running drained.
    removals: list[Removal] = []
    for off in sorted(set(active) | set(target)):
        surplus = have[off] - int(target.get(off, 0))
        if surplus <= 0:
            continue
        victims = sorted(active.get(off, []), key=lambda h: (h.launched_at, h.id), reverse=True)
        for h in victims[:surplus]:
            why = "not in the plan" if not target.get(off) else f"plan wants {target[off]}"
            removals.append(Removal(h.id, off, f"surplus: {why}"))
    if len(removals) > limits.max_removals:
        notes.append(f"churn limit: {len(removals) - limits.max_removals} removals deferred")
        deferred += len(removals) - limits.max_removals
        removals = removals[: limits.max_removals]
    pending_ids = {h.id for h in held if not h.running}
    terminations = tuple(r for r in removals if r.instance_id in pending_ids)
    drains = tuple(r for r in removals if r.instance_id not in pending_ids)

    # Deficit: launches, moved away from avoided zones and offerings out of capacity.
    launches: list[Launch] = []
    budget = limits.max_launches
    wanted: Counter[Offering] = Counter()
    for off in sorted(target):
        deficit = int(target[off]) - have[off]
        if deficit > 0:
            wanted[off] = deficit
    for off, deficit in sorted(wanted.items()):
        chosen, why = _place(off, avoid_zones, unavailable, alternatives)
        if chosen is None:
            notes.append(f"{off}: {why}; launch of {deficit} skipped")
            skipped += deficit
            continue
        count = min(deficit, budget)
        if count < deficit:
            notes.append(f"churn limit: {deficit - count} launches of {off} deferred")
            deferred += deficit - count
        if count > 0:
            launches.append(Launch(chosen, count, f"deficit of {deficit} for {off}" +
                                   (f" ({why})" if why else "")))
            budget -= count
    return Actions(tuple(launches), drains, terminations, tuple(notes), deferred, skipped)


def _place(off: Offering, avoid: frozenset[tuple[str, str, str]], unavailable: frozenset[Offering],
           alternatives: Sequence[Offering]) -> tuple[Offering | None, str]:
    blocked_zone = zone_of(off) in avoid
    blocked_cap = off in unavailable
    if not blocked_zone and not blocked_cap:
        return off, ""
    for alt in alternatives:
        if (alt != off and alt.instance_type == off.instance_type and alt.market == off.market
                and alt.cloud == off.cloud and zone_of(alt) not in avoid
                and zone_of(alt) != zone_of(off) and alt not in unavailable):
            why = "zone just revoked" if blocked_zone else "no capacity"
            return alt, f"moved from {off.zone}: {why}"
    if blocked_cap:
        return None, "no capacity and no alternative"
    return off, "zone just revoked but no other zone offers it"


# ----------------------------------------------------------------------------- a round

class Actuator(Protocol):
    """Carries a round's actions out: the daemon's write-ahead actuator on a cloud driver,
    or the simulator's instances on a virtual clock."""

    def launch(self, launch: Launch) -> bool:
        """Start ``launch.count`` instances; False when some were refused for capacity (the
        actuator then blocks the offering, so the next plan keeps but does not grow it)."""
        ...

    def terminate(self, removals: Sequence[Removal]) -> None:
        """End pending instances at once."""
        ...

    def drain(self, removal: Removal) -> None:
        """Ask a running instance to leave at its next step boundary, then end it."""
        ...


@dataclass(frozen=True)
class RoundInput:
    """One plan of a round: the target and what the reconciler needs besides."""

    target: Mapping[Offering, int]
    held: Sequence[Held]
    avoid_zones: frozenset[tuple[str, str, str]] = frozenset()
    unavailable: frozenset[Offering] = frozenset()
    alternatives: Sequence[Offering] = ()


@dataclass(frozen=True)
class RoundResult:
    """What a round did: the actions of its last plan, whether a launch was refused, and
    whether the churn limits deferred some (the caller plans again a period later)."""

    actions: Actions
    refused: bool
    deferred: bool
    plans: int


def apply_round(plan: Callable[[int], RoundInput | None], act: Actuator, *,
                limits: ChurnLimits = ChurnLimits(), replans: int = 2) -> RoundResult | None:
    """Plan, reconcile and act, make before break: launches first, and nothing is removed
    in a plan whose launches were refused or skipped (out of capacity). A refusal plans again at once (``plan(attempt)``
    with the refused offering now blocked by the actuator), up to ``replans`` times, so the
    launch fails over within the round; the surplus goes once a plan's launches all
    succeeded (a replacement that found no capacity must not tear down what it was to
    replace). ``plan`` returns None to stop (nothing to do); so does this function then.
    """
    result: RoundResult | None = None
    for attempt in range(replans + 1):
        given = plan(attempt)
        if given is None:
            return result
        actions = reconcile(given.target, given.held, avoid_zones=given.avoid_zones,
                            unavailable=given.unavailable, alternatives=given.alternatives,
                            limits=limits)
        refused = False
        for launch in actions.launches:
            refused = not act.launch(launch) or refused
        if not refused and not actions.skipped:  # a replacement that cannot be had yet
            if actions.terminations:
                act.terminate(actions.terminations)
            for d in actions.drains:
                act.drain(d)
        result = RoundResult(actions, refused, actions.deferred > 0, attempt + 1)
        if not refused:
            break
    return result
