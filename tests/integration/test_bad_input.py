"""Mistakes visible only once a DataFrame exists (the Trainer API): one UserError line, before any agent
starts, with no agent job left behind."""
import time

import pytest
import torch
from pyspark.sql import functions as F

from mpca.data.datasets import dataset_dataframe
from mpca.errors import UserError
from mpca.trainer import Trainer
from tests import helpers

pytestmark = pytest.mark.cluster()


def _raising_optimizer(params):
    raise ValueError("no such optimizer setting")


def _mse(out, y):
    return torch.nn.functional.mse_loss(out, y)


CASES = {
    "empty DataFrame": (lambda df: df.limit(0), {}, "no rows"),
    "labels out of range": (lambda df: df.withColumn("label", F.col("label") + 20), {}, "labels reach 29"),
    "mistyped feature column": (lambda df: df.withColumn("features", F.lit("x")), {}, "cannot be read"),
    "missing label column": (lambda df: df.drop("label"), {}, "column 'label' not in the data"),
    "optimizer_fn raises": (lambda df: df, {"optimizer_fn": _raising_optimizer}, "optimizer_fn failed"),
    "output does not fit the loss": (lambda df: df, {"loss_fn": _mse}, "does not fit the loss"),
    "cluster too small": (lambda df: df, {"agents": 5, "executor_wait_s": 2}, "cluster too small"),
    "min_agents above agents": (lambda df: df, {"min_agents": 3}, "min_agents=3 exceeds"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_trainer_refuses_bad_input_before_any_agent_starts(spark, case):
    change, options, expected = CASES[case]
    fns = {"model_fn": helpers.small_cnn, "loss_fn": helpers.cross_entropy, "optimizer_fn": helpers.adam}
    fns.update({k: v for k, v in options.items() if k in fns})
    options = {k: v for k, v in options.items() if k not in fns}
    tracker = spark.sparkContext.statusTracker()
    with pytest.raises(UserError) as err:
        Trainer(fns["model_fn"], fns["loss_fn"], fns["optimizer_fn"], **{"agents": 2, **options},
                input_shape=(1, 8, 8), max_cycles=3, spark=spark).fit(change(dataset_dataframe(spark, "digits")))
    assert expected in str(err.value) and "\n" not in str(err.value), err.value
    deadline = time.time() + 10  # a job being cancelled (a check's own, or the previous test's) ends within seconds
    while tracker.getActiveJobsIds() and time.time() < deadline:
        time.sleep(0.2)
    assert not tracker.getActiveJobsIds()  # no agent job started (it would run until stopped), nothing left running
