"""Pacing a job with known work: its progress line, banking ahead of it, work per dollar.

Design: pure helpers of :mod:`provisioner.plan.pipeline` (no I/O, no clock: every time is an
argument). A job with ``work`` samples and a deadline (the user's, or its own pace) keeps
Uniform Progress' line (Can't-Be-Late, Wu et al., NSDI'24): ``done >= work x elapsed /
line``. Behind the line every offering may help catch up; ahead of it the work due is done
and waiting is free, so only hardware within a tolerance of the cheapest per sample is
bought (:func:`good_offerings`, :func:`ahead_offerings`). While the cheapest hardware is
free and dearer spot is what an outage would leave, the job banks progress with it, as far
ahead as :class:`OutageLog` learned its outages last, on rings whose extra samples cost less
than the dearer spot's (:func:`bank_rate`); while it is out, a user's deadline waits on the
dearer spot as long as that could still finish by the line (:func:`net_rate`); when only
on-demand is left to fall back on, a user's deadline spreads its work over the time the
cheap hardware is expected to be there (:func:`spot_time_target`). Among fleets that keep
pace, the one with the most useful work per dollar is taken (:func:`per_sample_fleet`).

:func:`pace` is the rate and the on-demand floor (Uniform Progress' safety net).

Rule: callers pass candidates already built for this decision; nothing here solves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from pricing.model import Offering
from provisioner.plan.model import Candidate, ring_efficiency, ring_rate
from provisioner.plan.virtual import most_units


@dataclass
class OutageLog:
    """The outages of the cheapest hardware per sample, as a policy sees them.

    An outage starts at a failure of that hardware (a revocation or a launch that found no
    capacity) while none of it is held, and ends at the next decision that holds some again.
    Only what was observable by then is used: the online counterpart of a fixed knob.
    Mutable memory of a :class:`~provisioner.plan.pipeline.Planner` (its only state).
    """

    since: float | None = None
    back: float = float("-inf")  # when the last outage ended: older failures are its own
    lengths: list[float] = field(default_factory=list)

    def observe(self, t: float, held: bool, last_failure: float | None) -> None:
        """One decision at ``t``: whether the hardware is held, and its newest failure."""
        if held:
            if self.since is not None:
                self.lengths.append(t - self.since)
                self.since, self.back = None, t
        elif self.since is None and last_failure is not None and last_failure > self.back:
            self.since = last_failure

    def seen(self) -> bool:
        """Whether an outage has begun (ended or still going on)."""
        return bool(self.lengths) or self.since is not None

    def running_s(self, t: float) -> float:
        """How long the outage going on at ``t`` has lasted (0 when none is)."""
        return t - self.since if self.since is not None else 0.0

    def typical_s(self) -> float:
        """The length-biased mean of the outages that ended (0 before any did)."""
        total = sum(self.lengths)
        return sum(d * d for d in self.lengths) / total if total > 0 else 0.0

    def expected_left_s(self, t: float) -> float:
        """How much longer the outage going on at ``t`` is expected to last: the mean
        residual of the outages seen that lasted longer than it has so far (inf when none
        did: longer than any seen, spot that never came first of all)."""
        r = self.running_s(t)
        longer = [d - r for d in self.lengths if d > r]
        return sum(longer) / len(longer) if longer else float("inf")

    def shift_s(self, t: float) -> float:
        """How far the job's own (soft) pace line moves for the outages seen: every outage
        that ended (spot came back from it), and the one going on up to the typical length
        (beyond it, spot may not come back: the line no longer waits)."""
        return sum(self.lengths) + min(self.running_s(t), self.typical_s())

    def out_s(self, t: float) -> float:
        """Seconds spent in outages up to ``t``: those that ended and the one going on."""
        return sum(self.lengths) + self.running_s(t)

    def bank_s(self, t: float) -> float:
        """How far ahead to bank: the length-biased mean outage, sum(d^2) / sum(d) over the
        outages seen (the one still running counted at its length so far): the expected
        length of the outage that a moment spent out of the hardware belongs to, which is
        what a bank spent waiting has to cover. 0 before any outage is seen."""
        ds = self.lengths + ([t - self.since] if self.since is not None else [])
        total = sum(ds)
        return sum(d * d for d in ds) / total if total > 0 else 0.0


@dataclass
class HeldRate:
    """The useful samples/s of the spot held, decision by decision: a step in time, so that
    what the job's pools gave over the last hour, revocations and refills included, can be
    told from what it holds this minute. Mutable memory of a
    :class:`~provisioner.plan.pipeline.Planner`; a new one (a restarted daemon) knows only
    the present."""

    steps: list[tuple[float, float]] = field(default_factory=list)

    def observe(self, t: float, rate: float, keep_s: float) -> None:
        """The rate held from ``t`` on (a second decision at the same ``t`` replaces it);
        the steps that ended more than ``keep_s`` before ``t`` are forgotten."""
        if self.steps and t <= self.steps[-1][0]:
            self.steps[-1] = (self.steps[-1][0], rate)
        else:
            self.steps.append((t, rate))
        while len(self.steps) > 1 and self.steps[1][0] <= t - keep_s:
            self.steps.pop(0)

    def mean(self, t: float, horizon_s: float) -> float:
        """The time-weighted mean over the ``horizon_s`` before ``t``, or over the time seen
        when that is shorter (the last rate when no time has passed; 0 before any)."""
        start = t - horizon_s
        total = area = 0.0
        for i, (u, r) in enumerate(self.steps):
            end = self.steps[i + 1][0] if i + 1 < len(self.steps) else t
            span = min(end, t) - max(u, start)
            if span > 0:
                total += span
                area += r * span
        return area / total if total > 0 else (self.steps[-1][1] if self.steps else 0.0)


def due(work: float, elapsed_s: float, line_s: float, lead_s: float = 0.0) -> float:
    """Samples due ``lead_s`` from now on the progress line that reaches ``work`` at
    ``line_s`` after the start (Uniform Progress' line)."""
    return work * min(1.0, (max(elapsed_s, 0.0) + lead_s) / line_s)


def ahead_offerings(good: set[Offering], held: Mapping[Offering, int], work: float,
                    done: float, elapsed_s: float, line_s: float,
                    lead_s: float) -> set[Offering] | None:
    """``good`` (the offerings worth buying while ahead of the progress line, from
    :func:`good_offerings`) when ahead, else None (behind).

    Ahead: done >= work x elapsed / ``line_s`` (the line to the deadline less the safety
    margin; for the job's own pace, to its own deadline). Then the work due now is done, and
    waiting for the cheapest capacity per sample costs nothing: on aws-10-26-2022 p2.xlarge
    ($0.94 per 1M samples) kept the pace while p3.2xlarge ($0.64) was out, and its boots and
    premium were a third of spotring's excess over hindsight. Behind the line, every
    offering may help catch up."""
    if not good or line_s <= 0:
        return None
    # hysteresis: a fleet holding worse offerings (bought while behind) lets them go only
    # once ``lead_s`` ahead of the line, else they would go and be booted again every tick
    lead = lead_s if any(n > 0 and o not in good for o, n in held.items()) else 0.0
    if done < due(work, elapsed_s, line_s, lead):
        return None
    return good


def good_offerings(cands: Iterable[Candidate], tolerance: float) -> set[Offering]:
    """Offerings whose cost per sample (at full speed) is within ``tolerance`` of the best
    priced one (held, free or out of capacity alike). Full speed, not the hazard-discounted
    one: this sorts out dearer hardware; the optimiser weighs each zone's revocations."""
    per = {c.offering: c.price_per_hour / c.samples_per_s for c in cands
           if c.samples_per_s > 0 and c.price_per_hour > 0}
    if not per:
        return set()
    best = min(per.values())
    return {o for o, x in per.items() if x <= tolerance * best}


def _cheapest_keeping(cands: Iterable[Candidate], target: float, max_size: int,
                      model_mb: float, global_batch: int,
                      gbps: float) -> tuple[float, float, str] | None:
    """(cost per useful sample in USD per hour per sample/s, rate, region) of the ring of one
    offering with the lowest cost per useful sample that keeps ``target`` (each offering's
    smallest such ring: ring efficiency only falls with size), or None when none can."""
    best: tuple[float, float, str] | None = None
    for c in cands:
        s = c.useful
        if s <= 0 or c.price_per_hour <= 0:
            continue
        for n in range(1, most_units(c, max_size) + 1):  # a VW counts its n instances
            rate = ring_rate(n, s, model_mb, global_batch, gbps)
            if rate >= target:
                per_sample = n * c.price_per_hour / rate
                if best is None or per_sample < best[0]:
                    best = (per_sample, rate, c.offering.region)
                break
    return best


def per_sample_fleet(cands: Iterable[Candidate], target: float, max_size: int, model_mb: float,
                     global_batch: int, gbps: float) -> tuple[float, str] | None:
    """(rate, region) of the fleet of one offering with the lowest cost per useful sample
    that keeps ``target`` (its smallest such ring: ring efficiency only falls with size), or
    None when no single offering can. The optimiser then prices that rate with every
    constraint (zone share, churn, mixes)."""
    best = _cheapest_keeping(cands, target, max_size, model_mb, global_batch, gbps)
    return None if best is None else (best[1], best[2])


def catch_up_rate(cands: Iterable[Candidate], pace: float, tolerance: float, max_size: int,
                  model_mb: float, global_batch: int, gbps: float) -> float | None:
    """The most useful samples/s a ring of one offering delivers at a cost per sample within
    ``tolerance`` of the cheapest ring of one offering that keeps ``pace`` (None when none
    can): how fast a job behind its own, soft, pace may catch up. Capacity is not read (a
    price level, not a fleet): a ring's efficiency only falls with its size, and the last
    hours of a catch-up on a 16-instance ring (efficiency 0.68 against 0.91 for the 4 that
    keep the pace) cost the 16-node trace 1.084x the bound."""
    rings: list[tuple[float, float]] = []  # (rate, cost per useful sample) per ring size
    ref: float | None = None
    for c in cands:
        s = c.useful
        if s <= 0 or c.price_per_hour <= 0:
            continue
        kept = False
        for n in range(1, most_units(c, max_size, capped=False) + 1):
            rate = ring_rate(n, s, model_mb, global_batch, gbps)
            per = n * c.price_per_hour / rate
            rings.append((rate, per))
            if not kept and rate >= pace * (1.0 - 1e-9):  # (pace = work / (work / rate))
                kept = True
                ref = per if ref is None else min(ref, per)
    if ref is None:
        return None
    return max(rate for rate, per in rings if per <= tolerance * ref)


def fleet_rate(cands: Iterable[Candidate], model_mb: float, global_batch: int,
               links: tuple[float, float, float]) -> float:
    """Useful samples/s of the fleet held (each candidate's ``current``) as one ring over
    its slowest link (``links``: intra-zone, inter-zone, inter-region Gb/s)."""
    held = [c for c in cands if c.current > 0]
    if not held:
        return 0.0
    raw = sum(c.current * c.useful for c in held)
    n = sum(c.current for c in held)
    gbps = (links[2] if len({c.offering.region for c in held}) > 1 else
            links[1] if len({c.zone_key for c in held}) > 1 else links[0])
    return raw * ring_efficiency(n, raw, model_mb, global_batch, gbps)


def held_spot_finishes(spot_rate: float, left: float, seconds: float,
                       od_rate: float) -> bool:
    """Whether the spot held (``spot_rate`` samples/s as one ring, :func:`fleet_rate`)
    alone does ``left`` samples in ``seconds``, and so would the fastest on-demand ring
    (``od_rate``, :func:`od_capacity`) were that spot revoked: the deadline then needs no
    on-demand yet, only a margin might. False when nothing is left to do or no time is."""
    if left <= 0 or seconds <= 0:
        return False
    return spot_rate * seconds >= left and od_rate * seconds > left


def od_capacity(cands: Iterable[Candidate], max_size: int, model_mb: float, global_batch: int,
                gbps: float) -> float:
    """Samples/s of the fastest on-demand ring the candidates allow: ``max_size`` (or the
    offering's cap) instances of one on-demand offering, at the ring's efficiency. (Counting
    ``max_size`` x one instance's speed ignored the ring: a job that waited for spot until
    that slack was gone finished late on 16 on-demand instances, dearer than on-demand.)"""
    best = 0.0
    for c in cands:
        if c.offering.market != "on-demand" or c.useful <= 0:
            continue
        n = most_units(c, max_size)
        if n > 0:
            best = max(best, ring_rate(n, c.useful, model_mb, global_batch, gbps))
    return best


def od_alone_per_sample(cands: Iterable[Candidate], work: float, seconds: float,
                        max_size: int, model_mb: float, global_batch: int,
                        gbps: float) -> float | None:
    """USD per useful sample of on-demand alone: the least, over the on-demand rings (one
    offering, up to ``max_size``) that do ``work`` in ``seconds``, of a ring's cost per
    sample (a ring's efficiency only falls with its size, so each offering's smallest such
    ring). None when no on-demand ring does it."""
    if work <= 0 or seconds <= 0:
        return None
    best = _cheapest_keeping([c for c in cands if c.offering.market == "on-demand"],
                             work / seconds, max_size, model_mb, global_batch, gbps)
    return None if best is None else best[0] / 3600.0


def od_rate_kept(cands: Iterable[Candidate], od_rate: float, *, work: float, left: float,
                 spent: float, seconds: float, max_size: int, model_mb: float,
                 global_batch: int, gbps: float) -> float:
    """The fastest on-demand ring the deadline's slack may count on (``od_rate``, the
    fastest of all, :func:`od_capacity`) while the rest of the work done on it keeps the
    job's cost per sample at most on-demand alone's (:func:`od_alone_per_sample` over the
    deadline's ``seconds``): what ``spent`` leaves of on-demand alone's cost, over the
    ``left`` samples, is the most a sample of the rest may cost (:func:`rate_within`).
    ``od_rate`` as it is when no ring keeps it (the deadline first) or nothing is left.
    Counted on once all spot has been out longer than the margin and than every outage
    seen: waiting until only the fastest ring could finish, a job whose spot was gone for
    good after 9.5 h (02-15's first start) held nothing for 17 h, then 16 on-demand
    instances: 1.040x on-demand alone's cost per sample; 0.951x with this ring
    (docs/optimizer.md)."""
    od = [c for c in cands if c.offering.market == "on-demand"]
    ref = od_alone_per_sample(od, work, seconds, max_size, model_mb, global_batch, gbps)
    if ref is None or left <= 0:
        return od_rate
    allowed = (ref * work - spent) / left  # USD per sample (rate_within's: x 3600)
    kept = rate_within(od, allowed * 3600.0, max_size, model_mb, global_batch, gbps)
    return min(od_rate, kept) if kept > 0 else od_rate


def deadline_floor(rate: float, work_left: float, hours_left: float, od_rate: float,
                   safety_hours: float, overhead_h: float = 0.0) -> float:
    """On-demand samples/s to keep for a deadline (Uniform Progress' safety net).

    slack = hours left - ``overhead_h`` (a launch's boot) - hours the fastest on-demand ring
    (``od_rate``) would need; the floor is ``rate * (1 - slack / safety_hours)`` clipped to
    [0, rate] (all on-demand when the slack is gone; none while it exceeds
    ``safety_hours``). The planner buys it only while spot cannot be had.
    """
    if work_left <= 0:
        return 0.0
    if od_rate <= 0:
        return 0.0
    slack = hours_left - overhead_h - work_left / (od_rate * 3600.0)
    if safety_hours <= 0:
        return rate if slack <= 0 else 0.0
    return rate * min(1.0, max(0.0, 1.0 - slack / safety_hours))


def margin_hours(safety_hours: float, deadline_h: float) -> float:
    """The safety margin a user's deadline keeps: ``safety_hours``, at most a quarter of
    the deadline (short jobs)."""
    return min(safety_hours, 0.25 * deadline_h)


def pace(work_left: float, hours_left: float, deadline_h: float, od_rate: float, *,
         hard: bool, safety_hours: float, overhead_h: float = 0.0
         ) -> tuple[float, float, float]:
    """(target samples/s, on-demand floor samples/s, safety margin hours) of a paced job.

    The slack is the time left less ``overhead_h`` (boot, re-form and the rounds the churn
    limits take to launch the fleet) less what the fastest on-demand ring (``od_rate``,
    :func:`od_capacity`) needs for the work left. A user's deadline is hard: Uniform
    Progress' on-demand safety margin is kept as time (``safety_hours``, at most a quarter
    of the deadline for short jobs): the pace aims at the deadline less the margin, so a
    run on pace never eats into it (pacing to the deadline itself made the margin buy
    on-demand in the last hours of every run), and the floor phases on-demand in as the
    slack falls through the margin. The job's own pace is soft: no margin; the floor is the
    whole pace once the slack is gone, which, with the slack counted against a real ring
    and the launch rounds, still finishes by the job's own deadline, the plain on-demand
    time (counting ``max_size`` x one instance's speed, and no boot, had finished late)."""
    safety = margin_hours(safety_hours, deadline_h) if hard else 0.0
    target = max(work_left / (max(hours_left - safety, 0.5 * hours_left) * 3600), 1e-9)
    floor = deadline_floor(target, work_left, hours_left, od_rate, safety, overhead_h)
    return target, floor, safety


def spot_share(out_s: float, elapsed_s: float) -> float:
    """The share of ``elapsed_s`` the cheap hardware was there (``out_s`` of it out),
    clipped to [0, 1]; 1 before any time has passed."""
    if elapsed_s <= 0:
        return 1.0
    return min(1.0, max(1.0 - out_s / elapsed_s, 0.0))


def spot_time_rate(work_left: float, line_left_s: float, share: float) -> float:
    """Samples/s to run while the cheap hardware is there so that the work left is done by
    the line in the time it is expected to be there: the line's rate divided by ``share``,
    the share of the time it is expected to be there (:func:`spot_share` of the outages
    seen, or the user's ``pacing.spot_share``). Where spot is out a third of the time, a
    hard deadline's pace over wall time leaves a third of its work to the on-demand net at
    three times the price; this spreads it over the spot time instead. 0 when nothing is
    left, no time is, or the hardware is never there (the caller's floor takes over)."""
    if work_left <= 0 or line_left_s <= 0 or share <= 0.0:
        return 0.0
    return work_left / (line_left_s * min(share, 1.0))


def net_rate(net: Iterable[Candidate], pace: float, tolerance: float, *, left: float,
             line_left_s: float, safety_hours: float, overhead_h: float, max_size: int,
             model_mb: float, global_batch: int, gbps: float) -> float | None:
    """Samples/s a user's deadline runs at on dearer spot (``net``) while its cheapest
    hardware is out: Uniform Progress' safety net (:func:`deadline_floor`) with the dearer
    spot as the net, in place of the wall-time pace; None when the net cannot wait (its
    fastest ring would not finish the work left by the line), or there is none.

    The net's speed is the fastest ring of one offering whose samples cost at most
    ``tolerance`` more than those of the ring that keeps ``pace`` (:func:`catch_up_rate`,
    capacity unread). While that ring would finish ``left`` more than ``safety_hours``
    before the line, every sample bought on the net now is one the cheap hardware might do
    later for less: nothing is bought; as the slack falls through the margin the net's rate
    phases in, to all of it at no slack. Paced over wall time on the net, the four types of
    aws-10-26-2022 with a 34.4 h deadline ran 14-17 K80 rings (1.47x V100's cost per sample)
    through every outage of the V100: 1.114x the bound over the 13 starts every 48 h, 1.395x
    the worst; waiting on the net, 1.087x and 1.309x, and no start dearer."""
    cap = catch_up_rate(net, pace, tolerance, max_size, model_mb, global_batch, gbps)
    if cap is None or left <= 0 or left / cap >= line_left_s:
        return None
    return deadline_floor(cap, left, line_left_s / 3600.0, cap, safety_hours, overhead_h)


def bank_rate(cheap: Iterable[Candidate], pace: float, per_sample: float, max_size: int,
              model_mb: float, global_batch: int, gbps: float) -> float | None:
    """The most useful samples/s worth banking with: the fastest ring of one of ``cheap``
    grown from its smallest ring that keeps ``pace`` one instance at a time while the
    instance added adds samples at no more than ``per_sample`` USD each (the dearer spot's
    cost per sample, the most a banked sample can save: one the net would otherwise do);
    None when no ring keeps the pace. A ring's efficiency falls with its size, so each
    instance adds fewer samples for its price than the one before. On the four types of
    aws-10-26-2022 with a 34.4 h deadline the bank first ran 11-16 V100 where 3 kept the
    pace (the 16th at 2.05x the 3-ring's cost per sample); the instances beyond the pace
    ring were then priced together against the $0.94 per million of the K80 they were to
    spare, which still grew rings of 8-12 whose last instances cost more than that; priced
    one by one, 5-6 (docs/optimizer.md)."""
    best: float | None = None
    for c in cheap:
        if c.useful <= 0 or c.price_per_hour <= 0:
            continue
        rates = [ring_rate(n, c.useful, model_mb, global_batch, gbps)
                 for n in range(most_units(c, max_size, capped=False) + 1)]
        n0 = next((n for n in range(1, len(rates)) if rates[n] >= pace), None)
        if n0 is None:
            continue
        n = n0
        while n + 1 < len(rates) and rates[n + 1] > rates[n] and (
                c.price_per_hour / 3600.0 / (rates[n + 1] - rates[n]) <= per_sample):
            n += 1
        best = rates[n] if best is None else max(best, rates[n])
    return best


def rate_within(cands: Iterable[Candidate], per_sample: float, max_size: int, model_mb: float,
                global_batch: int, gbps: float) -> float:
    """The most useful samples/s a ring of one of ``cands`` delivers at a cost per useful
    sample of at most ``per_sample`` (0 when none does): a ring's efficiency only falls
    with its size, so past that rate a sample costs more than ``per_sample``. The unit is
    that of ``price_per_hour / useful``: USD per hour per useful sample/s, 3600 x USD per
    sample (:func:`bank_rate`'s ``per_sample`` is USD per sample)."""
    best = 0.0
    for c in cands:
        if c.useful <= 0 or c.price_per_hour <= 0:
            continue
        for n in range(1, most_units(c, max_size, capped=False) + 1):
            rate = ring_rate(n, c.useful, model_mb, global_batch, gbps)
            if n * c.price_per_hour / rate <= per_sample:
                best = max(best, rate)
    return best


def spot_time_target(cheap: Iterable[Candidate], cands: Iterable[Candidate], log: OutageLog,
                     now: float, *, left: float, line_left_s: float, elapsed_s: float,
                     prior_s: float, max_size: int, model_mb: float,
                     global_batch: int, gbps: float, share: float | None = None) -> float:
    """Samples/s a user's deadline runs at on its ``cheap`` hardware (the cheapest per
    sample, there now) when an outage of it leaves only on-demand (in ``cands``) to fall
    back on; 0 when the rule does not apply.

    After outages of the cheap hardware, the work left is done in the time the hardware is
    expected to be there (:func:`spot_time_rate` over :func:`spot_share`, the share of the
    time so far that it was, with ``prior_s`` counted as time it was before the job began:
    a prior, so that one outage is one draw of the market, not its rule), up to the fastest
    ring whose samples cost no more than on-demand's (:func:`rate_within`).
    ``share`` (the user's ``pacing.spot_share``) applies from the start, the outages of a
    market the user knows before the job has seen them; once it has seen some, the lower of
    the two (on a deadline whose fallback is on-demand, a share guessed too high leaves work
    to the net at three times the price, one guessed too low costs a few percent of ring
    efficiency).
    Paced over wall time, the V100 10-minute probes (out together for 3.8 h and 6.2 h) fell
    behind, bought 16 on-demand instances in the last hours and 12-16 spot rings in the
    flapping catch-up: 1.387x the bound. A constant rate over the expected spot time is
    also the cheaper schedule of the two (a ring's cost per sample only rises with its
    size). The prior (``pacing.share_prior_hours``, 48 h) was a 1 h churn horizon, with
    outages within the safety margin ignored: replayed from every 24 h of its traces that
    read one early outage as the market's rule (10-16-instance rings, V100 34.4 h windows
    1.056x the bound on average); 48 h was chosen leave-one-family-out over the windows
    (docs/optimizer.md), and with it short outages count too (the p-4node window at +264 h
    1.121x -> 1.037x: the margin alone had left its last hours to on-demand)."""
    od = [c for c in cands if c.offering.market == "on-demand"
          and c.price_per_hour > 0 and c.useful > 0]
    if not od:
        return 0.0
    out_s = log.out_s(now)
    if out_s > 0:
        seen = spot_share(out_s, elapsed_s + prior_s)
        share = seen if share is None else min(share, seen)
    if share is None or share >= 1.0:
        return 0.0
    rate = spot_time_rate(left, line_left_s, share)
    od_per = min(c.price_per_hour / c.useful for c in od)
    return min(rate, rate_within(cheap, od_per, max_size, model_mb, global_batch, gbps))
