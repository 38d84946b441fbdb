"""The exchange core's partial sums (mpca.exchange.partials): what the Spark runtime's treeReduce and the
simulator's tree both combine, against hand-computed values; and that neither driver keeps a twin of them."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
import torch

from mpca.algorithm.weighted_sum import WeightedSum
from mpca.algorithm.wire import Codec, EncodedSum
from mpca.exchange.partials import combine, contribution, decoded, driver_sum, empty, fold, in_agent_order

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "mpca"


def test_exact_partials_add_their_sums_and_weights():
    # agents with tau 2 and 3 and shards (1, 2) and (4, 0): sum tau x = (14, 4), sum tau = 5
    a = contribution(np.array([1, 2], np.float32).tobytes(), 2, 2.0, Codec("fp32"))
    b = contribution(np.array([4, 0], np.float32).tobytes(), 2, 3.0, Codec("fp32"))
    s = fold([a, b])
    assert isinstance(s, WeightedSum) and s.weight == 5.0
    np.testing.assert_allclose(np.asarray(s.total), [14.0, 4.0])
    assert fold([]).total is None and fold([]).weight == 0.0


def test_an_empty_partial_takes_the_other_kind_and_adds_its_weight():
    codec = Codec("int8")
    enc = contribution(codec.encode(np.array([0.5, -1.0], np.float32)), 2, 2.0, codec)
    assert isinstance(enc, EncodedSum)
    for s in (combine(empty(), enc), combine(enc, empty())):
        assert isinstance(s, EncodedSum) and s.weight == 2.0
        np.testing.assert_allclose(decoded(s).total, [1.0, -2.0], atol=0.02)  # tau x, one int8 rounding
    none = WeightedSum(None, 1.5)  # a task whose agent yielded nothing but counted weight
    assert combine(none, enc).weight == 3.5


def test_the_driver_takes_finite_sums_only():
    ws = driver_sum(WeightedSum(np.array([1.0, 2.0], np.float32), 2.0))
    assert isinstance(ws.total, torch.Tensor) and ws.total.tolist() == [1.0, 2.0] and ws.weight == 2.0
    assert driver_sum(WeightedSum(np.array([1.0, np.nan], np.float32), 2.0)) is None
    assert driver_sum(WeightedSum(np.array([np.inf], np.float32), 1.0)) is None
    nothing = driver_sum(empty())
    assert nothing.total is None and nothing.weight == 0.0


def test_partials_kept_apart_are_added_in_agent_order_whatever_order_they_came_in():
    """cluster.reduce: ordered — fp32 sums depend on their order; (a + b) + c in agent order, every time."""
    a, b, c = (np.array([v], np.float32) for v in (1e8, 1.0, -1e8))
    parts = {2: WeightedSum(c, 1.0), 0: WeightedSum(a, 1.0), 1: WeightedSum(b, 1.0)}
    assert float((a + c + b)[0]) == 1.0 and float((a + b + c)[0]) == 0.0  # the orders differ: 1e8 + 1 rounds
    ordered = in_agent_order(parts)
    assert float(ordered.total[0]) == 0.0 and ordered.weight == 3.0
    assert float(in_agent_order(dict(reversed(list(parts.items())))).total[0]) == 0.0


def test_an_ordered_exchange_record_merges_in_any_tree_and_reduces_in_agent_order():
    from mpca.runtime.record import ExchangeRecord

    a, b, c = (np.array([v], np.float32) for v in (1e8, 1.0, -1e8))
    recs = [ExchangeRecord(by_agent={i: WeightedSum(v, 1.0)}) for i, v in ((2, c), (0, a), (1, b))]
    for merged in (recs[0].merge(recs[1]).merge(recs[2]), recs[2].merge(recs[0].merge(recs[1]))):
        assert sorted(merged.by_agent) == [0, 1, 2]
        assert float(merged.reduced().total[0]) == 0.0 and merged.reduced().weight == 3.0
    tree = ExchangeRecord(partial=WeightedSum(a, 1.0))
    assert tree.reduced() is tree.partial  # cluster.reduce: tree — the tree's own sum


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(("exchange/", "algorithm/")):
            yield rel, path.read_text(encoding="utf-8")


@pytest.mark.parametrize("pattern, what", [
    (r"^Partial\s*=", "the Partial type"),
    (r"EncodedSum\.received\(|WeightedSum\.of\(np\.frombuffer", "a contribution built from its bytes"),
    (r"\.combine\(", "partials combined"),
    (r"isfinite\(.*total", "the driver's finite check of a reduction"),
    (r"rule\.before_step\(\)|rule\.after_step\(\)", "the step's hooks in order"),
    (r"encode\(.*if weight > 0 else", "a contribution encoded for the wire"),
    (r"rule\.serve\(", "the parameter service's handling of a request"),
    (r"\.on_reduced\(|stage_lag\(|reduce_shard\(", "the 3-phase schedule (which shard, when it is staged)"),
    (r"absent\.(pop|update|add|discard)\(|absent\s*\|=|absent\[[^]]+\]\s*=", "the presence book's absent agents"),
    (r"def silent_agent_wait_s|SILENT_WAIT", "the bounded wait for a silent agent"),
    (r"sorted\(\w*by_agent\w*\)", "the partials added in agent order"),
    (r"\.taken\s*(<|>=|\+=)|awaiting\s*=", "the lock step's windows"),
])
def test_no_driver_keeps_a_twin_of_the_core(pattern, what):
    """The runtime and the simulator use the exchange core (partials, the step, the service, the schedule, the
    presence book); a copy of one of them in either goes red here."""
    twins = [rel for rel, text in _sources() if re.search(pattern, text, re.M)]
    assert not twins, f"{what} written outside mpca/exchange: {twins}"
