"""Mistakes visible only once a DataFrame exists (the Trainer API): one UserError line, with no agent job left
behind — before any agent starts where the schema or the training functions show them, from the agent that
loads the rows where only the rows' values do (the driver reads no row before the agents' job)."""
import functools
import time

import pytest
import torch
from pyspark.sql import functions as F

from mpca.data.datasets import dataset_dataframe
from mpca.errors import UserError
from mpca.models import MLP
from mpca.trainer import Trainer
from tests import helpers

pytestmark = pytest.mark.cluster()


def _raising_optimizer(params):
    raise ValueError("no such optimizer setting")


def _mse(out, y):
    return torch.nn.functional.mse_loss(out, y)


CASES = {
    "empty DataFrame": (lambda df: df.limit(0), {}, "no rows"),
    "mistyped feature column": (lambda df: df.withColumn("features", F.lit("x")), {}, "cannot be read"),
    "missing label column": (lambda df: df.drop("label"), {}, "column 'label' not in the data"),
    "optimizer_fn raises": (lambda df: df, {"optimizer_fn": _raising_optimizer}, "optimizer_fn failed"),
    "output does not fit the loss": (lambda df: df, {"loss_fn": _mse}, "does not fit the loss"),
    "cluster too small": (lambda df: df, {"agents": 5, "executor_wait_s": 2}, "cluster too small"),
    "min_agents above agents": (lambda df: df, {"min_agents": 3}, "min_agents=3 exceeds"),
}


ROWS_CASES = {  # the rows' values: each agent checks the rows it loads and the first to answer refuses them
    "no row passes a filter": (lambda df: df.filter(F.col("label") > 100), "no rows"),
    "labels out of range": (lambda df: df.withColumn("label", F.col("label") + 20), "labels reach 29"),
    "null labels": (lambda df: df.withColumn("label", F.when(F.col("label") > 4, F.col("label"))),
                    "label column 'label' holds nulls"),
    "feature arrays of another width": (lambda df: df.withColumn("features", F.slice("features", 1, 10)),
                                        "have 10 values but input_shape (1, 8, 8) needs 64"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_trainer_refuses_bad_input_before_any_agent_starts(spark, case):
    change, options, expected = CASES[case]
    fns = {"model_fn": helpers.small_cnn, "loss_fn": helpers.cross_entropy, "optimizer_fn": helpers.adam}
    fns.update({k: v for k, v in options.items() if k in fns})
    options = {k: v for k, v in options.items() if k not in fns}
    tracker = spark.sparkContext.statusTracker()
    df = change(dataset_dataframe(spark, "digits"))
    jobs_before = max(tracker.getJobIdsForGroup(None) or [-1])
    with pytest.raises(UserError) as err:
        Trainer(fns["model_fn"], fns["loss_fn"], fns["optimizer_fn"], **{"agents": 2, **options},
                input_shape=(1, 8, 8), max_cycles=3, spark=spark).fit(df)
    assert expected in str(err.value) and "\n" not in str(err.value), err.value
    deadline = time.time() + 10  # a job being cancelled (the previous test's) ends within seconds
    while tracker.getActiveJobsIds() and time.time() < deadline:
        time.sleep(0.2)
    assert not tracker.getActiveJobsIds()  # no agent job started (it would run until stopped), nothing left running
    if case not in ("cluster too small", "min_agents above agents"):  # the data's and the functions' mistakes:
        # found with no Spark job at all (no row read before the agents')
        assert not [j for j in tracker.getJobIdsForGroup(None) if j > jobs_before], "a job ran before the agents"


@pytest.mark.parametrize("case", sorted(ROWS_CASES))
def test_trainer_refuses_bad_rows_from_the_agent_that_loads_them_in_one_line(spark, case):
    change, expected = ROWS_CASES[case]
    tracker = spark.sparkContext.statusTracker()
    with pytest.raises(UserError) as err:
        Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                max_cycles=3, spark=spark).fit(change(dataset_dataframe(spark, "digits")))
    assert expected in str(err.value) and "\n" not in str(err.value), err.value
    assert case == "no row passes a filter" or "found in agent" in str(err.value), err.value
    deadline = time.time() + 10
    while tracker.getActiveJobsIds() and time.time() < deadline:
        time.sleep(0.2)
    assert not tracker.getActiveJobsIds()  # the agents' job stopped, nothing left running


def test_with_an_input_shape_the_driver_reads_no_row_outside_the_agents_job(spark):
    """The first-rows check was a job of the driver's before the agents' job; where the rows come out of a
    Python worker it left the worker's output unread, and PySpark dropped the worker from the executor's pool
    (an agent then forked a fresh one: README, "Start-up").  Rows that refuse to be read outside the agents'
    job must train."""
    rows = spark.range(0, 3000, numPartitions=2).selectExpr(
        "array(cast(id % 7 as float), cast(id % 5 as float)) as features", "id % 3 as label")
    df = rows.mapInArrow(helpers.agents_job_only, rows.schema)
    result = Trainer(functools.partial(MLP, 2, (8,), 3), helpers.cross_entropy, helpers.adam, agents=2,
                     input_shape=(2,), max_cycles=6, spark=spark).fit(df)
    assert result.cycles >= 6 and len(result.history) > 1, result



@pytest.mark.parametrize("rows", [3000, 40_000])
def test_labels_out_of_range_past_the_rows_the_driver_checks_are_refused_by_their_agent_in_one_line(spark, rows):
    """The driver checks the first rows only (no pass over all the data before training); every agent checks all
    of its rows as they arrive.  Labels of 29 only in the last sixth of each partition (the driver's sample
    takes each partition's first 1,024 rows at most): one UserError line naming the agent, the agents' job
    stopped — also where they come in a later Arrow batch than the first (40,000 rows: Spark sends 10,000 a
    batch), with data.stream, where the agent may have started training on its first rows (mpca.data.stream)."""
    position = F.col("id") % rows
    df = spark.range(0, 2 * rows, numPartitions=2).select(
        F.array(*[F.rand(i).cast("float") for i in range(8)]).alias("features"),
        F.when(position >= rows * 5 // 6, F.lit(29)).otherwise(F.col("id") % 10).alias("label"))
    tracker = spark.sparkContext.statusTracker()
    with pytest.raises(UserError) as err:
        Trainer(functools.partial(MLP, 8, (16,), 10), helpers.cross_entropy, helpers.adam, agents=2,
                input_shape=(8,), holdout=0.0, max_cycles=200, stream=rows > 3000, spark=spark).fit(df)
    assert "labels reach 29" in str(err.value) and "agent" in str(err.value) and "\n" not in str(err.value), err.value
    deadline = time.time() + 10
    while tracker.getActiveJobsIds() and time.time() < deadline:
        time.sleep(0.2)
    assert not tracker.getActiveJobsIds()
