"""The pipeline really overlaps: a cycle's reduce task asks the agent for its shard without waiting for Spark to
download the broadcast — with two exchange slots per agent while its deliver task waits for that download,
with one before the deliver task takes the slot (paper §4.2, Fig. 8).  Whether the yield also completes inside that wait is a race with the agent's step in flight (printed)."""
import numpy as np
import pytest

from mpca.algorithm.mpca import MPCA
from mpca.bench.exchange import flat_model_fn
from mpca.data.datasets import to_dataframe
from mpca.trainer import Trainer
from tests import helpers


def _big_model_fit(spark, cycles, exchange_jobs="auto", reduce="tree"):
    rng = np.random.default_rng(0)
    df = to_dataframe(spark, rng.random((128, 10), dtype=np.float32), rng.integers(0, 10, 128), 2)
    fn = flat_model_fn(6_000_000)  # 24 MB: 8 MB shards, a broadcast that takes a while to fetch
    return Trainer(fn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(10,), batch_size=16, holdout=0.0,
                   max_cycles=cycles, eval_every_cycles=1000, spark=spark, algorithm=MPCA(shards=3),
                   cluster={"exchange_jobs": exchange_jobs, "reduce": reduce}).fit(df)


@pytest.mark.cluster(executors=2, cores=3)
def test_reduce_starts_before_its_broadcast_arrives_with_two_exchange_slots(spark):
    fit = _big_model_fit(spark, 10)
    steady = [c for c in fit.timeline.cycles if c.bcast_shard is not None]
    assert steady and all(sorted(c.delivered) == [0, 1] and sorted(c.agents) == [0, 1] for c in steady)
    started = [c.cycle for c in steady if c.reduce_started_before_broadcast()]
    early = [c.cycle for c in steady if c.reduce_before_broadcast()]
    # Whether the yield itself also lands before the broadcast depends on the agent's step in flight and the
    # niced exchange thread's share of two cores (~1 agent-cycle in 10 here, the same at a7b233a): reported,
    # not asserted.  What the split design controls is that the reduce does not wait for the broadcast.
    print("reduce started / completed before the broadcast arrived in cycles", started, early, "of",
          [c.cycle for c in steady])
    assert len(started) >= len(steady) // 2, [(c.cycle, {a: (r.t_start, c.delivered[a].t_start)
                                                         for a, r in c.agents.items()}) for c in steady]
    jobs = fit.counters.jobs
    assert jobs["cycle"] == fit.cycles and jobs["deliver"] == len(steady)  # a reduce job each, a deliver job too


def test_with_one_exchange_slot_the_reduce_job_takes_it_before_the_deliver_job(spark):
    """The default 2-core executors: a cycle's reduce job is submitted before its deliver job, so Spark's FIFO
    scheduler gives each executor's one free slot to the reduce task first — it yields without waiting for the
    broadcast's download — and the deliver task follows on that slot, its download while the shards go up."""
    fit = _big_model_fit(spark, 6, exchange_jobs="two")
    steady = [c for c in fit.timeline.cycles if c.bcast_shard is not None]
    assert steady and all(sorted(c.delivered) == [0, 1] and sorted(c.agents) == [0, 1] for c in steady)
    assert all(c.jobs == 2 for c in steady)
    order = [(c.cycle, a, round(c.agents[a].t_end - c.delivered[a].t_start, 3)) for c in steady for a in c.agents]
    assert all(c.agents[a].t_end <= c.delivered[a].t_start for c in steady for a in c.agents), order
    assert all(c.reduce_started_before_broadcast() for c in steady), order
    assert fit.counters.jobs["deliver"] == len(steady)


def test_with_one_exchange_slot_one_task_per_agent_can_do_both(spark):
    """The other layout of 2-core executors (``cluster.exchange_jobs: one``): one task per agent delivers and
    yields; Spark starts it only after the broadcast arrived, so its reduce never precedes the broadcast."""
    fit = _big_model_fit(spark, 5, exchange_jobs="one")
    steady = [c for c in fit.timeline.cycles if c.bcast_shard is not None]
    assert steady and not any(c.reduce_before_broadcast() or c.reduce_started_before_broadcast() for c in steady)
    assert all(c.delivered[a].t_start == c.agents[a].t_start for c in steady for a in c.agents)
    assert all(c.jobs == 1 for c in steady) and fit.counters.jobs["deliver"] == 0


