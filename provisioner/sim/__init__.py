"""The simulator: real traces replayed on a virtual clock against provisioning policies.

Design: :mod:`.world` builds price and availability step functions from a loaded trace,
:mod:`.engine` replays one policy (spotring decides through :mod:`provisioner.plan.pipeline`
and acts through the same reconciler as the daemon), :mod:`.hindsight` is the offline lower
bound, :mod:`.policies` the baselines, :mod:`.report` the markdown, JSON and plots.

Rule: the simulator never sleeps; times are Unix seconds (floats).
"""
