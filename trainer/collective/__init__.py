"""The collective room: process groups of one generation and what runs over them.

:mod:`.groups` one process group per generation over the authenticated store, and waits that
can be abandoned; :mod:`.reducer` gradients reduced in buckets during the backward pass;
:mod:`.step` one data-parallel step (compute, reduce, commit under the commit rule);
:mod:`.sync` the newest training state agreed and sent to the members that lack it.

Rule: this room imports :mod:`trainer.protocol` (the store its groups meet over),
:mod:`trainer.state` (the codec) and :mod:`trainer.errors`; it knows nothing of plans,
members or modes.
"""
