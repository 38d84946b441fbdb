"""The simulator's transport for ddp (:class:`mpca.algorithm.collective.Collective`): the K agents' rules run
in K threads of one process and meet in a :class:`Room`, so the simulator runs ddp's own agent rule
(:class:`~mpca.algorithm.ddp.DDPAgent`: the flags, the mean, the encoded ring with its error feedback) rather
than a copy of its arithmetic.

* the store is an in-process ``torch.distributed.HashStore`` shared by the room (the membership protocol's
  decisions and counters, as over the driver's TCPStore);
* a collective waits until every rank of the group has called it (a barrier); then one thread takes the result
  in rank order — the sum ``x₀ + x₁ + …`` for :meth:`~LockStepCollective.all_reduce_`, the source's tensor for
  :meth:`~LockStepCollective.broadcast_`, every rank's side of the ring hop by hop for
  :meth:`~LockStepCollective.ring_all_reduce_` (:func:`mpca.algorithm.ring.ring_in_lock_step`) — and every rank
  copies its part, so the results do not depend on which thread came first.

Only time is not the wire's: the simulator charges a step the slowest agent's device time plus the ring's
(:func:`mpca.sim.network.ring_allreduce_time`).  The room holds one group of ``world`` ranks: the simulator
does not simulate ddp's re-forming when agents come and go.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

import torch

from mpca.algorithm.collective import Collective
from mpca.algorithm.ring import ring_in_lock_step
from mpca.algorithm.wire import ErrorFeedback

WAIT_S = 600.0  # a rank that never comes: the others' barrier breaks instead of hanging the simulation


class Room:
    """Where the ``world`` ranks of one simulated group meet: the shared store and one slot per rank."""

    def __init__(self, world: int):
        import torch.distributed as dist

        self.world = world
        self.hash_store = dist.HashStore()
        self.slots: List[Any] = [None] * world
        self.results: List[Any] = [None] * world
        self._combine: Optional[Callable[[List[Any]], List[Any]]] = None
        self.barrier = threading.Barrier(world, action=self._meet, timeout=WAIT_S)

    def member(self, rank: int) -> "LockStepCollective":
        return LockStepCollective(self, rank)

    def _meet(self) -> None:
        self.results = self._combine(list(self.slots))

    def meet(self, rank: int, value: Any, combine: Callable[[List[Any]], List[Any]]) -> Any:
        """Rank ``rank``'s ``value`` in; once every rank's is, ``combine`` (every rank passes the same
        operation) maps the values in rank order to one result per rank; this rank's result out."""
        self.slots[rank] = value
        self._combine = combine
        self.barrier.wait()
        return self.results[rank]

    def abort(self) -> None:
        """A rank failed outside the room: the others' wait raises (threading.BrokenBarrierError)."""
        self.barrier.abort()


def _sum(values: List[torch.Tensor]) -> List[torch.Tensor]:
    total = values[0].clone()
    for v in values[1:]:
        total += v
    return [total] * len(values)


def _ring(values: List[tuple]) -> List[tuple]:
    sums, sent = ring_in_lock_step([x for x, _ in values], [fb for _, fb in values])
    return list(zip(sums, sent))


class LockStepCollective(Collective):
    """Rank ``rank``'s handle on a :class:`Room`."""

    def __init__(self, room: Room, rank: int):
        self.room = room
        self.rank, self.world = rank, room.world

    def store(self, timeout_s: float) -> Any:
        return self.room.hash_store

    def form(self, store: Any, rank: int, world: int, device: torch.device, lossy: bool) -> str:
        if (rank, world) != (self.rank, self.room.world):
            raise ValueError(f"the simulator's group is rank {self.rank} of {self.room.world}, not {rank} of "
                             f"{world} (it does not simulate ddp's re-forming)")
        return "lock step"

    def leave(self) -> None:
        pass

    def all_reduce_(self, flat: torch.Tensor) -> None:
        flat.copy_(self.room.meet(self.rank, flat.detach().clone(), _sum))

    def broadcast_(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self.room.meet(self.rank, tensor.detach().clone(),
                                    lambda values: [values[src]] * len(values)))

    def ring_all_reduce_(self, flat: torch.Tensor, feedback: ErrorFeedback) -> int:
        total, sent = self.room.meet(self.rank, (flat.numpy(), feedback), _ring)
        flat.copy_(torch.from_numpy(total).to(flat.dtype))
        return sent
