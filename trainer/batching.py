"""Per-worker batch sizes from measured speed, so every member of the ring finishes together.

Design. Each member's compute time per step is modelled as ``t_i(b) = a_i + c_i * b`` (a fixed
cost plus a cost per sample). :func:`observe` folds measured :class:`StepTiming` records into
a :class:`SpeedModel`, which keeps the last ``window`` observations per member; the fit is a
weighted least-squares line with exponential forgetting (newer steps weigh more), falling
back to a line through the origin (``a_i = 0``) while one batch size only has been seen.
:func:`plan_batches` then solves, for the global batch ``B``::

    a_i + c_i * b_i = T   for every member i,     sum_i b_i = B,     b_i >= 1

(continuous "water filling": members whose share would fall below one sample are pinned at
one and the rest re-solved), rounds to integers that keep ``sum b_i = B`` exactly (floors,
then each remaining sample to the member that would finish earliest with it, ties by member
name: rounding for the step time, so the slowest member never keeps a sample a faster one
could take), and refines online with a damped controller: the new sizes move a fraction
``damping`` of the way from the previous sizes toward the target, and sizes are kept when
the predicted step time would improve by less than ``deadband`` (hysteresis, so measurement
noise cannot make the sizes flap). When the members differ from the previous
plan (a generation change) the target is taken at once, using the fits of the survivors and
``priors`` (samples per second, e.g. from a joiner's profiling steps) for the joiners.

Bad input is a decision, never a crash or a silent zero: with ``B`` smaller than the number
of members the slowest members are listed in ``BatchPlan.drop`` (the caller drains them and
logs the reason in ``BatchPlan.notes``); a member so slow that even one sample would make the
ring more than ``straggler_limit`` times slower (the fastest of at least three steps measured
at one sample says so, not a noisy fit) is dropped the same way; any other member gets at
least one sample. ``ValueError`` names the argument for nonsense (``B <= 0``, no
members, a non-positive prior).

Rule for callers: every member of the ring must call :func:`observe` and
:func:`plan_batches` with the same (all-gathered) timings and arguments; both functions are
pure and deterministic (members are sorted, sums run in a fixed order), so every member
computes the same plan without another round of communication. Weight each member's gradient
by ``b_i / B`` (:func:`gradient_weight`) and sum them: the result is the full-batch gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

__all__ = [
    "BatchPlan",
    "LinearFit",
    "SpeedModel",
    "StepTiming",
    "equal_sizes",
    "fit",
    "gpu_priors",
    "gradient_weight",
    "head_start",
    "makespan",
    "observe",
    "optimal_sizes",
    "plan_batches",
    "scale_relative_priors",
    "solve_continuous",
    "speed_from_plain",
    "speed_to_plain",
]

# A window of this many steps per member is kept; older ones are forgotten.
DEFAULT_WINDOW = 24
# Weight of an observation ``k`` steps old is FORGET**k (about 7 steps of memory).
DEFAULT_FORGET = 0.85
# Batch sizes must differ by this relative spread before the fixed cost a_i is fitted.
# (Below that, per-step noise on a shared machine makes the intercept swing wildly.)
_MIN_SPREAD = 0.2
# A member is dropped as a straggler only after this many steps measured at one sample.
STRAGGLER_EVIDENCE = 3


@dataclass(frozen=True)
class StepTiming:
    """One member's measured compute time (forward + backward, no collective) for one step."""

    member: str
    batch: int
    compute_s: float


@dataclass(frozen=True)
class LinearFit:
    """The fitted step time ``t(b) = fixed_s + per_sample_s * b`` of one member."""

    fixed_s: float
    per_sample_s: float
    observations: int

    def time(self, batch: float) -> float:
        """Predicted compute seconds for a local batch of ``batch`` samples."""
        return self.fixed_s + self.per_sample_s * batch

    @property
    def samples_per_s(self) -> float:
        """Marginal throughput, ``1 / per_sample_s``."""
        return 1.0 / self.per_sample_s


