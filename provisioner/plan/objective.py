"""The user's objective in the planner's terms: ONE function for every caller.

Design: :func:`planner_input` is the only place validated settings become what the planner
reads: the :class:`~provisioner.plan.pipeline.PlanSettings` (every knob and constraint of a
decision: bounds, quotas, markets, links, the hourly cap, the spot price cap, the churn
limits) and the :class:`Goal` (the work, the deadline and whether it is the user's, the
total budget). The daemon (``provision run``), ``provision plan`` and the simulator's
spotring policy all call it, so a simulated decision is made with the daemon's own input,
whole (the simulator used to rebuild the settings and dropped fifteen fields on the way).

How an objective becomes a goal:

- ``deadline``: ``work_samples`` by ``deadline_hours`` from the job's start, hard (the
  planner pays on-demand to keep it);
- ``min-cost`` with ``work_samples``: the work paced at ``target_samples_per_s``, a soft
  deadline (the job's own pace: late rather than dear); without work, one open-ended solve;
- ``max-throughput``: open-ended.

``[job] budget_usd`` rides along in every goal; ``[job] max_hourly_cost`` and
``objective.budget_per_hour`` cap every fleet (the smaller holds); ``[job]
max_spot_price`` removes dearer spot offerings. :func:`sim_objective` is how the
simulator's flags (``--work``, ``--deadline``, the baselines' nominal rate as the job's own
pace) become that same objective.

Rule for callers: build the input once per job with :func:`planner_input` and the
:class:`Progress` of each decision with :meth:`Goal.progress`; never map settings to a
planner input by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from provisioner.plan.pipeline import Goal, PlannerInput, plan_settings

__all__ = ["Goal", "PlannerInput", "goal_of", "planner_input", "sim_objective"]

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.config import Settings


def goal_of(settings: "Settings") -> Goal:
    """The :class:`Goal` of validated settings (see the module docstring)."""
    obj, job = settings.objective, settings.job
    if obj.kind == "deadline" and obj.work_samples and obj.deadline_hours:
        return Goal(obj.work_samples, obj.deadline_hours * 3600.0, True, job.budget_usd)
    if obj.kind == "min-cost" and obj.work_samples and obj.target_samples_per_s:
        return Goal(obj.work_samples, obj.work_samples / obj.target_samples_per_s, False,
                    job.budget_usd)
    return Goal(obj.work_samples, None, True, job.budget_usd)


def planner_input(settings: "Settings") -> PlannerInput:
    """THE planner input of validated settings: the daemon, ``provision plan`` and the
    simulator call this and nothing else."""
    return PlannerInput(plan_settings(settings), goal_of(settings))


def sim_objective(settings: "Settings", *, work: float, deadline_h: float | None,
                  pace_samples_per_s: float) -> "Settings":
    """``settings`` with the simulator's objective: ``work`` samples by the user's
    ``deadline_h`` (hard; None: the config's own deadline when it has one), else at
    ``pace_samples_per_s`` (the baselines' nominal ring: the job's own, soft, pace).
    Everything else is the settings' own, untouched."""
    from provisioner.config import with_objective

    obj = settings.objective
    if deadline_h is None and obj.kind == "deadline" and obj.deadline_hours:
        deadline_h = obj.deadline_hours
    if deadline_h is not None:
        return with_objective(settings, kind="deadline", work_samples=work,
                              deadline_hours=deadline_h, target_samples_per_s=None)
    return with_objective(settings, kind="min-cost", work_samples=work,
                          target_samples_per_s=pace_samples_per_s, deadline_hours=None)
