"""The daemon of ``provision run``: the provisioning loop of one job, and its parts.

Design: split along its seams (DESIGN.md §5). :mod:`.scheduler` runs the four apscheduler
jobs and nothing else; :mod:`.market` holds the price view, :mod:`.actuator` the
write-ahead launches and terminations, :mod:`.recovery` what a restart finishes and adopts,
:mod:`.telemetry` metrics, throughput and ring events, :mod:`.status` the view the
dashboard reads; :mod:`.wiring` is the one composition root and :mod:`.local` the embedded
local run. :mod:`.state` is the SQLite write-ahead log they share.

Rule: build a daemon only through :func:`provisioner.daemon.wiring.build_daemon`.
"""
