"""What DDP's agents average over, provided by whoever runs them: the rendezvous store and the group's
collectives behind one narrow interface, as torchft's ``Manager`` stands between its algorithms and the wire.

:class:`~mpca.algorithm.ddp.DDPAgent` holds the algorithm — what is reduced every step (the gradients and two
flags), the mean, the compressed ring's error feedback, who re-forms the group when and from whose replica
(:mod:`mpca.algorithm.membership`) — and asks its ``AgentContext.collective`` for the transport alone:

* the Spark runtime gives it :class:`mpca.runtime.collective.TorchCollective`: the TCPStore that the driver's
  :class:`~mpca.algorithm.ddp.DDPDriver` hosts and a torch.distributed process group (gloo or NCCL);
* the simulator gives it :class:`mpca.sim.collective.LockStepCollective`: an in-process store and the K agents'
  calls met in one place, their sums taken in rank order.

So the simulator runs ddp's own agent rule, not a copy of its arithmetic.
"""
from __future__ import annotations

import abc
from typing import Any

import torch

from mpca.algorithm.wire import ErrorFeedback


class Collective(abc.ABC):
    """One agent's handle on the transport among the agents (see the module doc).  ``rank`` and ``world`` are
    those of the group last formed."""

    rank: int = 0
    world: int = 1

    @abc.abstractmethod
    def store(self, timeout_s: float) -> Any:
        """The run's rendezvous store (a ``torch.distributed.Store``: ``set``, ``get``, ``add``, ``check``,
        ``compare_set``), shared by every agent; only decisions and counters go through it."""

    @abc.abstractmethod
    def form(self, store: Any, rank: int, world: int, device: torch.device, lossy: bool) -> str:
        """Join a new group of ``world`` ranks as ``rank``, meeting under ``store`` (the generation's own
        prefix); ``lossy``: gradients will go round :meth:`ring_all_reduce_`.  Returns the backend's name."""

    @abc.abstractmethod
    def leave(self) -> None:
        """Leave the group formed last (nothing when none is)."""

    @abc.abstractmethod
    def all_reduce_(self, flat: torch.Tensor) -> None:
        """Replace ``flat`` by its sum over the group's ranks; RuntimeError when a rank is gone or silent past
        the timeout."""

    @abc.abstractmethod
    def broadcast_(self, tensor: torch.Tensor, src: int) -> None:
        """Replace ``tensor`` on every rank by rank ``src``'s."""

    @abc.abstractmethod
    def ring_all_reduce_(self, flat: torch.Tensor, feedback: ErrorFeedback) -> int:
        """Replace ``flat`` (a CPU vector) by its sum over the ranks through the encoded ring
        (:func:`mpca.algorithm.ring.ring_sum`, this rank's ``feedback``); the bytes this rank sent."""
