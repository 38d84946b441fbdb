"""Experiment tracking into MLflow (a local file store) through on_cycle, and when MLflow's own environment turns
tracking on.  MLflow starts processes: its import (``uname -p``), a run (git) and log_model (a Python process
that captures the model's modules).  The rest of tracking: tests/unit/test_tracking.py; a real tracking server
and registry: tests/e2e/test_mlflow.py."""
import os

import pytest
import torch

from mpca.config import TrackingSection, load_config, settings_from
from mpca.tracking import MLFLOW_ENV, MLflowTracker, from_config, log_model_kwargs
from tests.helpers import TrackedFit, tracked_rows

pytestmark = pytest.mark.usefixtures("mlflow_environment")


def _saved_model(tmp_path):
    """A small CNN saved as a job saves it (model.pt + model.json), with five digits as its input example."""
    from mpca.data.datasets import load_digits
    from mpca.ml.spec import registry_spec, save_model
    from mpca.models import build_model

    torch.manual_seed(0)
    path = str(tmp_path / "model.pt")
    save_model(path, build_model("small_cnn", {"image_size": 8}), registry_spec("small_cnn", {"image_size": 8}))
    x, _ = load_digits()
    return path, x[:5].reshape(-1, 1, 8, 8).astype("float32")


def _same_predictions(mlflow_model, path, x) -> bool:
    from mpca.ml import load_model

    with torch.no_grad():
        return torch.allclose(mlflow_model(torch.from_numpy(x)), load_model(path)(torch.from_numpy(x)), atol=1e-5)


def test_mlflow_logs_params_metrics_final_values_and_outputs(tmp_path, monkeypatch):
    import mlflow  # the dev extra installs it (mpca[mlflow] for users)

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a plain directory store, no database server
    uri = f"file:{tmp_path / 'mlruns'}"
    t = MLflowTracker(experiment="mpca-test", tracking_uri=uri, run_name="unit")
    t.start(settings_from(agents=3, max_cycles=5))
    for row in tracked_rows():
        t(row)
    t.finish(TrackedFit())
    model, example = _saved_model(tmp_path)
    t.example = example  # what take_input_example takes from the job's DataFrame
    t.log_outputs({"model": model, "plot": None})
    client = mlflow.tracking.MlflowClient(uri)
    run = client.get_run(t.run_id)
    assert run.data.params["training.agents"] == "3" and run.data.tags["stop_reason"] == "target"
    history = client.get_metric_history(t.run_id, "holdout_error")
    assert [(m.step, m.value) for m in history] == [(5, 0.5), (10, 0.2)]  # NaN rows are not logged
    assert run.data.metrics["final_holdout_error"] == 0.02 and run.info.status == "FINISHED"
    assert {"model.json", "model.pt"} <= {a.path for a in client.list_artifacts(t.run_id)}
    # the model as an MLflow PyTorch model: signature and input example from the rows, same predictions
    info = mlflow.models.get_model_info(f"runs:/{t.run_id}/model")
    (spec,) = info.signature.inputs.inputs
    assert (str(spec.type), spec.shape) == ("float32", (-1, 1, 8, 8))
    assert info.saved_input_example_info["type"] == "ndarray" and t.model_uri == info.model_uri
    from mpca.data.datasets import load_digits

    x = load_digits()[0][:40].reshape(-1, 1, 8, 8).astype("float32")  # another batch size than the example's
    assert _same_predictions(mlflow.pytorch.load_model(t.model_uri), model, x)


