"""The control room: the coordinator, which owns membership and never trains.

:mod:`.decide` one tick of the membership protocol as a pure function (state and reads in,
new state and actions out); :mod:`.state` the frozen state, reads and actions it works on;
:mod:`.plans` the planning rules of the next generation; :mod:`.coordinator` the thread
that reads the store, calls :func:`~.decide.decide` and executes the actions (the one
executor), and keeps the durable snapshots' vault.

Rule: this room imports :mod:`trainer.protocol`, :mod:`trainer.state` (the snapshot vault)
and :mod:`trainer.errors` only; no worker code runs here.
"""
