"""spotring trainer: a data-parallel ring that keeps training while workers join and vanish.

A coordinator (:mod:`trainer.coordinator`) holds the membership over a torch ``TCPStore``;
workers (``python -m trainer worker``) build one process group per generation
(:mod:`trainer.ring`), receive state from peers when they join (:mod:`trainer.sync`), and split
the constant global batch by measured speed (:mod:`trainer.batching`).
"""
