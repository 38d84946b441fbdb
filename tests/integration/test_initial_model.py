"""The initial model on the executors (mpca.runtime.initial), on a real local-cluster: agents rebuild it from
the seed, and agents that build other weights there take the driver's model before they train."""
import logging

import pytest

from mpca.data.datasets import dataset_dataframe
from mpca.trainer import Trainer
from tests import helpers

pytestmark = pytest.mark.cluster()


@pytest.mark.parametrize("name", ["mpca", "sync", "easgd"])
def test_agents_that_build_other_weights_take_the_drivers_model_first(spark, name, caplog):
    """``per_process_cnn`` seeds itself with its process id: the driver's check (two builds in one process)
    passes, and every executor builds other weights.  Each agent then joins — a cycle algorithm's through the
    driver's join job, a service algorithm's from the parameter service — and the run trains from there."""
    caplog.set_level(logging.WARNING, logger="mpca.run")
    df = dataset_dataframe(spark, "digits")
    fit = Trainer(helpers.per_process_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                  algorithm=name, stop={"target_error": 0.5, "max_seconds": 60}, eval_every_cycles=2, spark=spark,
                  seed=1).fit(df)
    assert sorted(a["initial_model"] for a in fit.agents) == ["joined", "joined"], fit.agents
    assert sorted(a for c in fit.timeline.cycles for a in c.joined) == [0, 1]
    assert fit.stop_reason == "target_error", fit.history  # chance is 0.9
    warned = [r.getMessage() for r in caplog.records if "built other initial weights" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("agents [0, 1] built"), warned  # the driver says so, once
