"""The reduce-scatter's pieces: a task's record cut into slices of its partial sum of Eq. 9 (each with the
task's whole weight, the reports on piece 0), summed per piece and joined back — the same reduction as the
tree's, by hand."""
import functools

import numpy as np
import pytest

from mpca.algorithm.weighted_sum import WeightedSum
from mpca.algorithm.wire import Codec, EncodedSum
from mpca.runtime.record import ExchangeRecord, merge_records
from mpca.runtime.reports import AgentReport
from mpca.runtime.scatter import join, split


def _record(agent, values, tau):
    return ExchangeRecord(WeightedSum.of(np.asarray(values, dtype=np.float32), tau), {agent: AgentReport(agent)})


def _shuffle(records, pieces):
    """What Spark's reduceByKey does with the keyed pieces: piece j of every record summed in reduce task j."""
    by_piece = {}
    for rec in records:
        for j, piece in split(rec, pieces):
            by_piece[j] = merge_records(by_piece[j], piece) if j in by_piece else piece
    return list(reversed(list(by_piece.items())))  # collect()'s order is not the keys' order


def test_a_record_is_cut_into_slices_each_with_the_whole_weight_and_the_reports_on_the_first():
    pieces = list(split(_record(3, [1, 2, 3, 4, 5], 2.0), 3))
    assert [j for j, _ in pieces] == [0, 1, 2]
    assert [p.partial.total.tolist() for _, p in pieces] == [[2, 4], [6, 8], [10]]  # np.array_split's sizes
    assert [p.partial.weight for _, p in pieces] == [2.0, 2.0, 2.0]
    assert list(pieces[0][1].agents) == [3] and not pieces[1][1].agents and not pieces[2][1].agents


def test_summed_pieces_join_to_the_trees_reduction_by_hand():
    # Σ τ x = 1·[1,2,3,4] + 3·[10,20,30,40] + 0·[..] = [31, 62, 93, 124], Σ τ = 4
    records = [_record(0, [1, 2, 3, 4], 1.0), _record(1, [10, 20, 30, 40], 3.0), _record(2, [7, 7, 7, 7], 0.0)]
    out = join(_shuffle(records, 3))
    assert out.partial.total.tolist() == [31, 62, 93, 124] and out.partial.weight == 4.0
    assert sorted(out.agents) == [0, 1, 2]
    tree = functools.reduce(merge_records, records)
    assert np.array_equal(out.partial.total, tree.partial.total) and out.partial.weight == tree.partial.weight


def test_no_contribution_with_weight_joins_to_no_sum():
    out = join(_shuffle([_record(0, [1, 2, 3], 0.0), _record(1, [4, 5, 6], 0.0)], 2))
    assert out.partial.total is None and out.partial.weight == 0.0 and sorted(out.agents) == [0, 1]


def test_lossy_partials_are_cut_encoded_and_join_decoded():
    codec = Codec("int8", block=2)
    a = ExchangeRecord(EncodedSum.of(np.array([1.0, -2.0, 0.5, 4.0, 3.0]), 1.0, codec), {0: AgentReport(0)})
    b = ExchangeRecord(EncodedSum.of(np.array([1.0, 2.0, 0.5, -4.0, 1.0]), 1.0, codec), {1: AgentReport(1)})
    out = join(_shuffle([a, b], 2))
    assert isinstance(out.partial, WeightedSum) and out.partial.weight == 2.0 and sorted(out.agents) == [0, 1]
    # int8 blocks of 2: [1,-2] [0.5,4] [3] and [1,2] [0.5,-4] [1] are exact (each block's max is its scale's 127)
    # within half a step; the sums [2, 0, 1, 0, 4] come back within the steps of the re-encoded slices
    assert np.allclose(out.partial.total, [2.0, 0.0, 1.0, 0.0, 4.0], atol=4.0 / 127)


def test_pieces_that_disagree_on_the_weight_are_refused():
    bad = [(0, ExchangeRecord(WeightedSum(np.ones(2, np.float32), 1.0))),
           (1, ExchangeRecord(WeightedSum(np.ones(2, np.float32), 2.0)))]
    with pytest.raises(ValueError, match="different weights"):
        join(bad)
    with pytest.raises(ValueError, match="pieces must be >= 1"):
        list(split(ExchangeRecord(), 0))


def test_nothing_collected_joins_to_an_empty_record():
    out = join([])
    assert out.partial.total is None and out.partial.weight == 0.0 and not out.agents


def test_only_a_cycles_partial_sums_over_several_executors_are_scattered():
    from mpca.runtime.jobs import ExchangeJobs
    from mpca.runtime.roster import AgentRoster

    jobs = ExchangeJobs(None, "r", b"s", AgentRoster([0, 1, 2, 3]), Codec(), executors=4, reduce="scatter")
    try:
        reduce, cycle, deliver = (jobs.plan("c", op) for op in ("reduce", "cycle", "deliver"))
        assert jobs.scatters(reduce, 4) and jobs.scatters(cycle, 4) and jobs.pieces(4) == 4
        assert not jobs.scatters(deliver, 4)  # no partial sum
        assert not jobs.scatters(reduce, 4, "correction")  # corrective jobs keep the tree
        assert not jobs.scatters(reduce, 1) and jobs.pieces(1) == 1  # one task: nothing to scatter over
        jobs.executors = 1
        assert not jobs.scatters(reduce, 4)  # one executor: nothing to scatter over
    finally:
        jobs.close()
    tree = ExchangeJobs(None, "r", b"s", AgentRoster([0, 1]), Codec(), executors=4)
    assert not tree.scatters(tree.plan("c", "reduce"), 4)  # cluster.reduce's default
    tree.close()
