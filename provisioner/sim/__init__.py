"""The simulator: real traces replayed on a virtual clock against provisioning policies.

Design: :mod:`.world` builds price and availability step functions from a loaded trace,
:mod:`.revocations` revokes held instances as the data says (removals of the series, drawn
pool events that come together), :mod:`.engine` is the event loop that replays one policy,
:mod:`.fleet` the simulated fleet and the actuator through which the daemon's reconciler
carries a target out, :mod:`.execution` the elastic ring and checkpoint-restart,
:mod:`.policies` spotring (the daemon's planner, built from the daemon's own planner input)
and the baselines, :mod:`.hindsight` the offline lower bound, :mod:`.invariants` what must
hold on every trace, :mod:`.report` the markdown, JSON and plots.

Rule: the simulator never sleeps; times are Unix seconds (floats).
"""
