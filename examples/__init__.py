"""Real models on real data, shipped with spotring: in a clone, ``examples/``; in an installed
wheel, the package ``spotring_examples`` (so ``--job spotring_examples.digits`` works anywhere).

Each module is a trainer job: it defines ``make_job(seed) -> trainer.job.Job``
(see :mod:`trainer.job`). ``digits`` is the main job's: a small CNN on scikit-learn's digits.
``gpt`` is a GPT-style language model written as nanoGPT's loop is (a dict batch, the model
returning its loss, warmup + cosine, clipping, accumulation, ``max_steps``); ``images`` is an
image classifier as the torchvision reference trains one (BatchNorm, mixup, label smoothing,
an EMA in ``extra_state``, a per-epoch schedule).
"""
