"""Spark ML Estimator and Model for PyTorch classifiers trained with mpca.

``TorchClassifier(modelTarget="mpca.models:SmallCNN", modelKwargs='{"image_size": 8}', inputShape=[1, 8, 8],
settings='{"agents": 2, "max_seconds": 120}', algorithm="mpca").fit(df)`` trains with any registered
algorithm through the :class:`~mpca.trainer.Trainer` and returns a :class:`TorchClassificationModel`,
whose ``transform(df)`` adds ``predictionCol`` (the arg-max class, as Spark ML classifiers do) by batch
inference on the executors: the weights travel once per executor in a broadcast, each Python worker builds
the module once, and runs it on the task's GPU where Spark assigned one.  Both are usable in a
``Pipeline``, and save/load like any Spark ML stage (parameters as Spark ML metadata, the module as
``model.pt`` + ``model.json``, see :mod:`mpca.ml.spec`).
"""
from __future__ import annotations

import functools
import io
import json
import os
from typing import Any, Dict, Optional

import numpy as np
import torch
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol
from pyspark.ml.util import (DefaultParamsReadable, DefaultParamsReader, DefaultParamsWritable, DefaultParamsWriter,
                             MLReadable, MLReader, MLWritable, MLWriter)

from mpca.errors import UserError
from mpca.ml.spec import ModelSpec, load_model, save_model


