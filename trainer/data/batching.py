"""Per-worker batch sizes from measured speed, so every member of the ring finishes together.

Design. Each member's compute time per step is modelled as ``t_i(b) = a_i + c_i * b`` (a fixed
cost plus a cost per sample). :func:`observe` folds measured :class:`StepTiming` records into
a :class:`SpeedModel`, which keeps the last ``window`` observations per member; the fit is a
weighted least-squares line with exponential forgetting (newer steps weigh more), falling
back to a line through the origin (``a_i = 0``) while one batch size only has been seen.
:func:`plan_batches` then solves, for the global batch ``B``::

    a_i + c_i * b_i = T   for every member i,     sum_i b_i = B,     b_i >= m

where ``m`` is the job's minimum local batch (``min_batch``: 1 by default, 2 for a model with
BatchNorm, which needs more than one value per channel in training; see
:func:`default_min_batch`). Continuous "water filling": members whose share would fall below
``m`` samples are pinned at ``m`` and the rest re-solved. It rounds to integers that keep
``sum b_i = B`` exactly (floors, never below ``m``, then each remaining sample to the member
that would finish earliest with it, ties by member name: rounding for the step time, so the
slowest member never keeps a sample a faster one could take), and refines online with a
damped controller: the new sizes move a fraction ``damping`` of the way from the previous
sizes toward the target, and sizes are kept when the predicted step time would improve by
less than ``deadband`` (hysteresis, so measurement noise cannot make the sizes flap). When
the members differ from the previous plan (a generation change) the target is taken at once,
using the fits of the survivors and ``priors`` (samples per second, e.g. from a joiner's
profiling steps) for the joiners.

Bad input is a decision, never a crash or a silent zero: with ``B`` smaller than ``m`` times
the number of members the slowest members beyond ``B // m`` are listed in ``BatchPlan.drop``
(the caller drains them and logs the reason in ``BatchPlan.notes``); a member so slow that
even ``m`` samples would make the ring more than ``straggler_limit`` times slower (the
fastest of at least three steps measured at ``m`` samples or fewer says so, not a noisy fit)
is dropped the same way; any other member gets at least ``m`` samples, here and in
:func:`head_start` (the evaluation head start). ``ValueError`` names the argument for
nonsense (``B <= 0``, ``B < m``, ``m < 1``, no members, a non-positive prior).

Rule for callers: every member of the ring must call :func:`observe` and
:func:`plan_batches` with the same (all-gathered) timings and arguments; both functions are
pure and deterministic (members are sorted, sums run in a fixed order), so every member
computes the same plan without another round of communication. Weight each member's gradient
by ``b_i / B`` (:func:`gradient_weight`) and sum them: the result is the full-batch gradient.
Pass the job's ``min_batch`` to every sizing call (:func:`plan_batches`, :func:`head_start`,
and ``trainer.data.sampler.scale_sizes`` for the short last step of an epoch); a member with size
0 still runs the step (no forward, a zero gradient) and joins the collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:  # for the annotation only: this module imports torch on use only
    import torch

__all__ = [
    "BatchPlan",
    "LinearFit",
    "SpeedModel",
    "StepTiming",
    "default_min_batch",
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
    """Local batch sizes for one step: ``sum(sizes.values()) == B``, every size >= ``min_batch``.

    ``drop`` lists members that get no share and should be drained; ``notes`` says why, and
    any other decision worth logging (a prior used, a size pinned at the minimum).
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


def _check_min_batch(min_batch: object) -> int:
    """``min_batch`` if it is an integer >= 1, else ``ValueError`` naming it."""
    if not isinstance(min_batch, int) or isinstance(min_batch, bool) or min_batch < 1:
        raise ValueError(f"min_batch={min_batch!r}: must be an integer >= 1")
    return min_batch


def _samples(n: int) -> str:
    return f"{n} sample" if n == 1 else f"{n} samples"


