"""DDP's compression hook: a ring all-reduce whose messages travel in the run's wire format.

With ``fp32`` DDP keeps torch.distributed's own ``all_reduce`` (gloo, NCCL): bit-exact and untouched.  With a
lossy format (bf16, int8, int4) the gradients go round the classic ring (Patarasuk & Yuan 2009) as encoded
messages over point-to-point sends:

* the vector is cut into K chunks; **reduce-scatter** — in K − 1 hops rank r sends chunk (r − h) mod K to its
  successor, which decodes it and adds it to its own copy of that chunk (the sum is exact in float32 on the
  receiver; the message is rounded once per hop, as the levels of Spark's treeReduce are in
  :class:`~mpca.algorithm.wire.EncodedSum`); rank r then holds the whole sum of chunk (r + 1) mod K;
* **all-gather** — each owner encodes its summed chunk once and the ring forwards those bytes unchanged, so
  every rank decodes the same bytes (the owner too) and the replicas stay bit-identical, which DDP needs.

Each rank sends 2 (K − 1) / K of the encoded vector per step, as the fp32 ring sends of the fp32 one: int8 is
≈ 0.25× the bytes of fp32 on every link.  Error feedback (:class:`~mpca.algorithm.wire.ErrorFeedback`): a rank
sends one message per chunk and phase every step, always for the same chunk, so each of those is a stream
whose residual joins the next step's message of that chunk; sums being linear, what any hop lost reaches the
total one step later, and the sum of the gradients applied tracks the sum of the true ones within a
quantisation step however many steps are taken.

The ring is written as a generator (:func:`ring_sum`) that yields each hop's message and is sent the
predecessor's: :func:`ring_all_reduce_` drives one rank over torch.distributed, :func:`ring_in_lock_step`
every rank in one thread (the tests, the simulator).
"""
from __future__ import annotations

from typing import Generator, List, Optional, Tuple

import numpy as np
import torch

from mpca.algorithm.wire import ErrorFeedback

Hop = Tuple[bytes, int]  # (message to the successor, bytes expected from the predecessor)


def chunk_bounds(n: int, world: int) -> List[Tuple[int, int]]:
    """[lo, hi) of the K chunks of an n-vector (sizes differ by at most one, the larger first)."""
    edges = np.linspace(0, n, world + 1).round().astype(int) if n >= world else np.minimum(np.arange(world + 1), n)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def ring_sum(x: np.ndarray, rank: int, world: int, feedback: ErrorFeedback) -> Generator[Hop, bytes, np.ndarray]:
    """Rank ``rank``'s side of the ring: yields (message, expected reply bytes) per hop, is sent the
    predecessor's message, and returns Σ over the ranks of ``x`` as every rank decodes it (float32)."""
    codec = feedback.codec
    bounds = chunk_bounds(x.size, world)
    acc = np.array(x, dtype=np.float32).reshape(-1)
    size = [codec.nbytes(hi - lo) for lo, hi in bounds]
    for hop in range(world - 1):  # reduce-scatter
        out, into = (rank - hop) % world, (rank - hop - 1) % world
        lo, hi = bounds[out]
        got = yield feedback.encode(("reduce", out), acc[lo:hi]), size[into]
        lo, hi = bounds[into]
        acc[lo:hi] += codec.decode(got, hi - lo).astype(np.float32)
    own = (rank + 1) % world
    lo, hi = bounds[own]
    msg = feedback.encode(("gather", own), acc[lo:hi])
    acc[lo:hi] = codec.decode(msg, hi - lo)  # the owner keeps what the others will decode
    for hop in range(world - 1):  # all-gather: forward the owners' bytes unchanged
        into = (rank - hop) % world
        msg = yield msg, size[into]
        lo, hi = bounds[into]
        acc[lo:hi] = codec.decode(msg, hi - lo)
    return acc


def ring_in_lock_step(xs: List[np.ndarray], feedbacks: List[ErrorFeedback]) -> Tuple[List[np.ndarray], List[int]]:
    """Every rank's :func:`ring_sum` in one thread, hop by hop (rank r's message goes to rank r + 1): each
    rank's result and the bytes each rank sent."""
    K = len(xs)
    rings = [ring_sum(x, r, K, fb) for r, (x, fb) in enumerate(zip(xs, feedbacks))]
    hops = [next(g) for g in rings]
    sent = [0] * K
    results: List[Optional[np.ndarray]] = [None] * K
    while any(r is None for r in results):
        msgs = [m for m, _ in hops]
        for r, g in enumerate(rings):
            if len(msgs[(r - 1) % K]) != hops[r][1]:
                raise AssertionError(f"rank {r} expected {hops[r][1]} bytes, its predecessor sent {len(msgs[r - 1])}")
            sent[r] += len(msgs[r])
            try:
                hops[r] = g.send(msgs[(r - 1) % K])
            except StopIteration as done:
                results[r] = done.value
    return results, sent


def ring_all_reduce_(flat: torch.Tensor, rank: int, world: int, feedback: ErrorFeedback, dist, group=None) -> int:
    """Replace ``flat`` (a CPU vector) by its sum over the ranks through :func:`ring_sum`, with point-to-point
    messages to ``rank + 1`` and from ``rank − 1`` (``group``: a gloo group of all ranks); the bytes sent."""
    ring = ring_sum(flat.numpy(), rank, world, feedback)
    succ, pred = (rank + 1) % world, (rank - 1) % world
    sent = 0
    try:
        msg, expect = next(ring)
        while True:
            inbox = torch.empty(expect, dtype=torch.uint8)
            if msg or expect:  # an empty chunk (fewer values than ranks) is skipped on both sides
                ops = []
                if msg:
                    ops.append(dist.isend(torch.frombuffer(bytearray(msg), dtype=torch.uint8), succ, group=group))
                if expect:
                    ops.append(dist.irecv(inbox, pred, group=group))
                for op in ops:
                    op.wait()
            sent += len(msg)
            msg, expect = ring.send(inbox.numpy().tobytes())
    except StopIteration as done:
        flat.copy_(torch.from_numpy(done.value).to(flat.dtype))
    return sent
