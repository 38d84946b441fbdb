"""Experiment tracking through on_cycle without MLflow itself: TensorBoard event files, the tracking section,
what happens without MLflow installed.  (MLflow, whose import and runs start processes:
tests/integration/test_tracking.py; a real tracking server and registry: tests/e2e/test_mlflow.py.)"""
import sys

import pytest

from mpca.config import TrackingSection, load_config, settings_from
from mpca.errors import UserError
from mpca.tracking import TensorBoardTracker, Trackers, flat_params, from_config
from tests.helpers import TrackedFit, tracked_rows

pytestmark = pytest.mark.usefixtures("mlflow_environment")  # tests/conftest.py


def test_tensorboard_writes_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = TensorBoardTracker(str(tmp_path / "tb"))
    hooks = Trackers([t])
    hooks.start(None)
    for row in tracked_rows():
        hooks(row)
    hooks.finish(TrackedFit())
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, round(e.value, 3)) for e in acc.Scalars("mpca/holdout_error")] == [(5, 0.5), (10, 0.2)]
    assert hooks.describe() == {"tensorboard": {"log_dir": str(tmp_path / "tb")}}  # summary.json's tracking


def test_config_section_and_flat_params():
    cfg = load_config(["conf/digits.yaml"], ["tracking.tensorboard.dir=/tmp/x"])
    hooks = from_config(cfg.tracking)
    assert [type(h).__name__ for h in hooks.hooks] == ["TensorBoardTracker"]
    assert from_config(load_config(["conf/digits.yaml"]).tracking) is None
    params = flat_params(settings_from(agents=2, max_cycles=3))
    assert params["training.agents"] == "2" and params["algorithm.name"] == "mpca"
    assert all(isinstance(v, str) and len(v) <= 500 for v in params.values())


def test_without_mlflow_installed_the_environment_logs_nothing_but_the_section_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert from_config(TrackingSection()) is None
    with pytest.raises(UserError, match=r"tracking.mlflow needs MLflow: pip install 'mpca\[mlflow\]'"):
        from_config(load_config(["conf/digits.yaml"], ["tracking.mlflow={}"]).tracking)


@pytest.mark.parametrize("name,ok", [("digits-cnn", True), ("main.ml.digits", True), ("", False), ("  ", False),
                                     ("a/b", False), ("a:b", False)])
def test_register_as_is_a_model_name(name, ok):
    override = f"tracking.mlflow.register_as='{name}'"
    if ok:
        assert load_config(["conf/digits.yaml"], [override]).tracking.mlflow.register_as == name
    else:
        with pytest.raises(UserError, match=r"'tracking.mlflow.register_as': a registered model's name"):
            load_config(["conf/digits.yaml"], [override])
