"""The provisioning loop of one job: the scheduler's four jobs and the parts they move data
between (the market view, the write-ahead actuator, recovery at start, telemetry).

Design: nothing in this room knows where the run lives (a work directory, a state file) or
how it ends; it is built by :func:`provisioner.daemon.wiring.build_daemon` over injected
edges (driver, price feed, state, clock, coordinator, metrics sink).

Rule: import only the daemon's leaves (:mod:`..state`, :mod:`..ports`, :mod:`..outcome`) and
:mod:`provisioner.daemon.view`, never :mod:`provisioner.daemon.run`.
"""
