"""The partial sums a reduction carries (Eq. 9: Σ τᵢ xᵢ and Σ τᵢ), how two of them combine, and the sum the driver
rule takes.  Spark's treeReduce combines them in the runtime (:class:`mpca.runtime.record.ExchangeRecord`), the
simulator along the same tree's levels (:mod:`mpca.sim.cycles`); both call :func:`combine` and
:func:`driver_sum`."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, Iterable, Optional, Union

import numpy as np

from mpca.algorithm.weighted_sum import WeightedSum
from mpca.algorithm.wire import Codec, EncodedSum

Partial = Union[WeightedSum, EncodedSum]  # fp32: exact sums; lossy wire formats: encoded sums (one rounding per level)


def contribution(data, n: int, weight: float, codec: Codec) -> Partial:
    """One agent's contribution as it arrived from the agent — its shard encoded in ``codec`` (``n`` values) with
    weight τ — as the partial the tree adds: Σ τ x stays encoded in a lossy format (the tree's levels add decoded
    values, :class:`~mpca.algorithm.wire.EncodedSum`), exact sums otherwise."""
    if codec.lossy:
        return EncodedSum.received(data, n, weight, codec)
    return WeightedSum.of(np.frombuffer(data, dtype=codec.dtype), weight)


def empty() -> WeightedSum:
    """No contribution yet: what a reduce task that found no agent's shard returns."""
    return WeightedSum(None, 0.0)


def combine(a: Partial, b: Partial) -> Partial:
    """Two partials of Eq. 9 in one; an empty one (no contribution yet) takes the other's kind and adds its weight."""
    if isinstance(a, WeightedSum) and a.total is None and not isinstance(b, WeightedSum):
        return replace(b, weight=a.weight + b.weight)
    if isinstance(b, WeightedSum) and b.total is None and not isinstance(a, WeightedSum):
        return replace(a, weight=a.weight + b.weight)
    return a.combine(b)


def fold(partials: Iterable[Partial]) -> Partial:
    """The partials combined in order, from :func:`empty`."""
    acc: Partial = empty()
    for p in partials:
        acc = combine(acc, p)
    return acc


def in_agent_order(by_agent: Dict[int, Partial]) -> Partial:
    """``cluster.reduce: ordered``: the agents' partials added in agent order (:func:`fold`) — the same bits
    whatever order the tasks finished in or the tree met them in, where floating-point sums depend on it."""
    return fold(by_agent[a] for a in sorted(by_agent))


def decoded(partial: Partial) -> WeightedSum:
    """The partial as exact sums (a lossy one decoded)."""
    return partial if isinstance(partial, WeightedSum) else partial.decoded()


def driver_sum(partial: Partial) -> Optional[WeightedSum]:
    """The reduction as the driver rule takes it — decoded, its total as torch — or None when the total holds
    NaN/Inf (agents reject their own non-finite shards; this keeps the joint model finite whatever reaches the
    driver)."""
    import torch  # the driver's: the executors' exchange tasks that import this module run without torch

    ws = decoded(partial)
    if ws.total is None:
        return WeightedSum(None, ws.weight)
    total = torch.from_numpy(np.asarray(ws.total))
    return WeightedSum(total, ws.weight) if bool(torch.isfinite(total).all()) else None


__all__ = ["Partial", "combine", "contribution", "decoded", "driver_sum", "empty", "fold", "in_agent_order"]
