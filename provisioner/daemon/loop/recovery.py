"""What a (re)started daemon finishes and adopts before it plans anything.

Design: one function over the state and the driver. Open launch intents are repeated with
their token (the cloud returns the first attempt's instances instead of launching again),
open terminations are repeated, and the cloud's instances tagged with the job are listed:

- launched by an intent this state knows (tag ``token``, or the id): **adopted**;
- unknown to this state (a fresh or lost state file, another directory, a state restored
  from a backup): **adopted** too, and said so in the time line. An instance tagged with the
  job is the job's: it is never killed without proof. The planner then decides whether the
  fleet needs it; a surplus instance is drained through the ring like any other, at a step
  boundary;
- named by a termination this state already completed (proof: this daemon ended it, and it
  is still alive): terminated again;
- ended in this state for another reason but alive in the cloud: reported, left alone.

Instances the state holds that the cloud no longer lists are closed ("gone while the daemon
was down").

Rule: run before the first plan, from the thread that starts the daemon.
"""

from __future__ import annotations

import logging

from provisioner.daemon.loop.actuator import WriteAheadActuator
from provisioner.daemon.state import EventKind, IntentKind, State
from provisioner.drivers.base import CloudDriver, LaunchRequest
from provisioner.errors import CapacityError, DriverError

log = logging.getLogger(__name__)


def recover(job_id: str, driver: CloudDriver, state: State, actuator: WriteAheadActuator,
            t: float) -> None:
    """Finish open intents, adopt the job's instances (see the module docstring)."""
    for intent in state.open_intents():
        if intent.kind == IntentKind.LAUNCH and intent.offering is not None:
            try:
                res = driver.launch(LaunchRequest(intent.offering, intent.count, job_id,
                                                  intent.token, actuator.env_for(intent.offering)))
            except (CapacityError, DriverError) as exc:
                state.abandon_intent(intent.token, t, f"failed after restart: {exc}")
                continue
            state.finish_launch(intent.token, [(i.id, i.offering) for i in res.instances], t,
                                "finished after restart")
            state.record_event(t, EventKind.RECOVERED_LAUNCH,
                               detail=f"{intent.token}: {len(res.instances)} instances")
        elif intent.kind == IntentKind.TERMINATE:
            driver.terminate(list(intent.instance_ids))
            state.finish_terminate(intent.token, t, "terminated after restart")
    intents = state.intents()
    launched_tokens = {i.token for i in intents if i.kind == IntentKind.LAUNCH}
    launched_ids = {iid for i in intents if i.kind == IntentKind.LAUNCH for iid in i.instance_ids}
    ended_by_us = {iid for i in intents if i.kind == IntentKind.TERMINATE and i.done is not None
                   for iid in i.instance_ids}
    rows = {r.id: r for r in state.instances()}
    live = {iid: r for iid, r in rows.items() if r.ended_at is None}
    cloud = driver.list(job_id)
    doomed = []
    for inst in cloud:
        if inst.id in live:
            continue
        if inst.id in ended_by_us:
            doomed.append(inst.id)
        elif inst.id in rows:
            state.record_event(t, EventKind.ADOPTED, inst.id, inst.offering,
                               f"alive in the cloud but ended here ({rows[inst.id].end_reason}); "
                               f"left alone")
        else:
            token = inst.tags.get("token")
            known = token in launched_tokens or inst.id in launched_ids
            state.adopt(inst.id, inst.offering, t, token)
            state.record_event(t, EventKind.ADOPTED, inst.id, inst.offering,
                               "launched by this state" if known else
                               "tagged with the job, unknown to this state: adopted, not killed")
            if not known:
                log.warning("adopted %s: tagged with job %s but unknown to this state", inst.id,
                            job_id)
    if doomed:
        actuator.terminate_ids(doomed, "ended by this daemon before, still alive: terminated "
                               "again")
    seen = {i.id for i in cloud}
    for iid in live:
        if iid not in seen:
            state.end_instance(iid, t, "gone while the daemon was down")
            state.record_event(t, EventKind.GONE, iid, live[iid].offering)
