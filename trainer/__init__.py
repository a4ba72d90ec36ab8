"""spotring trainer: a data-parallel ring that keeps training while workers join and vanish.

A coordinator (:mod:`trainer.control`) holds the membership over an authenticated key-value
store (:mod:`trainer.protocol`: only token holders can reach it); workers (``python -m
trainer worker``, :mod:`trainer.worker`) build one process group per generation
(:mod:`trainer.collective`), receive state from peers when they join (tensors and plain
data, no pickle: :mod:`trainer.state`), and split the constant global batch by measured
speed (:mod:`trainer.data`). A user writes a :class:`trainer.job.Job`; every failure is a
:class:`trainer.errors.TrainerError`. The rooms and what each may import:
docs/architecture.md.
"""