@pytest.mark.cluster(executors=2, cores=3)
def test_spark_task_events_show_the_broadcast_fetch_and_the_reduce_at_work_inside_it(spark):
    """A Python SparkListener (lab.task_events) records each deliver task's launch and
    deserialization: the broadcast fetch on an executor starts there (Spark's clock) and ends when the task's
    Python code starts; the reduce task is at work inside that window (it began before the fetch ended and
    had not yielded before it began) in most cycles: the two shards' exchanges overlap."""
    from lab.task_events import TaskEvents

    events = TaskEvents(spark.sparkContext)
    try:
        fit = _big_model_fit(spark, 8)
    finally:
        events.close()
    steady = [c for c in fit.timeline.cycles if c.bcast_shard is not None and c.corrections == 0]
    assert steady
    during, inside, seen = 0, 0, []
    for c in steady:
        windows = events.fetch_windows(c)  # the tasks of the cycle's deliver job
        assert sorted(windows) == sorted(c.delivered), (c.cycle, windows)
        for a, (start, end) in windows.items():
            assert c.t_submit - 0.05 <= start <= end + 0.05, (c.cycle, a, start - c.t_submit, end - c.t_submit)
            r = c.agents[a]
            during += r.t_start < end and r.t_yield > start
            inside += start <= r.t_yield <= end
            seen.append((c.cycle, a, *(round(t - c.t_submit, 3) for t in (start, end, r.t_start, r.t_yield))))
    print(f"reduce at work during the fetch in {during}, yielded inside it in {inside}, of {len(seen)}")
    assert during >= len(seen) // 2, ("(cycle, agent, fetch start, fetch end, reduce start, yield)", seen)


def test_a_reduce_scatter_sums_the_contributions_on_the_executors_in_a_shuffle(spark):
    """``cluster.reduce: scatter``: every cycle's reduce job cuts each contribution into one piece per executor
    and sums them in a second, shuffled stage; every agent contributes, and the joined reduction is the tree's
    (the exact sums: by hand in tests/unit/test_scatter.py, through Spark's shuffle below)."""
    fit = _big_model_fit(spark, 5, reduce="scatter")
    assert all(c.scatter and sorted(c.agents) == [0, 1] and c.bytes_up > 0 for c in fit.timeline.cycles)
    tracker = spark.sparkContext.statusTracker()
    stages = [len(tracker.getJobInfo(j).stageIds) for j in tracker.getJobIdsForGroup(f"mpca-{fit.run_id}-exchange")]
    assert stages.count(2) == fit.cycles, stages  # one two-stage reduce job per cycle, nothing else shuffles


def test_the_shuffle_joins_to_the_trees_sum(spark):
    """The pieces through Spark's own shuffle (pickled records, the piece partitioner) join to treeReduce's sum."""
    import functools

    from mpca.algorithm.weighted_sum import WeightedSum
    from mpca.runtime import scatter
    from mpca.runtime.record import ExchangeRecord, merge_records

    rng = np.random.default_rng(1)
    records = [ExchangeRecord(WeightedSum(rng.standard_normal(1001).astype(np.float32), float(i + 1)))
               for i in range(4)]
    rdd = spark.sparkContext.parallelize(records, 4)
    tree = rdd.treeReduce(merge_records, depth=2)
    out = scatter.join(rdd.flatMap(functools.partial(scatter.split, pieces=3))
                       .reduceByKey(merge_records, 3, scatter.partition).collect())
    assert out.partial.weight == tree.partial.weight == 10.0
    np.testing.assert_allclose(out.partial.total, tree.partial.total, rtol=1e-6, atol=1e-5)
    assert np.allclose(tree.partial.total, functools.reduce(merge_records, records).partial.total, atol=1e-5)
