"""The state room: the training state, its progress, and how it is written down.

:mod:`.progress` the one record of training progress (step, data cursor, samples done,
steps lost); :mod:`.training` the training state a member holds and sends (model,
optimiser, scaler, progress, batch planner, metrics, RNG) assembled in one place;
:mod:`.codec` tensors and plain data to bytes and back, never pickle; :mod:`.snapshot`
durable snapshots (a directory, S3, GCS) and the coordinator's vault.

Rule: this room imports :mod:`trainer.data` (the cursor and the speed model it carries),
:mod:`trainer.protocol` (the snapshot keys) and :mod:`trainer.errors` only.
"""
