"""What people and tools see of a run: the status, the savings, the dashboard, the report and
the Prometheus metrics.

Design: reads and arithmetic only: every module takes data (a
:class:`~provisioner.daemon.view.status.Status`, a read-only
:class:`~provisioner.daemon.state.State`) and returns or renders it; none calls a driver or
the ring, so the dashboard can refresh four times a second and ``provision status`` can read
a state another process writes.

Rule: import only the daemon's leaves (:mod:`..state`, :mod:`..ports`, :mod:`..outcome`).
"""
