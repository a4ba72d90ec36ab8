"""The daemon of ``provision run``: the provisioning loop of one job, and the life of one run.

Design: rooms a newcomer can name (docs/architecture.md):

- the leaves every room shares: :mod:`.state` (the SQLite write-ahead log), :mod:`.ports`
  (the Protocols of the daemon's collaborators), :mod:`.outcome` (how a run ends, pure);
- :mod:`.view`: what people and tools see (status, savings, dashboard, report, Prometheus);
- :mod:`.loop`: the scheduler's four jobs and the parts they move data between (market view,
  write-ahead actuator, recovery, telemetry);
- :mod:`.wiring`: the one composition root;
- :mod:`.run`: the life of one run on this machine (:class:`~.run.session.RunSession` over a
  local or a cloud environment), and the operations on a run from outside it.

Rule: build a daemon only through :func:`provisioner.daemon.wiring.build_daemon`, and a run
only through :class:`provisioner.daemon.run.session.RunSession`; each room imports only what
its rule allows (``tests/provisioner/daemon/test_rooms.py``).
"""
