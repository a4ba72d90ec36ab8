"""What a (re)started daemon finishes and adopts before it plans anything.

Design: one function over the state and the driver. Open launch intents are repeated with
their token (the cloud returns the first attempt's instances instead of launching again),
open terminations are repeated, the cloud's instances tagged with the job are listed and
adopted when a known intent launched them, strays are terminated, and instances gone while
the daemon was down are closed. This is where adopting a running fleet on restart (a fresh
or missing state file, a local workdir) belongs.

Rule: run before the first plan, from the thread that starts the daemon.
"""

from __future__ import annotations

import logging
from typing import Mapping

from provisioner.daemon.actuator import WriteAheadActuator
from provisioner.daemon.state import EventKind, IntentKind, State
from provisioner.drivers.base import CloudDriver, LaunchRequest
from provisioner.errors import CapacityError, DriverError

log = logging.getLogger(__name__)


def recover(job_id: str, driver: CloudDriver, state: State, actuator: WriteAheadActuator,
            t: float, launch_env: Mapping[str, str]) -> None:
    """Finish open intents, adopt the job's instances, terminate strays."""
    for intent in state.open_intents():
        if intent.kind == IntentKind.LAUNCH and intent.offering is not None:
            try:
                res = driver.launch(LaunchRequest(intent.offering, intent.count, job_id,
                                                  intent.token, dict(launch_env)))
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
    known_tokens = {i.token for i in state.intents()}
    known_ids = {iid for i in state.intents() for iid in i.instance_ids}
    live = {r.id: r for r in state.live_instances()}
    cloud = driver.list(job_id)
    strays = []
    for inst in cloud:
        if inst.id in live:
            continue
        if inst.tags.get("token") in known_tokens or inst.id in known_ids:
            state.adopt(inst.id, inst.offering, t, inst.tags.get("token"))
            state.record_event(t, EventKind.ADOPTED, inst.id, inst.offering)
        else:
            strays.append(inst.id)
    if strays:
        actuator.terminate_ids(strays, "stray: tagged with the job but launched by no known "
                               "intent")
    seen = {i.id for i in cloud}
    for iid in live:
        if iid not in seen:
            state.end_instance(iid, t, "gone while the daemon was down")
            state.record_event(t, EventKind.GONE, iid, live[iid].offering)
