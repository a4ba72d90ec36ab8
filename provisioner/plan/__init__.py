"""What fleet to hold, and why: pure decisions, no I/O.

Design: frozen data in, frozen data out. :mod:`.model` holds the solver's vocabulary
(Candidate, Problem, Plan), :mod:`.build` turns settings and quotes into a Problem,
:mod:`.solve` and :mod:`.milp` solve it, :mod:`.throughput` is the speed model,
:mod:`.reconcile` turns a target into actions, :mod:`.pacing` keeps a job on its progress
line, and :mod:`.pipeline` is THE decision the daemon, ``provision plan`` and the
simulator's spotring policy all call.

Rule: nothing in this package reads a file, calls a cloud, sleeps or prints.
"""