@dataclass(frozen=True)
class SpeedModel:
    """What is known about each member's speed: its last observations, oldest first.

    ``SpeedModel()`` knows nothing yet. Immutable and picklable (tuples only), so it can be
    sent to a joiner with the rest of the training state.
    """

    history: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    window: int = DEFAULT_WINDOW
    forget: float = DEFAULT_FORGET

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError(f"SpeedModel.window={self.window}: must be at least 2")
        if not 0.0 < self.forget <= 1.0:
            raise ValueError(f"SpeedModel.forget={self.forget}: must be in (0, 1]")

    def observations(self, member: str) -> tuple[tuple[int, float], ...]:
        """The kept ``(batch, compute_s)`` pairs of ``member``, oldest first (empty if none)."""
        for name, obs in self.history:
            if name == member:
                return obs
        return ()

    @property
    def members(self) -> tuple[str, ...]:
        """Members with at least one observation, sorted."""
        return tuple(name for name, _ in self.history)


@dataclass(frozen=True)
class BatchPlan:
    """Local batch sizes for one step: ``sum(sizes.values()) == B``, every size >= 1.

    ``drop`` lists members that get no share and should be drained; ``notes`` says why, and
    any other decision worth logging (a prior used, a size pinned at one sample).
    ``predicted_step_s`` is the predicted compute time of the slowest member (``None`` when
    nothing is known); ``target`` is the continuous optimum the sizes are moving toward.
    """

    sizes: Mapping[str, int]
    drop: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    predicted_step_s: float | None = None
    target: Mapping[str, float] = field(default_factory=dict)


def observe(model: SpeedModel, timings: Sequence[StepTiming]) -> SpeedModel:
    """Return ``model`` with ``timings`` appended (the input model is not changed).

    Timings with a non-positive batch, or a compute time that is negative, NaN or infinite,
    are ignored (a failed or discarded step); the caller should log them. Timings are
    applied in the order given; the result does not depend on the order of members.
    """
    hist = {name: list(obs) for name, obs in model.history}
    for t in timings:
        if not isinstance(t.batch, int) or t.batch <= 0:
            continue
        if not math.isfinite(t.compute_s) or t.compute_s < 0:
            continue
        obs = hist.setdefault(t.member, [])
        obs.append((t.batch, float(t.compute_s)))
        del obs[: max(0, len(obs) - model.window)]
    history = tuple((name, tuple(hist[name])) for name in sorted(hist))
    return replace(model, history=history)


def fit(model: SpeedModel, member: str) -> LinearFit | None:
    """The fitted line of ``member``, or ``None`` when it has no usable observation.

    Weighted least squares over the kept window (weight ``forget**age``). While the batch
    sizes seen span less than 20 % the fixed cost cannot be told apart from the per-sample
    cost under realistic noise, so the line goes through the origin (``fixed_s = 0``). The fixed cost is clamped
    to ``[0, 0.9 * smallest time seen]`` so the per-sample cost stays positive.
    """
    obs = model.observations(member)
    if not obs:
        return None
    n = len(obs)
    # One pass over the window (oldest first), weights forget**age; raw weighted moments.
    sw = sb = st = sbb = sbt = 0.0
    w = model.forget ** (n - 1)
    inv = 1.0 / model.forget
    bmin = bmax = obs[0][0]
    tmin = obs[0][1]
    for b, t in obs:
        sw += w
        sb += w * b
        st += w * t
        sbb += w * b * b
        sbt += w * b * t
        bmin, bmax, tmin = min(bmin, b), max(bmax, b), min(tmin, t)
        w *= inv
    if sb <= 0 or st <= 0:
        return None
    proportional = LinearFit(0.0, st / sb, n)
    mb, mt = sb / sw, st / sw
    if (bmax - bmin) < _MIN_SPREAD * mb:
        return proportional
    var = sbb / sw - mb * mb
    cov = sbt / sw - mb * mt
    if var <= 1e-12 * mb * mb:
        return proportional
    slope = cov / var
    fixed = mt - slope * mb
    if slope <= 0 or not math.isfinite(slope):
        return proportional
    fixed = min(max(fixed, 0.0), 0.9 * tmin)
    # Re-fit the slope with the clamped intercept so the line stays through the mean.
    slope = (mt - fixed) / mb
    if slope <= 0:
        return proportional
    return LinearFit(fixed, slope, n)