def solve_continuous(
    lines: Mapping[str, LinearFit], global_batch: float, *, min_batch: int = 1
) -> dict[str, float]:
    """Continuous sizes with ``a_i + c_i b_i = T`` for all i, ``sum b_i = B``, ``b_i >= m``.

    ``m`` is ``min_batch``. Members whose share falls below ``m`` samples are pinned at ``m``
    and the others re-solved ("water filling"). Returns sizes in sorted member order.
    Raises ``ValueError``: ``B`` smaller than ``m`` times the number of members (naming
    ``global_batch``), ``min_batch`` not an integer >= 1.
    """
    lo = _check_min_batch(min_batch)
    names = sorted(lines)
    if global_batch < lo * len(names):
        raise ValueError(
            f"global_batch={global_batch}: smaller than the {len(names)} members"
            + ("" if lo == 1 else f" times min_batch={lo}")
        )
    pinned: set[str] = set()
    while True:
        free = [m for m in names if m not in pinned]
        rest = global_batch - lo * len(pinned)
        if not free:
            return {m: float(lo) for m in names}
        inv = sum(1.0 / lines[m].per_sample_s for m in free)
        off = sum(lines[m].fixed_s / lines[m].per_sample_s for m in free)
        finish = (rest + off) / inv
        sizes = {m: (finish - lines[m].fixed_s) / lines[m].per_sample_s for m in free}
        low = [m for m in free if sizes[m] < float(lo)]
        if not low:
            sizes.update({m: float(lo) for m in pinned})
            return {m: sizes[m] for m in names}
        pinned.update(low)


def makespan(lines: Mapping[str, LinearFit], sizes: Mapping[str, int]) -> float:
    """Predicted step compute time: the slowest member's ``a_i + c_i b_i``."""
    return max(lines[m].time(sizes[m]) for m in sorted(sizes))


def _round_minimax(
    lines: Mapping[str, LinearFit], values: Mapping[str, float], total: int, *,
    min_batch: int = 1,
) -> dict[str, int]:
    """Integer sizes near ``values`` (each >= ``min_batch``, sum ``total``), rounded for the
    step time.

    Starts from the floors of ``values`` (at least ``min_batch``), then hands each remaining
    sample to the member that would finish earliest with it, or takes surplus samples from
    the member that finishes last and is above the minimum (ties: the faster member gets the
    sample, then by name). Unlike rounding by remainders, this never leaves the slowest
    member a sample it would have lost to a faster one. Raises ``ValueError`` when ``total``
    is smaller than ``min_batch`` times the number of members, or ``min_batch`` is not an
    integer >= 1.
    """
    lo = _check_min_batch(min_batch)
    if total < lo * len(values):
        raise ValueError(
            f"total={total}: smaller than min_batch={lo} times the {len(values)} members")
    sizes = {m: max(lo, math.floor(values[m])) for m in sorted(values)}
    # Ties in time (float rounding) go to the member with the smaller per-sample cost, so
    # a faster member never ends up with fewer samples than a slower one.
    while sum(sizes.values()) > total:  # only possible through the max(lo, .) above
        m = max((m for m in sorted(sizes) if sizes[m] > lo),
                key=lambda m: (lines[m].time(sizes[m]), lines[m].per_sample_s))
        sizes[m] -= 1
    while sum(sizes.values()) < total:
        m = min(sorted(sizes), key=lambda m: (lines[m].time(sizes[m] + 1), lines[m].per_sample_s))
        sizes[m] += 1
    return sizes


def optimal_sizes(
    lines: Mapping[str, LinearFit], global_batch: int, *, min_batch: int = 1
) -> dict[str, int]:
    """The integer sizes (each >= ``min_batch``, sum ``B``) that minimise the slowest
    member's time.

    Exact: starts from the floors of :func:`solve_continuous` and hands each remaining sample
    to the member that would finish earliest with it (ties by name). Used as the reference
    optimum by tests and benchmarks. Raises ``ValueError`` as :func:`solve_continuous`.
    """
    cont = solve_continuous(lines, global_batch, min_batch=min_batch)
    return _round_minimax(lines, cont, global_batch, min_batch=min_batch)


