"""The protocol room: what travels between workers and the coordinator, and how it is carried.

:mod:`.messages` every key of the control store and every message, parsed and validated (the
states and outcomes as enums, the :class:`~.messages.Plan` of a generation);
:mod:`.admission` the token handshake and the sealed frames; :mod:`.store` the coordinator's
control store (a TCP server only token holders reach); :mod:`.store_client` a worker's
connection to it, which is also a ``torch.distributed.Store`` (the rendezvous of every
generation's process groups runs over it).

Rule: this room imports only :mod:`trainer.errors`; everything else in the trainer may import
it. It holds no decision, only the vocabulary and the wire.
"""
