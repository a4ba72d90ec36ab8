"""The data room: which samples a member computes, and how they reach it.

:mod:`.sampler` the seeded order of each epoch and the global cursor (exactly once per
epoch); :mod:`.batching` each member's share of the global batch from its measured speed
(pure); :mod:`.feed` the input pipeline (loader processes, prefetch, pinning);
:mod:`.loader` what runs inside a loader process.

Rule: a leaf: this room imports only :mod:`trainer.errors`.
"""
