"""Real models on real data, shipped with spotring: in a clone, ``examples/``; in an installed
wheel, the package ``spotring_examples`` (so ``--job spotring_examples.digits`` works anywhere).

Each module is a trainer job: it defines ``make_job(seed) -> trainer.job.Job``
(see :mod:`trainer.job`). ``digits`` is the main job's: a small CNN on scikit-learn's digits.
"""
