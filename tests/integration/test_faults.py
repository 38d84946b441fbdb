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


def test_batchnorm_statistics_are_meaningful_when_agents_keep_theirs(spark):
    """buffers="local": the agents' BatchNorm statistics never reach the driver; the evaluated and the saved
    model get statistics recalibrated on training rows, not the initial 0/1."""
    fit = Trainer(helpers.bn_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                  buffers="local", max_cycles=15, eval_every_cycles=5, spark=spark).fit(dataset_dataframe(spark, "digits"))
    bn = fit.model.net[1]
    assert bn.running_mean.abs().sum() > 1.0 and not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert fit.final.error < 0.15, fit.history["holdout_error"].tolist()
    assert fit.history["holdout_error"].iloc[-2] < 0.2  # the background evaluations too