def head_start(model: SpeedModel, sizes: Mapping[str, int], busy: Mapping[str, float],
               *, min_batch: int = 1) -> dict[str, int]:
    """Sizes for one step in which some members are busy ``busy[m]`` seconds before they can
    start computing (the member that evaluates the model at an epoch end): the same total
    re-split so that every member's busy time plus compute time ends together, on the fitted
    lines. Members with size 0 keep 0; every other member gets at least ``min_batch``
    samples (however long it is busy). Returns ``sizes`` unchanged when nobody is busy, a
    member has no fitted line yet, fewer than two members compute, or the total is smaller
    than ``min_batch`` times the members that compute. Pure. Raises ``ValueError`` naming
    ``busy`` (not a finite number of seconds >= 0) or ``min_batch`` (not an integer >= 1).
    """
    lo = _check_min_batch(min_batch)
    for m, x in sorted(busy.items()):
        if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
            raise ValueError(f"busy[{m!r}]={x!r}: must be a finite number of seconds >= 0")
    active = sorted(m for m, b in sizes.items() if b > 0)
    if len(active) < 2 or not any(busy.get(m, 0.0) > 0 for m in active):
        return dict(sizes)
    if sum(sizes[m] for m in active) < lo * len(active):
        return dict(sizes)
    lines: dict[str, LinearFit] = {}
    for m in active:
        line = fit(model, m)
        if line is None:
            return dict(sizes)
        lines[m] = replace(line, fixed_s=line.fixed_s + busy.get(m, 0.0))
    out = dict(sizes)
    out.update(optimal_sizes(lines, sum(sizes[m] for m in active), min_batch=lo))
    return out