def json_object(text: str, name: str) -> Dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError as e:
        raise UserError(f"{name} must be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise UserError(f"{name} must be a JSON object, got {text!r}")
    return value


class _TorchModelParams(HasFeaturesCol, HasPredictionCol):
    modelTarget = Param(Params._dummy(), "modelTarget", "'package.module:callable' returning the torch.nn.Module "
                        "(importable on the executors)", TypeConverters.toString)
    modelKwargs = Param(Params._dummy(), "modelKwargs", "its keyword arguments, a JSON object", TypeConverters.toString)
    inputShape = Param(Params._dummy(), "inputShape", "shape of one row's features, e.g. [1, 8, 8]",
                       TypeConverters.toListInt)
    inferenceBatchSize = Param(Params._dummy(), "inferenceBatchSize", "rows per inference batch",
                               TypeConverters.toInt)

    def spec(self) -> ModelSpec:
        if not self.isDefined(self.modelTarget):
            raise UserError("set modelTarget='package.module:callable' (the function or class building the model)")
        return ModelSpec(self.getOrDefault(self.modelTarget),
                         json_object(self.getOrDefault(self.modelKwargs), "modelKwargs"))


class TorchClassifier(Estimator, _TorchModelParams, HasLabelCol, DefaultParamsReadable, DefaultParamsWritable):
    """Trains with mpca (or any registered algorithm) on the DataFrame's executors."""

    algorithm = Param(Params._dummy(), "algorithm", "an algorithm name (mpca, sync, diloco, ...) or its settings "
                      "as a JSON object", TypeConverters.toString)
    settings = Param(Params._dummy(), "settings", "further settings as a JSON object of Trainer keywords or "
                     "sections, e.g. {\"agents\": 4, \"max_seconds\": 600, \"target_error\": 0.05}",
                     TypeConverters.toString)
    optimizer = Param(Params._dummy(), "optimizer", "adam | adamw | sgd", TypeConverters.toString)
    learningRate = Param(Params._dummy(), "learningRate", "the optimizer's learning rate", TypeConverters.toFloat)

    @keyword_only
    def __init__(self, *, modelTarget: Optional[str] = None, modelKwargs: str = "{}", inputShape=None,
                 featuresCol: str = "features", labelCol: str = "label", predictionCol: str = "prediction",
                 algorithm: str = "mpca", settings: str = "{}", optimizer: str = "adam", learningRate: float = 1e-3,
                 inferenceBatchSize: int = 256):
        super().__init__()
        self._setDefault(modelKwargs="{}", algorithm="mpca", settings="{}", optimizer="adam", learningRate=1e-3,
                         inferenceBatchSize=256)
        self._set(**self._input_kwargs)

    def _fit(self, dataset) -> "TorchClassificationModel":
        from mpca.models import build_optimizer, cross_entropy
        from mpca.trainer import Trainer

        spec = self.spec()
        algo = self.getOrDefault(self.algorithm)
        algorithm = json_object(algo, "algorithm") if algo.strip().startswith("{") else algo
        opt = self.getOrDefault(self.optimizer)
        if opt not in ("adam", "adamw", "sgd"):
            raise UserError(f"optimizer must be adam, adamw or sgd, got {opt!r}")
        options = {"algorithm": algorithm, "features": self.getFeaturesCol(), "label": self.getLabelCol(),
                   **json_object(self.getOrDefault(self.settings), "settings")}
        if self.isDefined(self.inputShape):
            options["input_shape"] = tuple(self.getOrDefault(self.inputShape))
        fit = Trainer(spec.model_fn(), cross_entropy,
                      functools.partial(build_optimizer, opt, self.getOrDefault(self.learningRate), 0.0, 0.0),
                      spark=dataset.sparkSession, **options).fit(dataset)
        model = TorchClassificationModel.of(fit.model, spec, list(options.get("input_shape", ())))
        model.fit_result = fit  # history, timeline, agents' reports (not saved with the model)
        return self._copyValues(model)


class TorchClassificationModel(Model, _TorchModelParams, MLReadable, MLWritable):
    """Scores a DataFrame: ``predictionCol`` = arg-max class of the module's output, as a double; for a model
    with one output per position (a language model: (rows, T, classes)), the arg-max class of every position as
    ``array<int>`` — a language model's predicted next token after each prefix of the window."""

    @keyword_only
    def __init__(self, *, modelTarget: Optional[str] = None, modelKwargs: str = "{}", inputShape=None,
                 featuresCol: str = "features", predictionCol: str = "prediction", inferenceBatchSize: int = 256):
        super().__init__()
        self._setDefault(modelKwargs="{}", inferenceBatchSize=256)
        self._set(**self._input_kwargs)
        self._module: Optional[torch.nn.Module] = None
        self._broadcast = None
        self.fit_result = None

    @classmethod
    def of(cls, module: torch.nn.Module, spec: ModelSpec, input_shape, **params) -> "TorchClassificationModel":
        m = cls(modelTarget=spec.target, modelKwargs=json.dumps(spec.kwargs), inputShape=list(input_shape), **params)
        m._module = module.eval()
        return m

    @property
    def module(self) -> torch.nn.Module:
        if self._module is None:
            raise UserError("this model holds no trained module yet (fit or load it)")
        return self._module

    def _transform(self, dataset):
        from pyspark.ml.functions import predict_batch_udf
        from pyspark.sql.types import ArrayType, DoubleType, IntegerType

        if self._broadcast is None:  # the weights go to each executor once, not with every task
            buf = io.BytesIO()
            torch.save({k: v.detach().cpu() for k, v in self.module.state_dict().items()}, buf)
            self._broadcast = dataset.sparkSession.sparkContext.broadcast(buf.getvalue())
        spec = self.spec()
        shape = list(self.getOrDefault(self.inputShape)) if self.isDefined(self.inputShape) else []
        if not shape:  # flat features: the width of the first row
            first = dataset.select(self.getFeaturesCol()).first()
            shape = [len(first[0])] if first is not None else [1]
        with torch.no_grad():  # one output per row, or one per position (a sequence model): one zero row tells
            sequence = self.module(torch.zeros((1, *shape))).dim() == 3
        make = functools.partial(_make_predict, spec.target, dict(spec.kwargs), self._broadcast)
        udf = predict_batch_udf(make, return_type=ArrayType(IntegerType()) if sequence else DoubleType(),
                                batch_size=self.getOrDefault(self.inferenceBatchSize),
                                input_tensor_shapes=[shape])  # each row's flat array → one tensor of this shape
        return dataset.withColumn(self.getPredictionCol(), udf(self.getFeaturesCol()))

    def write(self) -> MLWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _ModelReader(cls)


def _make_predict(target: str, kwargs: Dict[str, Any], state):
    """Runs once per executor Python worker (predict_batch_udf caches it): build, load, pick the device."""
    from pyspark import TaskContext

    from mpca.runtime.agent import choose_device

    tc = TaskContext.get()
    res = tc.resources() if tc is not None else {}
    device = choose_device(list(res["gpu"].addresses) if "gpu" in res else [])
    model = ModelSpec(target, kwargs).build()
    model.load_state_dict(torch.load(io.BytesIO(state.value), weights_only=True))
    model.to(device).eval()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device))
        if out.dim() == 3:  # a class per position (a language model's next tokens)
            return out.argmax(dim=-1).to(torch.int32).cpu().numpy()
        return out.argmax(dim=1).to(torch.float64).cpu().numpy()

    return predict


class _ModelWriter(MLWriter):
    def __init__(self, instance: TorchClassificationModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sc)
        save_model(os.path.join(path, "model.pt"), self.instance.module, self.instance.spec())


class _ModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> TorchClassificationModel:
        meta = DefaultParamsReader.loadMetadata(path, self.sc)
        instance = self.cls()
        DefaultParamsReader.getAndSetParams(instance, meta)
        instance._module = load_model(os.path.join(path, "model.pt"))
        return instance
