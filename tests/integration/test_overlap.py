"""The pipeline really overlaps: with two exchange slots per agent, a cycle's reduce task yields the agent's
shard while its deliver task is still waiting for Spark to download the broadcast (paper §4.2, Fig. 8)."""
import numpy as np
import pytest

from mpca.algorithm.mpca import MPCA
from mpca.bench.exchange import flat_model_fn
from mpca.data.datasets import to_dataframe
from mpca.trainer import Trainer
from tests import helpers


def _big_model_fit(spark, cycles):
    rng = np.random.default_rng(0)
    df = to_dataframe(spark, rng.random((128, 10), dtype=np.float32), rng.integers(0, 10, 128), 2)
    fn = flat_model_fn(6_000_000)  # 24 MB: 8 MB shards, a broadcast that takes a while to fetch
    return Trainer(fn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(10,), batch_size=16, holdout=0.0,
                   max_cycles=cycles, eval_every_cycles=1000, spark=spark, algorithm=MPCA(shards=3)).fit(df)


@pytest.mark.cluster(executors=2, cores=3)
def test_reduce_completes_before_its_broadcast_arrives_with_two_exchange_slots(spark):
    fit = _big_model_fit(spark, 10)
    steady = [c for c in fit.timeline.cycles if c.bcast_shard is not None]
    assert steady and all(sorted(c.delivered) == [0, 1] and sorted(c.agents) == [0, 1] for c in steady)
    started = [c.cycle for c in steady if c.reduce_started_before_broadcast()]
    early = [c.cycle for c in steady if c.reduce_before_broadcast()]
    print("reduce started / completed before the broadcast arrived in cycles", started, early, "of",
          [c.cycle for c in steady])
    assert len(started) >= len(steady) // 2 and early, [(c.cycle, {a: (r.t_yield, c.delivered[a].t_start)
                                                       for a, r in c.agents.items()}) for c in steady]
    assert fit.extra["jobs"]["cycle"] == fit.cycles  # still one Spark job per cycle


def test_with_one_exchange_slot_one_task_per_agent_does_both(spark):
    """The default 2-core executors: one task per agent delivers and yields; Spark starts it only after the
    broadcast arrived, so its reduce never precedes the broadcast (what the split design removes)."""
    fit = _big_model_fit(spark, 6)
    steady = [c for c in fit.timeline.cycles if c.bcast_shard is not None]
    assert steady and not any(c.reduce_before_broadcast() or c.reduce_started_before_broadcast() for c in steady)
    assert all(c.delivered[a].t_start == c.agents[a].t_start for c in steady for a in c.agents)


@pytest.mark.cluster(executors=2, cores=3)
def test_spark_task_events_show_the_broadcast_fetch_and_the_reduce_inside_it(spark):
    """A Python SparkListener (mpca.runtime.task_events) records each deliver task's launch and
    deserialization: the broadcast fetch on an executor starts there (Spark's clock) and ends when the task's
    Python code starts; the reduce's yield falls inside that window in some cycles (overlap on the wire)."""
    from mpca.runtime.task_events import TaskEvents

    events = TaskEvents(spark.sparkContext)
    try:
        fit = _big_model_fit(spark, 8)
    finally:
        events.close()
    steady = [c for c in fit.timeline.cycles if c.bcast_shard is not None and c.corrections == 0]
    assert steady
    inside = 0
    for c in steady:
        windows = events.fetch_windows(c, deliver_from=2)  # reduce tasks first (indices 0, 1), then deliver
        assert sorted(windows) == sorted(c.delivered), (c.cycle, windows)
        for a, (start, end) in windows.items():
            assert c.t_submit - 0.05 <= start <= end + 0.05, (c.cycle, a, start - c.t_submit, end - c.t_submit)
            inside += start <= c.agents[a].t_yield <= end
    assert inside >= 1, "no reduce yielded while a broadcast was being fetched"
