"""spotring provisioner: decide, launch and drop transient GPU instances.

The optimiser (:mod:`provisioner.plan.solve`) turns offerings, risk and throughput into a
target fleet; the reconciler turns target minus actual into actions; drivers
(:mod:`provisioner.drivers`) carry them out per cloud; the daemon (:mod:`provisioner.daemon.loop.scheduler`)
runs the loop on apscheduler. ``provision`` is the command line (:mod:`provisioner.cli`).
"""
