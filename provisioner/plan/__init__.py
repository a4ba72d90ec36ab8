"""What fleet to hold, and why: pure decisions, no I/O.

Design: frozen data in, frozen data out. :mod:`.model` holds the solver's vocabulary
(Candidate, Problem, Plan), :mod:`.objective` turns the user's objective into the planner's
input (the one function the daemon, ``provision plan`` and the simulator call),
:mod:`.build` turns settings and quotes into a Problem, :mod:`.solve` and :mod:`.milp` solve
it, :mod:`.throughput` is the speed model, :mod:`.reconcile` turns a target into actions,
:mod:`.pacing` keeps a job on its progress line, :mod:`.budget` its money,
:mod:`.spread` its risk of losing half a ring at once, and :mod:`.pipeline` is THE decision
the daemon, ``provision plan`` and the simulator's spotring policy all call.

Rule: nothing in this package reads a file, calls a cloud, sleeps or prints.
"""
