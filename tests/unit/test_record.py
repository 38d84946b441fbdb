"""The exchange record (mpca.runtime.record): Eq. 9's partial sums merged as treeReduce merges them, duplicates flagged."""
from __future__ import annotations

import numpy as np

from mpca.algorithm import WeightedSum
from mpca.runtime.record import ExchangeRecord, merge_records
from mpca.runtime.reports import AgentReport


def _rec(agent, x, tau):
    r = ExchangeRecord()
    r.partial = WeightedSum.of(np.array(x, dtype=np.float32), tau)
    r.agents[agent] = AgentReport(agent, weight=tau)
    return r


def test_merge_is_eq9_partial_and_flags_duplicates():
    m = merge_records(merge_records(_rec(0, [1, 2], 1), _rec(1, [5, 6], 3)), ExchangeRecord())
    assert m.partial.weight == 4
    np.testing.assert_allclose(m.partial.total / m.partial.weight, [4, 5])
    assert sorted(m.agents) == [0, 1] and m.duplicates == []
    assert merge_records(m, _rec(1, [0, 0], 1)).duplicates == [1]