def solve_continuous(lines: Mapping[str, LinearFit], global_batch: float) -> dict[str, float]:
    """Continuous sizes with ``a_i + c_i b_i = T`` for all i, ``sum b_i = B``, ``b_i >= 1``.

    Members whose share falls below one sample are pinned at one and the others re-solved
    ("water filling"). Returns sizes in sorted member order. ``B`` must be at least the
    number of members.
    """
    names = sorted(lines)
    if global_batch < len(names):
        raise ValueError(f"global_batch={global_batch}: smaller than the {len(names)} members")
    pinned: set[str] = set()
    while True:
        free = [m for m in names if m not in pinned]
        rest = global_batch - len(pinned)
        if not free:
            return {m: 1.0 for m in names}
        inv = sum(1.0 / lines[m].per_sample_s for m in free)
        off = sum(lines[m].fixed_s / lines[m].per_sample_s for m in free)
        finish = (rest + off) / inv
        sizes = {m: (finish - lines[m].fixed_s) / lines[m].per_sample_s for m in free}
        low = [m for m in free if sizes[m] < 1.0]
        if not low:
            sizes.update({m: 1.0 for m in pinned})
            return {m: sizes[m] for m in names}
        pinned.update(low)


def makespan(lines: Mapping[str, LinearFit], sizes: Mapping[str, int]) -> float:
    """Predicted step compute time: the slowest member's ``a_i + c_i b_i``."""
    return max(lines[m].time(sizes[m]) for m in sorted(sizes))


def _round_minimax(
    lines: Mapping[str, LinearFit], values: Mapping[str, float], total: int
) -> dict[str, int]:
    """Integer sizes near ``values`` (each >= 1, sum ``total``), rounded for the step time.

    Starts from the floors of ``values`` (at least 1), then hands each remaining sample to
    the member that would finish earliest with it, or takes surplus samples from the member
    that finishes last (ties: the faster member gets the sample, then by name). Unlike
    rounding by remainders, this never leaves the slowest member a sample it would have lost
    to a faster one.
    """
    sizes = {m: max(1, math.floor(values[m])) for m in sorted(values)}
    # Ties in time (float rounding) go to the member with the smaller per-sample cost, so
    # a faster member never ends up with fewer samples than a slower one.
    while sum(sizes.values()) > total:  # only possible through the max(1, .) above
        m = max((m for m in sorted(sizes) if sizes[m] > 1),
                key=lambda m: (lines[m].time(sizes[m]), lines[m].per_sample_s))
        sizes[m] -= 1
    while sum(sizes.values()) < total:
        m = min(sorted(sizes), key=lambda m: (lines[m].time(sizes[m] + 1), lines[m].per_sample_s))
        sizes[m] += 1
    return sizes


def optimal_sizes(lines: Mapping[str, LinearFit], global_batch: int) -> dict[str, int]:
    """The integer sizes (each >= 1, sum ``B``) that minimise the slowest member's time.

    Exact: starts from the floors of :func:`solve_continuous` and hands each remaining sample
    to the member that would finish earliest with it (ties by name). Used as the reference
    optimum by tests and benchmarks.
    """
    return _round_minimax(lines, solve_continuous(lines, global_batch), global_batch)


def head_start(model: SpeedModel, sizes: Mapping[str, int], busy: Mapping[str, float]
               ) -> dict[str, int]:
    """Sizes for one step in which some members are busy ``busy[m]`` seconds before they can
    start computing (the member that evaluates the model at an epoch end): the same total
    re-split so that every member's busy time plus compute time ends together, on the fitted
    lines. Members with size 0 keep 0. Returns ``sizes`` unchanged when nobody is busy, a
    member has no fitted line yet, or fewer than two members compute. Pure.
    """
    for m, x in sorted(busy.items()):
        if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
            raise ValueError(f"busy[{m!r}]={x!r}: must be a finite number of seconds >= 0")
    active = sorted(m for m, b in sizes.items() if b > 0)
    if len(active) < 2 or not any(busy.get(m, 0.0) > 0 for m in active):
        return dict(sizes)
    lines: dict[str, LinearFit] = {}
    for m in active:
        line = fit(model, m)
        if line is None:
            return dict(sizes)
        lines[m] = replace(line, fixed_s=line.fixed_s + busy.get(m, 0.0))
    out = dict(sizes)
    out.update(optimal_sizes(lines, sum(sizes[m] for m in active)))
    return out


def equal_sizes(members: Sequence[str], global_batch: int) -> dict[str, int]:
    """``B`` split as evenly as possible (the first members in sorted order get the extra)."""
    names = sorted(set(members))
    q, r = divmod(global_batch, len(names))
    return {m: q + (1 if k < r else 0) for k, m in enumerate(names)}


def gradient_weight(sizes: Mapping[str, int], member: str) -> float:
    """The factor ``b_i / B`` that ``member``'s mean gradient is scaled by before summing."""
    return sizes[member] / sum(sizes[m] for m in sorted(sizes))


