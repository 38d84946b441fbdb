"""Models people train on local-cluster: a byte transformer language model on the standard library's text (a
holdout split by file, the loss as the metric, next-token scoring), and a residual CNN whose BatchNorm
statistics travel with the weights."""
import numpy as np
import pytest
import torch

from mpca.compat import dataframe_from_arrow
from mpca.data.datasets import dataset_dataframe
from mpca.data.text import TextCorpus
from mpca.models import cross_entropy
from mpca.trainer import Trainer
from tests import helpers


def test_the_language_model_learns_text_it_never_saw_and_scores_the_next_tokens(spark):
    corpus = TextCorpus(window=32, holdout=0.1, max_mb=0.4)  # ~0.4 MB of whole stdlib files
    train, hold = corpus.table("train"), corpus.table("holdout")
    assert hold.num_rows > 100
    df, holdout = dataframe_from_arrow(spark, train, 4), dataframe_from_arrow(spark, hold, 1)
    fit = Trainer(helpers.tiny_lm, cross_entropy, helpers.adamw_3e3, agents=2,
                  input_shape=(32,), batch_size=16, max_cycles=40, eval_every_cycles=10, metric="loss",
                  spark=spark).fit(df, holdout)
    h = fit.history.dropna(subset=["holdout_loss"])
    first, last = h["holdout_loss"].iloc[0], fit.final.loss
    assert first > np.log(256) - 0.5  # the untrained model: no better than uniform over 256 bytes (5.55 nats)
    assert last < first - 1.5, h["holdout_loss"].tolist()  # held-out files: text, not memorised windows
    assert np.allclose(h["holdout_bits"], h["holdout_loss"] / np.log(2))
    assert fit.final.error < 0.85  # next-byte error per token (0.78 in 40 cycles; a model of nothing: 0.99)
    # scoring: the predicted next byte at every position, as array<int>; its error is the run's own
    from mpca.ml.estimator import TorchClassificationModel
    from mpca.ml.spec import ModelSpec

    scorer = TorchClassificationModel.of(fit.model, ModelSpec("mpca.models:ByteTransformer", helpers.TINY_LM), [32])
    scored = scorer.transform(holdout).select("prediction", "label").collect()
    pred = np.array([r["prediction"] for r in scored])
    label = np.array([r["label"] for r in scored])
    assert pred.shape == label.shape == (hold.num_rows, 32)
    assert (pred != label).mean() == pytest.approx(fit.final.error, abs=1e-6)


def test_a_resnet_s_batchnorm_statistics_are_averaged_with_its_weights(spark):
    """buffers="average": every agent's running statistics reach the joint model with the weights. The final
    model is scored in eval mode with those statistics: left at their initial 0/1, or taken from a wrong
    place, its error is near chance."""
    torch.manual_seed(0)
    fit = Trainer(helpers.tiny_resnet, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                  buffers="average",  # the statistics as exchanged: no recalibration to hide a wrong exchange
                  max_cycles=20, eval_every_cycles=10, spark=spark).fit(dataset_dataframe(spark, "digits"))
    bn = fit.model.stem[1]
    assert bn.running_mean.abs().sum() > 0.1 and not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert fit.final.error < 0.2, fit.history["holdout_error"].tolist()