def equal_sizes(members: Sequence[str], global_batch: int, *, min_batch: int = 1
                ) -> dict[str, int]:
    """``B`` split as evenly as possible (the first members in sorted order get the extra).

    When ``B`` is smaller than ``min_batch`` times the members, only the first
    ``B // min_batch`` members (sorted order) share it and the others get 0, so every share
    is at least ``min_batch``. Raises ``ValueError`` naming ``global_batch`` when
    ``0 < B < min_batch`` (nobody could take a share), ``min_batch`` when it is not an
    integer >= 1.
    """
    lo = _check_min_batch(min_batch)
    names = sorted(set(members))
    if not names:
        raise ValueError("members: empty; there is nobody to split the batch between")
    if not isinstance(global_batch, int) or global_batch < 0:
        raise ValueError(f"global_batch={global_batch!r}: must be an integer >= 0")
    if 0 < global_batch < lo:
        raise ValueError(f"global_batch={global_batch}: smaller than min_batch={lo}")
    sharing = names[: global_batch // lo]  # all of them unless B < min_batch * members
    if not sharing:
        return {m: 0 for m in names}
    q, r = divmod(global_batch, len(sharing))
    out = {m: q + (1 if k < r else 0) for k, m in enumerate(sharing)}
    return {m: out.get(m, 0) for m in names}


def default_min_batch(model: torch.nn.Module) -> int:
    """The smallest local batch ``model`` can train on: 2 with BatchNorm, else 1.

    Any ``torch.nn.modules.batchnorm._BatchNorm`` (BatchNorm1d/2d/3d, their lazy forms,
    SyncBatchNorm), whatever its mode or ``track_running_stats``, makes it 2: in training
    BatchNorm needs more than one value per channel, and a BatchNorm1d given one sample
    raises ``ValueError: Expected more than 1 value per channel when training``. The
    minimum is per job, not per step, so a model put in eval mode for now still counts.
    Imports torch on use only (this module is otherwise torch-free). Raises ``ValueError``
    naming ``model`` when it is not a ``torch.nn.Module``.
    """
    import torch  # lazily: sizing itself never needs torch
    from torch.nn.modules.batchnorm import _BatchNorm

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model={type(model).__name__}: must be a torch.nn.Module")
    return 2 if any(isinstance(mod, _BatchNorm) for mod in model.modules()) else 1


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
    min_batch: int = 1,
) -> BatchPlan:
    """Choose local batch sizes for ``members`` that sum to ``global_batch``.

    ``priors`` gives samples/s for members with no observation yet (a joiner's profiling
    steps, or :func:`scale_relative_priors`); members with neither get the median speed of
    the others (equal sizes when nothing at all is known). ``previous`` is the plan in use;
    when it covers exactly ``members`` with the same total, the sizes move ``damping`` of the
    way toward the target, and stay put when that improves the predicted step time by less
    than ``deadband`` (relative). Otherwise (a generation change) the target is taken at once.

    ``min_batch`` (``m``) is the smallest local batch the job's model accepts (2 for a model
    with BatchNorm, see :func:`default_min_batch`): every member in ``sizes`` gets at least
    ``m`` samples, the water filling pins at ``m``, and the straggler rule judges a member by
    its time at ``m`` samples.

    Returns a :class:`BatchPlan`. Members in ``drop`` get no size: the slowest (at ``m``
    samples) beyond the first ``B // m`` when ``B`` is smaller than ``m`` times the number of
    members, and members whose step at ``m`` samples would make the ring more than
    ``straggler_limit`` times slower. Raises ``ValueError`` naming the argument:
    ``global_batch <= 0`` or smaller than ``min_batch`` (no member could take a share), no
    ``members``, duplicate members, a prior that is not a positive finite number,
    ``damping`` outside (0, 1], ``deadband < 0``, ``straggler_limit <= 1``, ``min_batch``
    not an integer >= 1.
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
    lo = _check_min_batch(min_batch)
    if global_batch < lo:
        raise ValueError(f"global_batch={global_batch}: smaller than min_batch={lo}; no member "
                         "could take a share")

    notes: list[str] = []
    lines, known = _lines(model, names, priors, notes)
    drop: list[str] = []

    # Fewer samples than members need: keep the fastest B // m members (ties by name).
    if global_batch < lo * len(names):
        keep, times = global_batch // lo, "" if lo == 1 else f" times min_batch={lo}"
        by_speed = sorted(names, key=lambda m: (lines[m].time(lo), m))
        for m in by_speed[keep:]:
            drop.append(m)
            notes.append(f"{m}: dropped, global batch {global_batch} is smaller than the "
                         f"{len(names)} members{times} (each needs at least {_samples(lo)}); "
                         "it is among the slowest")
        names = sorted(by_speed[:keep])

    # Stragglers: a member pinned at the minimum that still holds the whole ring back.
    while len(names) > 1:
        cont = solve_continuous({m: lines[m] for m in names}, global_batch, min_batch=lo)
        pinned = [m for m in names if cont[m] <= lo]
        if not pinned:
            break
        worst = max(pinned, key=lambda m: (lines[m].time(lo), m))
        others = [m for m in names if m != worst]
        rest = optimal_sizes({m: lines[m] for m in others}, global_batch, min_batch=lo) if (
            global_batch >= lo * len(others)
        ) else None
        t_without = makespan(lines, rest) if rest else math.inf
        # Evidence, not a fit: the fastest of its steps measured at the minimum or below
        # (contention only ever adds time and fewer samples take no longer, so the minimum
        # is the optimistic figure). A noisy fit alone never drains a worker; it is pinned at
        # the minimum until the evidence is in.
        at_min = [t for b, t in model.observations(worst)[-model.window :] if b <= lo]
        t_worst = min(at_min) if len(at_min) >= STRAGGLER_EVIDENCE else 0.0
        if known and t_worst > straggler_limit * t_without:
            drop.append(worst)
            what = "one sample takes" if lo == 1 else f"the minimum of {lo} samples takes"
            notes.append(
                f"{worst}: dropped, {what} {t_worst:.4g}s while the other members "
                f"finish B={global_batch} in {t_without:.4g}s (over {straggler_limit}x slower)"
            )
            names = others
            continue
        for m in pinned:
            notes.append(f"{m}: pinned at the minimum of {_samples(lo)} (too slow for a larger "
                         "share)")
        break

    active = {m: lines[m] for m in names}
    target = solve_continuous(active, global_batch, min_batch=lo)
    same = (
        previous is not None
        and sorted(previous) == names
        and sum(previous[m] for m in names) == global_batch
        and all(previous[m] >= lo for m in names)
    )
    if not known:
        sizes = equal_sizes(names, global_batch, min_batch=lo)
        notes.append("no speed known yet: equal sizes")
    elif not same:
        sizes = optimal_sizes(active, global_batch, min_batch=lo)
    else:
        assert previous is not None
        prev = {m: int(previous[m]) for m in names}
        moved = {m: prev[m] + damping * (target[m] - prev[m]) for m in names}
        if all(abs(target[m] - prev[m]) <= 1.0 for m in names):
            sizes = optimal_sizes(active, global_batch, min_batch=lo)  # close: the optimum
        else:
            sizes = _round_minimax(active, moved, global_batch, min_batch=lo)
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