def scale_relative_priors(
    model: SpeedModel, relative: Mapping[str, float], members: Sequence[str] = ()
) -> dict[str, float]:
    """Turn relative throughputs (e.g. per GPU model) into samples/s priors for ``members``.

    ``relative`` maps member -> relative throughput (unitless, e.g. from
    ``pricing.catalog.relative_throughput``). The scale is the median over members that have
    both a fit and a relative figure of ``samples_per_s / relative``; with no such member the
    relative figures are returned unscaled (still right *relative to each other*). Only
    ``members`` (default: every key of ``relative``) without a fit are returned.
    """
    ratios = []
    for m in sorted(relative):
        line = fit(model, m)
        if line is not None and relative[m] > 0:
            ratios.append(line.samples_per_s / relative[m])
    scale = _median(ratios) if ratios else 1.0
    wanted = sorted(members) if members else sorted(relative)
    return {m: relative[m] * scale for m in wanted if m in relative and fit(model, m) is None}


def gpu_priors(model: SpeedModel, gpu_of: Mapping[str, str]) -> dict[str, float]:
    """Samples/s priors for members known only by GPU model (``member -> "V100"``, ...).

    Uses the published relative throughput table of :func:`pricing.catalog.relative_throughput`
    (V100 = 1.0; the sources are noted there), scaled by :func:`scale_relative_priors` against
    members that already have a fit. A GPU with no figure gives no prior (the member then
    gets the median speed in :func:`plan_batches`, which notes it).
    """
    from pricing.catalog import relative_throughput  # a pure table; imported on use only

    relative: dict[str, float] = {}
    for m in sorted(gpu_of):
        try:
            relative[m] = relative_throughput(gpu_of[m])
        except KeyError:
            continue
    return scale_relative_priors(model, relative)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def plan_batches(
    model: SpeedModel,
    members: Sequence[str],
    global_batch: int,
    *,
    priors: Mapping[str, float] = {},  # noqa: B006 - read only
    previous: Mapping[str, int] | None = None,
    damping: float = 0.5,
    deadband: float = 0.003,
    straggler_limit: float = 2.0,
) -> BatchPlan:
    """Choose local batch sizes for ``members`` that sum to ``global_batch``.

    ``priors`` gives samples/s for members with no observation yet (a joiner's profiling
    steps, or :func:`scale_relative_priors`); members with neither get the median speed of
    the others (equal sizes when nothing at all is known). ``previous`` is the plan in use;
    when it covers exactly ``members`` with the same total, the sizes move ``damping`` of the
    way toward the target, and stay put when that improves the predicted step time by less
    than ``deadband`` (relative). Otherwise (a generation change) the target is taken at once.

    Returns a :class:`BatchPlan`. Members in ``drop`` get no size: those beyond ``B``
    (slowest first) when ``B`` is smaller than the number of members, and members whose
    one-sample step would make the ring more than ``straggler_limit`` times slower.
    Raises ``ValueError`` naming the argument: ``global_batch <= 0``, no ``members``,
    duplicate members, a prior that is not a positive finite number, ``damping`` outside
    (0, 1], ``deadband < 0``, ``straggler_limit <= 1``.
    """
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch <= 0:
        raise ValueError(f"global_batch={global_batch!r}: must be a positive integer")
    names = sorted(members)
    if not names:
        raise ValueError("members: empty; a plan needs at least one member")
    if len(set(names)) != len(names):
        raise ValueError(f"members: duplicates in {names}")
    for m, p in sorted(priors.items()):
        if not (isinstance(p, (int, float)) and math.isfinite(p) and p > 0):
            raise ValueError(f"priors[{m!r}]={p!r}: must be a positive number of samples/s")
    if not 0.0 < damping <= 1.0:
        raise ValueError(f"damping={damping}: must be in (0, 1]")
    if deadband < 0:
        raise ValueError(f"deadband={deadband}: must be >= 0")
    if straggler_limit <= 1.0:
        raise ValueError(f"straggler_limit={straggler_limit}: must be > 1")

    notes: list[str] = []
    lines, known = _lines(model, names, priors, notes)
    drop: list[str] = []

    # Fewer samples than members: keep the fastest B members (ties by name).
    if global_batch < len(names):
        by_speed = sorted(names, key=lambda m: (lines[m].time(1), m))
        for m in by_speed[global_batch:]:
            drop.append(m)
            notes.append(
                f"{m}: dropped, global batch {global_batch} is smaller than the "
                f"{len(names)} members (each needs at least 1 sample); it is among the slowest"
            )
        names = sorted(by_speed[:global_batch])

    # Stragglers: a member pinned at one sample that still holds the whole ring back.
    while len(names) > 1:
        cont = solve_continuous({m: lines[m] for m in names}, global_batch)
        pinned = [m for m in names if cont[m] <= 1.0]
        if not pinned:
            break
        worst = max(pinned, key=lambda m: (lines[m].time(1), m))
        others = [m for m in names if m != worst]
        rest = optimal_sizes({m: lines[m] for m in others}, global_batch) if global_batch >= len(
            others
        ) else None
        t_without = makespan(lines, rest) if rest else math.inf
        # Evidence, not a fit: the fastest of its steps measured at one sample (contention
        # only ever adds time, so the minimum is the optimistic figure). A noisy fit alone
        # never drains a worker; it is pinned at one sample until the evidence is in.
        at_one = [t for b, t in model.observations(worst)[-model.window :] if b == 1]
        t_worst = min(at_one) if len(at_one) >= STRAGGLER_EVIDENCE else 0.0
        if known and t_worst > straggler_limit * t_without:
            drop.append(worst)
            notes.append(
                f"{worst}: dropped, one sample takes {t_worst:.4g}s while the other members "
                f"finish B={global_batch} in {t_without:.4g}s (over {straggler_limit}x slower)"
            )
            names = others
            continue
        for m in pinned:
            notes.append(f"{m}: pinned at the minimum of 1 sample (too slow for a larger share)")
        break

    active = {m: lines[m] for m in names}
    target = solve_continuous(active, global_batch)
    same = (
        previous is not None
        and sorted(previous) == names
        and sum(previous[m] for m in names) == global_batch
        and all(previous[m] >= 1 for m in names)
    )
    if not known:
        sizes = equal_sizes(names, global_batch)
        notes.append("no speed known yet: equal sizes")
    elif not same:
        sizes = optimal_sizes(active, global_batch)
    else:
        assert previous is not None
        prev = {m: int(previous[m]) for m in names}
        moved = {m: prev[m] + damping * (target[m] - prev[m]) for m in names}
        if all(abs(target[m] - prev[m]) <= 1.0 for m in names):
            sizes = optimal_sizes(active, global_batch)  # close: take the integer optimum
        else:
            sizes = _round_minimax(active, moved, global_batch)
        t_prev, t_new = makespan(active, prev), makespan(active, sizes)
        if t_prev <= t_new * (1.0 + deadband):
            sizes = prev
    predicted = makespan(active, sizes) if known else None
    return BatchPlan(
        sizes={m: sizes[m] for m in names},
        drop=tuple(drop),
        notes=tuple(notes),
        predicted_step_s=predicted,
        target=target,
    )


