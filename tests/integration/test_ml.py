"""The Spark ML face: TorchClassifier in a Pipeline — fit with mpca (or another algorithm), batch inference on
the executors, save and load."""
import pytest
from pyspark.ml import Pipeline, PipelineModel

from mpca.data.datasets import dataset_dataframe
from mpca.ml import TorchClassificationModel, TorchClassifier

pytestmark = pytest.mark.cluster()


def _accuracy(df) -> float:
    rows = df.select("label", "prediction").collect()
    return sum(r.prediction == r.label for r in rows) / len(rows)


@pytest.mark.parametrize("algorithm", ["mpca", '{"name": "sync", "every": 10}'])
def test_fit_transform_save_and_load_in_a_pipeline(spark, tmp_path, algorithm):
    df = dataset_dataframe(spark, "digits")
    est = TorchClassifier(modelTarget="mpca.models:SmallCNN", modelKwargs='{"image_size": 8}', inputShape=[1, 8, 8],
                          algorithm=algorithm, settings='{"agents": 2, "max_cycles": 40, "eval_every_cycles": 10}')
    fitted = Pipeline(stages=[est]).fit(df)
    stage = fitted.stages[0]
    assert isinstance(stage, TorchClassificationModel) and stage.fit_result.cycles == 40
    scored = fitted.transform(df)
    assert scored.columns == df.columns + ["prediction"]
    accuracy = _accuracy(scored)
    assert accuracy > 0.8, accuracy
    if algorithm != "mpca":
        return
    path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    before = [r.prediction for r in scored.select("prediction").collect()]
    after = [r.prediction for r in loaded.transform(df).select("prediction").collect()]
    assert before == after  # the same module, rebuilt from its recorded architecture
    assert loaded.stages[0].getOrDefault("inputShape") == [1, 8, 8]
    assert (tmp_path / "pipeline" / "stages").is_dir()


def test_bad_estimator_settings_are_one_line():
    from mpca.errors import UserError

    with pytest.raises(UserError, match="modelTarget"):
        TorchClassifier().spec()
    with pytest.raises(UserError, match="settings must be a JSON object"):
        from mpca.ml.estimator import json_object

        json_object("[1]", "settings")
