"""Numerical faults: an agent whose loss and parameters turn NaN never poisons the joint model."""
import math

import pytest
import torch

from mpca.data.datasets import dataset_dataframe
from mpca.trainer import Trainer
from tests import helpers

pytestmark = pytest.mark.cluster()


def test_nan_on_one_agent_is_rejected_and_the_agent_reset(spark):
    fit = Trainer(helpers.poisoned_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                  max_cycles=25, eval_every_cycles=5, spark=spark).fit(dataset_dataframe(spark, "digits"))
    resets = {s["agent"]: s["resets"] for s in fit.agents}
    assert 1 <= resets[1] <= 2 and resets[0] == 0, fit.agents  # reset once (twice at most), then healthy
    last = fit.timeline.cycles[-3:]
    assert all(c.agents[1].weight > 0 for c in last)  # back in the reduction after its reset
    assert all(torch.isfinite(p).all() for p in fit.model.parameters())  # the joint model stayed finite
    errors = fit.history["holdout_error"].tolist()
    assert all(math.isfinite(e) for e in errors) and fit.final.error < 0.2, errors
    assert fit.history["resets"].max() >= 1  # counted in the history
    assert not any(c.rejected for c in fit.timeline.cycles)  # caught on the agent, before the reduction
