"""Experiment tracking through on_cycle: MLflow (a local file store) and TensorBoard event files."""
from mpca.config import load_config, settings_from
from mpca.tracking import MLflowTracker, TensorBoardTracker, Trackers, flat_params, from_config


class _Fit:
    class final:
        error, loss = 0.02, 0.1

    wall_s, cycles, stop_reason = 12.5, 40, "target"


def _rows():
    return [{"cycle": c, "holdout_error": e, "holdout_loss": 2 * e, "samples_per_s": 100.0, "epochs": c / 10,
             "weight": {0: 3}} for c, e in [(5, 0.5), (10, 0.2), (15, float("nan"))]]


def test_mlflow_logs_params_metrics_final_values_and_outputs(tmp_path, monkeypatch):
    import mlflow  # the dev extra installs it (mpca[mlflow] for users)

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a plain directory store, no database server
    uri = f"file:{tmp_path / 'mlruns'}"
    t = MLflowTracker(experiment="mpca-test", tracking_uri=uri, run_name="unit")
    t.start(settings_from(agents=3, max_cycles=5))
    for row in _rows():
        t(row)
    t.finish(_Fit())
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    (tmp_path / "model.json").write_text("{}")
    t.log_outputs({"model": str(model), "plot": None})
    client = mlflow.tracking.MlflowClient(uri)
    run = client.get_run(t.run_id)
    assert run.data.params["training.agents"] == "3" and run.data.tags["stop_reason"] == "target"
    history = client.get_metric_history(t.run_id, "holdout_error")
    assert [(m.step, m.value) for m in history] == [(5, 0.5), (10, 0.2)]  # NaN rows are not logged
    assert run.data.metrics["final_holdout_error"] == 0.02 and run.info.status == "FINISHED"
    assert sorted(a.path for a in client.list_artifacts(t.run_id)) == ["model.json", "model.pt"]


def test_tensorboard_writes_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = TensorBoardTracker(str(tmp_path / "tb"))
    hooks = Trackers([t])
    hooks.start(None)
    for row in _rows():
        hooks(row)
    hooks.finish(_Fit())
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, round(e.value, 3)) for e in acc.Scalars("mpca/holdout_error")] == [(5, 0.5), (10, 0.2)]


def test_config_section_and_flat_params():
    cfg = load_config(["conf/digits.yaml"], ["tracking.tensorboard.dir=/tmp/x"])
    hooks = from_config(cfg.tracking)
    assert [type(h).__name__ for h in hooks.hooks] == ["TensorBoardTracker"]
    assert from_config(load_config(["conf/digits.yaml"]).tracking) is None
    params = flat_params(settings_from(agents=2, max_cycles=3))
    assert params["training.agents"] == "2" and params["algorithm.name"] == "mpca"
    assert all(isinstance(v, str) and len(v) <= 500 for v in params.values())
