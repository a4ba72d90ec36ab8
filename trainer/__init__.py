"""spotring trainer: a data-parallel ring that keeps training while workers join and vanish.

A coordinator (:mod:`trainer.control.coordinator`) holds the membership over an authenticated
key-value store (:mod:`trainer.protocol.store`: only token holders can reach it); workers
(``python -m trainer worker``) build one process group per generation (:mod:`trainer.collective.groups`),
receive state from peers when they join (:mod:`trainer.collective.sync`, tensors and plain data, no
pickle), and split the constant global batch by measured speed (:mod:`trainer.data.batching`).
"""
