"""A reduce-scatter of the exchange tasks' contributions over the executors, in Spark's own shuffle.

A tree reduce of K tasks brings K partial sums of a shard into the driver's port (Spark's treeReduce adds no
level below a handful of partitions).  Where that port is the cycle's limit — the ≈ 100 regime: four 1.5 MB
shards into a 30 Mbit port, 1.6 s of a 2.1–2.5 s cycle — the contributions can be summed on the executors
first: every task cuts its record into P pieces (piece j: the j-th slice of its partial of Eq. 9, with the
task's whole weight Σ τᵢ; piece 0 also carries its reports), a shuffle brings piece j of every task to reduce
task j, which adds them, and the driver collects P summed slices, one shard in all.  Every executor's own
port carries (P − 1)/P of a shard each way, in parallel; the driver's carries one shard instead of K.

The price is a second stage (its scheduling, the shuffle's write and fetch), whose tasks need a free task slot.
Measured alone on the emulated cluster of 2 real cores with K = 4 and 1.5 MB shards (``python -m
lab.collectives``, medians of 7): 1.52 s against 2.21 s for the tree at 30 Mbit, 1.16 against 0.99 s at
100 Mbit and 1.20 against 0.67 s without a link limit.  In mpca's
cycle at 30 Mbit it lost (3.3–4.0 s against 2.1–2.5 s): the broadcast's K copies out of the driver's port take
as long as the tree's K shards in, and on executors of 2 cores the second stage waits for the deliver tasks'
slot.  So ``cluster.reduce`` is ``tree`` unless chosen (docs/paper.md, "Decisions worth knowing").

Only the partial sums are cut; Σ τᵢ and the reports travel whole, and :func:`join` takes the weight of piece 0
(every piece holds the same Σ τᵢ: each task put its weight on all of them).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator, List, Tuple

import numpy as np

from mpca.algorithm.weighted_sum import WeightedSum
from mpca.algorithm.wire import EncodedSum
from mpca.exchange.partials import Partial, decoded
from mpca.runtime.record import ExchangeRecord, merge_records


def split(record: ExchangeRecord, pieces: int) -> Iterator[Tuple[int, ExchangeRecord]]:
    """``record`` as ``pieces`` keyed pieces for the shuffle: piece j holds the j-th slice of its partial (and
    the whole weight); piece 0 also its reports."""
    if pieces < 1:
        raise ValueError(f"pieces must be >= 1, got {pieces}")
    for j, part in enumerate(_slices(record.partial, pieces)):
        yield j, (replace(record, partial=part) if j == 0 else ExchangeRecord(partial=part))


def partition(key: int) -> int:
    """The shuffle's partitioner: piece j goes to reduce task j."""
    return key


def join(pieces: Iterable[Tuple[int, ExchangeRecord]]) -> ExchangeRecord:
    """The summed pieces (keyed as :func:`split` keyed them, in any order) as one record: the slices
    concatenated into one partial (decoded, as the driver rule takes it), the reports united."""
    ordered = [rec for _, rec in sorted(pieces, key=lambda kv: kv[0])]
    if not ordered:
        return ExchangeRecord()
    sums = [decoded(r.partial) for r in ordered]
    weight = sums[0].weight
    if any(not np.isclose(s.weight, weight, rtol=1e-6, atol=1e-9) for s in sums):
        raise ValueError(f"the pieces of one reduction carry different weights: {[s.weight for s in sums]}")
    totals = [s.total for s in sums]
    if all(t is None for t in totals):
        total = None
    elif any(t is None for t in totals):
        raise ValueError("some pieces of one reduction hold a sum and some none")
    else:
        total = np.concatenate([np.asarray(t) for t in totals])
    first = ordered[0]
    reports = ExchangeRecord(WeightedSum(total, weight), first.agents, first.delivered, first.misplaced,
                             first.duplicates)
    for r in ordered[1:]:  # pieces other than 0 carry no reports; merged all the same, should that change
        reports = merge_records(reports, replace(r, partial=WeightedSum(None, 0.0)))
    return reports


def _slices(partial: Partial, pieces: int) -> List[Partial]:
    if isinstance(partial, WeightedSum):
        if partial.total is None:
            return [WeightedSum(None, partial.weight) for _ in range(pieces)]
        return [WeightedSum(t, partial.weight) for t in np.array_split(np.asarray(partial.total), pieces)]
    n, codec = partial.n, partial.codec
    if partial.data is None:
        return [EncodedSum(None, len(ix), partial.weight, codec) for ix in np.array_split(np.arange(n), pieces)]
    return [EncodedSum(codec.encode(v), v.size, partial.weight, codec)
            for v in np.array_split(partial.values(), pieces)]
