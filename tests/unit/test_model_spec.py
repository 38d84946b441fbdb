"""A saved model records its architecture by import path and arguments; load_model rebuilds it."""
import functools
import json

import pytest
import torch

from mpca.errors import UserError
from mpca.ml.spec import ModelSpec, load_model, read_spec, registry_spec, save_model
from mpca.models import MLP, SmallCNN, build_model


def test_spec_of_importable_model_functions():
    assert ModelSpec.of(SmallCNN) == ModelSpec("mpca.models:SmallCNN", {})
    assert ModelSpec.of(functools.partial(MLP, in_features=8, hidden=[4])) == \
        ModelSpec("mpca.models:MLP", {"in_features": 8, "hidden": [4]})
    assert ModelSpec.of(lambda: SmallCNN()) is None  # a lambda has no import path
    spec = ModelSpec("mpca.models:SmallCNN", {"image_size": 8})
    assert ModelSpec.of(spec.model_fn()) == spec


def test_save_then_load_rebuilds_the_same_module(tmp_path):
    m = build_model("mlp", {"in_features": 8, "hidden": [4]})
    path = save_model(str(tmp_path / "model.pt"), m, registry_spec("mlp", {"in_features": 8, "hidden": [4]}))
    meta = json.loads((tmp_path / "model.json").read_text())
    assert meta["architecture"] == {"target": "mpca.models:build_model",
                                    "kwargs": {"name": "mlp", "args": {"in_features": 8, "hidden": [4]}}}
    back = load_model(path)
    x = torch.randn(3, 8)
    assert torch.equal(back(x), m.eval()(x)) and not back.training
    assert read_spec(path).target == "mpca.models:build_model"


def test_loading_without_architecture_or_with_the_wrong_one_is_one_line(tmp_path):
    path = save_model(str(tmp_path / "model.pt"), SmallCNN(8))  # no spec: no model.json
    with pytest.raises(UserError, match="no model.json recording its architecture"):
        load_model(path)
    with pytest.raises(UserError, match="does not fit model"):
        load_model(path, ModelSpec("mpca.models:MLP", {}))
    with pytest.raises(UserError, match="cannot be imported"):
        ModelSpec("mpca.nowhere:Model").build()
    with pytest.raises(ValueError):
        ModelSpec("no-colon")
