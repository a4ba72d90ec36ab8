"""The worker room: one process that trains, joins, leaves and joins again.

:mod:`.loop` the process (:class:`~.loop.Worker`: load, profile, join, map how a membership
ended to an exit code); :mod:`.member` the member skeleton (wait, form, step, commit, leave:
written once for every training mode); :mod:`.decision` what a member does with a plan it
reads, as a pure function; :mod:`.modes` the training modes plugged into the skeleton (the
ring, the pipeline, the hybrid); :mod:`.runtime` the device, the input feed and the
emulations; :mod:`.outputs` what a worker writes (metrics, samples, the trained model,
snapshots); :mod:`.client` its side of the protocol (connect, join, heartbeat);
:mod:`.devices` the device a worker computes on; :mod:`.notice` the cloud's notices.

Rule: the top of the dependency order: it may import every other room but
:mod:`trainer.control`; nothing but the command line imports it.
"""
