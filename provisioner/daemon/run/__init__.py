"""The life of one run on this machine: its options, its session (lock, work directory or
state file, registry entry, start, watch, end, report), the local and cloud environments,
and the operations on a run from outside it (detach, down, which run a command means).

Design: :class:`~provisioner.daemon.run.session.RunSession` is the one lifecycle; an
environment (:mod:`.local`, :mod:`.cloud`) supplies only what differs between the embedded
local cloud and AWS/GCP. The session takes a frozen
:class:`~provisioner.daemon.run.options.RunOptions`, never an argparse namespace, and never
prints: what a person should read goes to the command through an observer, and the end is
returned as data.

Rule: this room may import every other room of the daemon; nothing in the daemon imports it
(the commands do).
"""