def test_env_tracking_uri_alone_logs_metrics_and_the_model(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI and no tracking section: a run with the params, the metrics and the model."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    hooks = from_config(load_config(["conf/digits.yaml"]).tracking)
    hooks.start(settings_from(agents=2, max_cycles=15))
    for row in tracked_rows():
        hooks(row)
    hooks.finish(TrackedFit())
    model, example = _saved_model(tmp_path)
    (t,) = hooks.hooks
    t.example = example
    hooks.log_outputs({"model": model})
    client = mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri())
    run = client.get_run(t.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["holdout_error"] == 0.2
    assert run.data.params["stop.max_cycles"] == "15"
    assert _same_predictions(mlflow.pytorch.load_model(f"runs:/{t.run_id}/model"), model, example)


def test_mlflow_environment_turns_tracking_on(monkeypatch):
    """MLflow's own variables (or an active run) stand in for a tracking.mlflow section; none: no tracker."""
    assert from_config(TrackingSection()) is None
    for k in MLFLOW_ENV:
        value = {"MLFLOW_RUN_ID": "0123", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}.get(k, "x")  # no file store
        monkeypatch.setenv(k, value)
        hooks = from_config(TrackingSection())
        assert [type(h).__name__ for h in hooks.hooks] == ["MLflowTracker"], k
        monkeypatch.delenv(k)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "x")
    cfg = load_config(["conf/digits.yaml"], ["tracking.tensorboard.dir=/tmp/x"])  # mlflow not named: env decides
    assert [type(h).__name__ for h in from_config(cfg.tracking).hooks] == ["MLflowTracker", "TensorBoardTracker"]
    cfg = load_config(["conf/digits.yaml"], ["tracking.mlflow.register_as=digits", "tracking.mlflow.run_name=r"])
    (t,) = from_config(cfg.tracking).hooks  # the section's settings, one tracker
    assert (t.register_as, t.run_name) == ("digits", "r")


def test_an_active_run_is_logged_into_and_left_open(tmp_path, monkeypatch):
    """A notebook's mlflow.start_run(): the fit's params and metrics go into that run, which stays the caller's."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    os.environ.pop("MLFLOW_TRACKING_URI")  # set_tracking_uri exports it: here the active run alone must decide
    with mlflow.start_run() as outer:
        hooks = from_config(TrackingSection())
        assert hooks is not None
        hooks.start(settings_from(agents=2, max_cycles=7))
        for row in tracked_rows():
            hooks(row)
        hooks.finish(TrackedFit())
        assert mlflow.active_run().info.run_id == outer.info.run_id  # not ended, no nested run
        (tmp_path / "history.csv").write_text("cycle\n5\n")
        hooks.log_outputs({"history": str(tmp_path / "history.csv")})
        assert mlflow.active_run().info.run_id == outer.info.run_id
        hooks.start(settings_from(agents=2, max_cycles=8))  # a second fit in the run: its params are not logged again
        hooks.finish(TrackedFit())
    client = mlflow.tracking.MlflowClient()
    run = client.get_run(outer.info.run_id)
    assert run.info.status == "FINISHED" and run.data.params["stop.max_cycles"] == "7"
    assert run.data.metrics["final_holdout_error"] == 0.02
    assert [a.path for a in client.list_artifacts(outer.info.run_id)] == ["history.csv"]
    assert len(client.search_runs([run.info.experiment_id])) == 1  # no other (nested) run


def test_log_model_arguments_follow_the_installed_mlflow():
    """MLflow 3: name=; MLflow 2.x: artifact_path=; without an example no torch.export (pickled)."""
    def mlflow3(model, name=None, artifact_path=None, registered_model_name=None, signature=None,
                input_example=None, serialization_format=None):
        pass

    def mlflow2(model, artifact_path=None, registered_model_name=None, signature=None, input_example=None):
        pass

    model = torch.nn.Flatten()
    assert log_model_kwargs(mlflow3, model, None, None) == {"name": "model", "serialization_format": "pickle"}
    assert log_model_kwargs(mlflow2, model, None, "m") == {"artifact_path": "model", "registered_model_name": "m"}
    x = torch.ones(3, 1, 2, 2).numpy()
    kw = log_model_kwargs(mlflow3, model, x, None)
    assert kw["input_example"] is x and "serialization_format" not in kw
    assert [s.shape for s in kw["signature"].inputs.inputs] == [(-1, 1, 2, 2)]
    assert [s.shape for s in kw["signature"].outputs.inputs] == [(-1, 4)]