def _lines(
    model: SpeedModel, names: Sequence[str], priors: Mapping[str, float], notes: list[str]
) -> tuple[dict[str, LinearFit], bool]:
    """A line per member: its fit, else its prior, else the median of the others.

    Returns the lines and whether any speed is known at all.
    """
    lines: dict[str, LinearFit] = {}
    for m in names:
        line = fit(model, m)
        if line is not None:
            lines[m] = line
        elif m in priors:
            lines[m] = LinearFit(0.0, 1.0 / float(priors[m]), 0)
            notes.append(f"{m}: no measured step yet, using its prior of {priors[m]:.4g} samples/s")
    if not lines:
        return {m: LinearFit(0.0, 1.0, 0) for m in names}, False
    per_sample = _median([lines[m].per_sample_s for m in sorted(lines)])
    for m in names:
        if m not in lines:
            lines[m] = LinearFit(0.0, per_sample, 0)
            notes.append(f"{m}: no measured step and no prior, assuming the median speed")
    return lines, True


def speed_to_plain(model: SpeedModel) -> dict[str, object]:
    """``model`` as plain data (lists and numbers) for the training state."""
    return {"history": [[name, [[b, t] for b, t in obs]] for name, obs in model.history],
            "window": model.window, "forget": model.forget}


def speed_from_plain(d: Mapping[str, object]) -> SpeedModel:
    """The inverse of :func:`speed_to_plain`. Raises ``ValueError``/``TypeError`` on bad data."""
    history = tuple((str(name), tuple((int(b), float(t)) for b, t in obs))
                    for name, obs in d["history"])  # type: ignore[union-attr]
    return SpeedModel(history, int(d["window"]), float(d["forget"]))  # type: ignore[arg-type]
