"""Which durable snapshot a generation resumes from: pure reading of what the coordinator's
vault publishes (``snapshot/all``, newest first; ``snapshot/latest``) and of what failed.

Design: the decision (:func:`trainer.control.decide.decide`) names the newest snapshot of
this job that no member reported it could not load; these functions only parse and order
(bounded: :func:`trainer.protocol.messages.parse_json`), so a forged or malformed listing is
an empty one, never an error.

Rule for callers: pass the raw store values; never trust a listing beyond its JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from trainer.errors import Malformed
from trainer.protocol import messages as mb
from trainer.protocol.messages import Plan


def resume_name(plan: Plan) -> str:
    """The name of the snapshot ``plan`` resumes from ("" when none)."""
    if not plan.resume:
        return ""
    try:
        return str(mb.parse_json(plan.resume, "resume", max_depth=1).get("name", ""))
    except (Malformed, AttributeError):
        return ""


def listed(raw_all: bytes | None, raw_latest: bytes | None, job: str
           ) -> list[tuple[str, str, int]]:
    """This job's complete snapshots, newest first: ``(manifest JSON, name, step)`` each,
    from ``snapshot/all`` (or ``snapshot/latest`` alone, from a vault that lists none)."""
    own, out = job, []
    try:
        items = mb.parse_json(raw_all, "snapshots", max_depth=2)
    except Malformed:
        items = None
    if not isinstance(items, list):
        try:
            items = [mb.parse_json(raw_latest, "snapshot", max_depth=1)]
        except Malformed:
            return []
    for d in items[:64]:
        try:
            step, job, name = int(d["step"]), str(d.get("job", "")), str(d["name"])
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            continue
        if own and job and job != own:
            continue  # another job's snapshot: never loaded into this one
        out.append((json.dumps(d, sort_keys=True), name, step))
    return sorted(out, key=lambda x: -x[2])


def no_snapshot_loads(failed: Mapping[str, str]) -> str:
    """Why no snapshot can restore the state: each one tried and why it failed."""
    if not failed:
        return "and no snapshot"
    return "and no snapshot loads (" + "; ".join(
        f"{n}: {why}" for n, why in sorted(failed.items())) + ")"
