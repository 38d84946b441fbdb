"""The Spark runtime's transport for ddp (:class:`mpca.algorithm.collective.Collective`): the TCPStore that
the driver's :class:`~mpca.algorithm.ddp.DDPDriver` hosts at the run's rendezvous, and one torch.distributed
process group per generation of members.

The backend is chosen per generation from the members' devices, exchanged under the generation's store
prefix (:func:`choose_backend`).  With a lossy wire format the encoded ring (:func:`mpca.algorithm.ring.
ring_all_reduce_`) sends CPU tensors, hence a gloo group beside an NCCL one.

torch.distributed's store and collectives are not authenticated (as with TorchDistributor): run ``ddp`` on a
network you trust.
"""
from __future__ import annotations

import datetime
import socket
from typing import Any, Dict, Iterable, Optional

import torch

from mpca.algorithm.collective import Collective
from mpca.algorithm.ring import ring_all_reduce_
from mpca.algorithm.wire import ErrorFeedback


class TorchCollective(Collective):
    """One agent's side of torch.distributed, meeting at ``rendezvous`` (what DDPDriver.rendezvous returned:
    ``host``, ``port``, ``prefix``)."""

    def __init__(self, rendezvous: Dict[str, Any]):
        import torch.distributed as dist

        self.dist = dist
        self.rendezvous = dict(rendezvous)
        self.timeout: Optional[datetime.timedelta] = None  # the algorithm's, given with the store
        self.ring_group: Optional[Any] = None
        self._store = None

    def store(self, timeout_s: float) -> Any:
        if self._store is None:
            self.timeout = datetime.timedelta(seconds=timeout_s)
            server = self.dist.TCPStore(self.rendezvous["host"], int(self.rendezvous["port"]), None, False,
                                        timeout=self.timeout)
            self._store = self.dist.PrefixStore(str(self.rendezvous["prefix"]), server)
        return self._store

    def form(self, store: Any, rank: int, world: int, device: torch.device, lossy: bool) -> str:
        store.set(f"device/{rank}", device_identity(device))
        backend = choose_backend([store.get(f"device/{r}").decode() for r in range(world)])
        self.dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=self.timeout)
        self.ring_group = self.dist.new_group(backend="gloo") if lossy and backend != "gloo" else None
        self.rank, self.world = rank, world
        return backend

    def leave(self) -> None:
        self.ring_group = None
        if self.dist.is_initialized():
            self.dist.destroy_process_group()

    def all_reduce_(self, flat: torch.Tensor) -> None:
        self.dist.all_reduce(flat)

    def broadcast_(self, tensor: torch.Tensor, src: int) -> None:
        self.dist.broadcast(tensor, src)

    def ring_all_reduce_(self, flat: torch.Tensor, feedback: ErrorFeedback) -> int:
        return ring_all_reduce_(flat, self.rank, self.world, feedback, self.dist, self.ring_group)


def device_identity(device) -> str:
    """Which physical device an agent trains on, comparable across processes: ``cpu``, or ``cuda:`` with the
    host name and the GPU's UUID (two executors on one host can be given the same GPU)."""
    if device.type != "cuda":
        return "cpu"
    return f"cuda:{socket.gethostname()}:{torch.cuda.get_device_properties(device).uuid}"


def choose_backend(identities: Iterable[str]) -> str:
    """NCCL when every member trains on its own GPU; gloo otherwise — CPUs, a mix, or two members on one GPU,
    which NCCL refuses ("Duplicate GPU detected") and gloo's all-reduce of CUDA tensors serves."""
    ids = list(identities)
    if ids and all(i.startswith("cuda:") for i in ids) and len(set(ids)) == len(ids):
        return "nccl"
    return "gloo"
