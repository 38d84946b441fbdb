"""The network model: pure functions with hand-checkable arithmetic (see :mod:`mpca.sim.constants`).

Every host has one full-duplex port of ``link_bps``; a transfer of ``b`` bytes takes ``b·8/rate + latency``.
The driver's port is the shared bottleneck: what converges on it (the last level of treeReduce, service
requests) or leaves it (broadcast blocks, service answers) queues there, first in, first out.

* Spark's treeReduce (``depth=2``, PySpark's ``treeAggregate``): with P partitions, scale = max(⌈√P⌉, 2); while
  P > scale + P/scale a shuffle level combines partition i into i mod ⌊P/scale⌋ on an executor; the last
  partials are collected into the driver, which combines them (Eq. 9's partial sums, §4.5).
* Spark's torrent broadcast: ⌈B / block⌉ blocks fetched from any holder; the driver's uplink sends
  c(K) = min(K, 1 + a·log2 K) copies of the shard, and no executor holds it before the driver sent each block
  once and the last block doubled ⌈log2 K⌉ times among the holders.
* DDP's ring all-reduce: 2(K−1) steps of B/K bytes; each host sends 2(K−1)/K of the gradient.
* Wire formats: bytes from :meth:`mpca.algorithm.wire.Codec.nbytes`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, List, Sequence

from mpca.algorithm.wire import Codec
from mpca.sim.constants import NetworkConstants


def payload_bytes(numel: int, fmt: str = "fp32", block: int = 4096, dtype: str = "float32") -> int:
    """Bytes of ``numel`` values in wire format ``fmt`` (the codec's own count)."""
    return Codec(fmt, block, dtype).nbytes(numel)


def send_time(nbytes: float, net: NetworkConstants) -> float:
    """Seconds a port is busy sending ``nbytes`` (no latency)."""
    return 0.0 if nbytes <= 0 else nbytes * 8.0 / net.link_bps


def wire_time(nbytes: float, net: NetworkConstants) -> float:
    """One transfer: bytes·8/rate + latency."""
    return send_time(nbytes, net) + net.latency_s


def fifo_into_port(ready: Iterable[float], nbytes: float, net: NetworkConstants) -> float:
    """When the last of several ``nbytes`` transfers, each ready at its time, has arrived through one port
    that takes them one after another (first ready, first sent)."""
    free = -math.inf
    for t in sorted(ready):
        free = max(t, free) + send_time(nbytes, net)
    return free + net.latency_s


def tree_levels(partitions: int) -> List[int]:
    """Partition counts after each of treeReduce's shuffle levels (depth 2), before the driver's collect:
    4 → [], 8 → [2], 16 → [4], 64 → [8]."""
    if partitions < 1:
        return []
    n = float(partitions)
    scale = max(math.ceil(partitions ** 0.5), 2)
    levels = []
    while n > scale + n / scale:
        n /= scale
        levels.append(int(n))
    return levels


def tree_groups(items: Sequence, reducers: int) -> List[list]:
    """Item i of a shuffle level goes to reducer i mod ``reducers`` (PySpark's treeAggregate)."""
    return [[x for i, x in enumerate(items) if i % reducers == r] for r in range(reducers)]


def tree_reduce_arrival(ready: Sequence[float], nbytes: float, net: NetworkConstants) -> float:
    """When the driver holds every partial of a treeReduce whose K leaves are ready at ``ready`` (each partial
    ``nbytes``): each level's reducer receives its group through its own port, the driver the last level's.
    K equal ready times t and no shuffle level (K ≤ 4): t + K·bytes·8/rate + latency."""
    times = list(ready)
    if not times:
        return 0.0
    for reducers in tree_levels(len(times)):
        times = [fifo_into_port(group, nbytes, net) for group in tree_groups(times, reducers)]
    return fifo_into_port(times, nbytes, net)


def driver_partials(agents: int) -> int:
    """How many partials reach the driver's port (treeReduce's last level)."""
    levels = tree_levels(agents)
    return levels[-1] if levels else agents


def driver_copies(agents: int, net: NetworkConstants) -> float:
    """Copies of a broadcast the driver's uplink sends: min(K, 1 + a·log2 K)."""
    if agents < 1:
        return 0.0
    return min(float(agents), 1.0 + net.driver_copies_per_doubling * math.log2(agents))


def broadcast_time(agents: int, nbytes: float, net: NetworkConstants) -> float:
    """Seconds until every one of ``agents`` executors holds a torrent broadcast of ``nbytes``:
    max(c(K)·B, B + ⌈log2 K⌉·b)·8/rate + (1 + ⌈log2 K⌉)·latency, b = min(block, B)."""
    if agents < 1 or nbytes <= 0:
        return 0.0
    hops = math.ceil(math.log2(agents)) if agents > 1 else 0
    block = min(net.block_bytes, nbytes)
    return send_time(max(driver_copies(agents, net) * nbytes, nbytes + hops * block), net) + \
        (1 + hops) * net.latency_s


def ring_allreduce_time(agents: int, nbytes: float, net: NetworkConstants) -> float:
    """2(K−1) steps, each sending B/K bytes over every host's port at once."""
    if agents <= 1:
        return 0.0
    return 2 * (agents - 1) * wire_time(nbytes / agents, net)


def scaled_for_bytes(net: NetworkConstants, scale: float) -> NetworkConstants:
    """A network on which B bytes take as long as ``scale``·B bytes on ``net``: the rate and the broadcast
    block divided by ``scale``, latency and overheads unchanged.  Every time above is a sum of
    bytes·8/rate terms (bytes counted in whole blocks at most: min(block, B)), bytes × the exchange's CPU per
    byte (multiplied by ``scale``) and byte-free terms, so a simulation of a small model on the scaled network
    charges the wire and CPU time of a model ``scale`` times larger (``mpca plan``'s proxy); the block is
    rounded to a whole byte."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    return dataclasses.replace(net, link_bps=net.link_bps / scale, block_bytes=max(1, round(net.block_bytes / scale)),
                               exchange_cpu_s_per_mb=net.exchange_cpu_s_per_mb * scale)


def exchange_cpu_time(agents: int, nbytes: float, net: NetworkConstants) -> float:
    """The CPU an exchange of ``nbytes`` per agent (up and down) adds to the critical path: seconds per MB,
    stretched by max(1, K / host_cores) when the hosts share ``host_cores`` cores."""
    if not net.exchange_cpu_s_per_mb or not nbytes:
        return 0.0
    share = max(1.0, agents / net.host_cores) if net.host_cores else 1.0
    return net.exchange_cpu_s_per_mb * nbytes / 1e6 * share


def cycle_time(agents: int, reduce_bytes: float, broadcast_bytes: float, net: NetworkConstants,
               deliver_first: bool = False) -> float:
    """One exchange cycle with every agent ready at once: overhead + the reduce and the broadcast, overlapped
    (a reduce job and a deliver job; with one task slot per agent the reduce task takes it first), or one after
    the other where one task per agent does both (``deliver_first``, a rule whose agents need the delivery
    before they yield, without ``split_tasks``), then the exchange's CPU (:func:`exchange_cpu_time`)."""
    bc = broadcast_time(agents, broadcast_bytes, net)
    reduce_start = net.job_overhead_s + (bc if deliver_first and not net.split_tasks else 0.0)
    up = tree_reduce_arrival([reduce_start] * agents, reduce_bytes, net)
    return max(net.job_overhead_s + bc, up) + exchange_cpu_time(agents, reduce_bytes + broadcast_bytes, net)


class DriverPort:
    """The driver's port as the parameter service uses it: requests come in one after another, answers go out
    one after another (FIFO each way, full duplex)."""

    def __init__(self, net: NetworkConstants):
        self.net = net
        self.in_free = -math.inf
        self.out_free = -math.inf
        self.bytes_in = 0
        self.bytes_out = 0

    def receive(self, t: float, nbytes: int) -> float:
        """A request of ``nbytes`` sent at ``t``: when the driver holds it."""
        self.in_free = max(t, self.in_free) + send_time(nbytes, self.net)
        self.bytes_in += nbytes
        return self.in_free + self.net.latency_s

    def send(self, t: float, nbytes: int) -> float:
        """An answer of ``nbytes`` ready at ``t``: when the agent holds it."""
        self.out_free = max(t, self.out_free) + send_time(nbytes, self.net)
        self.bytes_out += nbytes
        return self.out_free + self.net.latency_s
