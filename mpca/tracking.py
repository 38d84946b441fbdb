"""Experiment tracking through the Trainer's ``on_cycle`` hook: MLflow and TensorBoard.

Each tracker is a :class:`~mpca.observers.RunObserver`: ``start(settings)`` before the agents start, every history
row (an evaluation of the joint model: ``cycle``, ``wall_s``, ``holdout_error``, ``holdout_loss``,
``samples_per_s``, ``epochs``, per-agent weights …), ``finish(result)`` with the :class:`~mpca.trainer.FitResult`
when the fit ends (None if it failed); ``mpca train`` then hands a few rows of the training data to
``take_input_example(df, data)`` and the files it wrote to ``log_outputs(paths)``.  :class:`Trackers` fans one
hook out to several.

``mpca train`` sets them up from the config's ``tracking`` section::

    tracking:
      mlflow: {experiment: nightly-retrain, tracking_uri: null, run_name: null,   # pip install 'mpca[mlflow]'
               register_as: null}                                                # a registered model's name
      tensorboard: {dir: runs/tb}                                                # pip install tensorboard

Without ``tracking.mlflow``, MLflow's own environment turns it on as if ``mlflow: {}`` had been given (where
MLflow is installed): ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_EXPERIMENT_ID`` or
``MLFLOW_RUN_ID`` set, or an MLflow run active in the process (a notebook's ``mlflow.start_run()``).  An
active run is logged into as it is (not a nested run) and left open: it is the caller's.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import sys
from typing import Any, Callable, Dict, Iterable, Optional

from mpca.errors import UserError, error_line
from mpca.observers import OnCycle, RunObserver, observer_of

log = logging.getLogger("mpca.tracking")

METRICS = ("holdout_error", "holdout_loss", "holdout_bits", "samples_per_s", "epochs", "resets")  # bits: metric loss
# MLflow's own settings that turn MLflow tracking on without a tracking.mlflow section (MLFLOW_RUN_ID: `mlflow run`)
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")
MODEL_NAME = "model"  # the MLflow model's name in the run: runs:/<run_id>/model
EXAMPLE_ROWS = 5  # rows of the input example (more than 1: MLflow's torch.export keeps the batch dimension open)


def _metrics(row: Dict[str, Any]) -> Dict[str, float]:
    out = {}
    for k in METRICS:
        v = row.get(k)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def check_store(mlflow, uri: str, what: str) -> None:
    """A local file store that this MLflow refuses (MLflow 3.x keeps its filesystem backend in maintenance mode
    and raises when it is opened, unless ``MLFLOW_ALLOW_FILE_STORE=true``) as one line naming the fixes, before
    Spark starts; other stores (a database, a server, Databricks) are opened by MLflow when the run starts."""
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme
    if scheme not in ("", "file") and not (len(scheme) == 1 and os.name == "nt"):  # a path, or file:
        return
    from mlflow.exceptions import MlflowException

    try:
        mlflow.tracking.MlflowClient(uri).search_experiments(max_results=1)
    except MlflowException as e:
        if "filesystem" not in str(e).lower() and "file store" not in str(e).lower():
            raise UserError(f"{what} {uri!r} cannot be used: {error_line(e, 200)}") from None
        raise UserError(f"{what} {uri!r} is a file store, which MLflow {mlflow.__version__} refuses: use a "
                        "database (tracking_uri: sqlite:///mlflow.db), a tracking server (http://host:5000), or "
                        "MLflow's opt-out MLFLOW_ALLOW_FILE_STORE=true") from None


def flat_params(settings) -> Dict[str, str]:
    """Settings as flat ``section.key`` → string pairs (MLflow params)."""
    out: Dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = json.dumps(value) if not isinstance(value, str) else value

    walk("", settings.model_dump(mode="json"))
    return {k: v[:500] for k, v in out.items()}


class MLflowTracker(RunObserver):
    """Logs the settings as params, each history row as metrics (step = cycle), and at the end the final
    error, the job's outputs (model.pt with model.json, history, plot, summary) as artifacts and the model as
    an MLflow PyTorch model ``model`` (signature and input example from the training data), registered as
    ``register_as`` where given.

    With an MLflow run already active (a notebook's ``mlflow.start_run()``, Databricks), everything goes into
    that run, which stays open (its owner ends it); otherwise the tracker starts a run and ends it."""

    def __init__(self, experiment: Optional[str] = None, tracking_uri: Optional[str] = None,
                 run_name: Optional[str] = None, register_as: Optional[str] = None):
        try:
            import mlflow
        except ImportError:
            raise UserError("tracking.mlflow needs MLflow: pip install 'mpca[mlflow]' (or mlflow-skinny)") from None
        self.mlflow = mlflow
        active = mlflow.active_run()
        if active is not None and (tracking_uri or experiment):
            log.warning("MLflow: logging into the active run %s; tracking_uri/experiment of the config are not "
                        "used", active.info.run_id)
        else:
            # checked before it is set: set_tracking_uri exports MLFLOW_TRACKING_URI to the whole process
            check_store(mlflow, tracking_uri or mlflow.get_tracking_uri(),
                        "tracking.mlflow.tracking_uri" if tracking_uri else "MLflow's tracking URI")
            if tracking_uri:
                mlflow.set_tracking_uri(tracking_uri)
            if experiment:
                mlflow.set_experiment(experiment)
        self.run_name, self.register_as = run_name, register_as
        self.run, self.run_id, self.experiment_id, self.owns_run = None, None, None, True
        self.example = None  # a few rows of features shaped as the model's input (take_input_example)
        self.model_uri: Optional[str] = None  # the logged MLflow model, after log_outputs

    def start(self, settings) -> None:
        active = self.mlflow.active_run()
        self.owns_run = active is None
        self.run = self.mlflow.start_run(run_name=self.run_name) if active is None else active
        self.run_id, self.experiment_id = self.run.info.run_id, self.run.info.experiment_id
        from mlflow.exceptions import MlflowException

        try:
            self.mlflow.log_params(flat_params(settings))
        except MlflowException as e:  # a second fit in the same (active) run: MLflow keeps a param's first value
            log.warning("MLflow: the settings were not logged as params (%s); start one run per fit",
                        error_line(e, 200))

    def __call__(self, row: Dict[str, Any]) -> None:
        if self.run is not None:
            self.mlflow.log_metrics(_metrics(row), step=int(row.get("cycle", 0)))

    def finish(self, result) -> None:
        """End of the fit (the Trainer calls it): final metrics, stop reason; a run the tracker started ends."""
        if self.run is None:
            return
        try:
            if result is not None and result.final is not None:
                final = {"final_holdout_error": result.final.error, "final_holdout_loss": result.final.loss,
                         "wall_s": result.wall_s, "cycles": result.cycles}
                self.mlflow.log_metrics({k: float(v) for k, v in final.items() if v is not None and math.isfinite(v)})
                self.mlflow.set_tag("stop_reason", result.stop_reason)
        finally:
            if self.owns_run:
                self.mlflow.end_run(status="FINISHED" if result is not None else "FAILED")
            self.run = None

    def describe(self) -> Dict[str, Any]:
        """Where this job's MLflow run is, for ``summary.json`` (a scheduler promotes the model from there):
        run id, experiment id, tracking URI, the model's URI and the registered name (None before the run)."""
        if self.run_id is None:
            return {}
        return {"mlflow": {"run_id": self.run_id, "experiment_id": self.experiment_id,
                           "tracking_uri": self.mlflow.get_tracking_uri(),
                           "model_uri": f"runs:/{self.run_id}/{MODEL_NAME}", "registered_as": self.register_as}}

    def take_input_example(self, df, data) -> None:
        """A few rows' features of the training DataFrame (``data``: its features, label and input_shape) as
        the logged model's input example; without one the model is logged without signature."""
        try:
            self.example = input_example(df, data)
        except Exception as e:  # noqa: BLE001 - the model is still logged, pickled and without signature
            log.warning("MLflow: no input example from the data (%s)", error_line(e, 200))

    def _in_run(self):
        """The tracker's run, active: as it is where it is still the active run, else resumed for the block."""
        active = self.mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            return contextlib.nullcontext(active)
        return self.mlflow.start_run(run_id=self.run_id, nested=active is not None)

    def log_outputs(self, outputs: Dict[str, Optional[str]]) -> None:
        """Attach files a job wrote after the fit (model.pt with its model.json, history, plot, summary) and
        the model as an MLflow PyTorch model (rebuilt from model.pt and model.json)."""
        if self.run_id is None:
            return
        with self._in_run():
            for path in outputs.values():
                if path and "://" not in path and os.path.isfile(path):
                    self.mlflow.log_artifact(path)
                    sidecar = path[:-3] + ".json" if path.endswith(".pt") else None
                    if sidecar and os.path.isfile(sidecar):
                        self.mlflow.log_artifact(sidecar)  # the architecture beside the weights
            model = outputs.get("model")
            if model and "://" not in model and os.path.isfile(model):
                self.log_model(model)

    def log_model(self, path: str) -> None:
        """The saved model at ``path`` as the MLflow PyTorch model ``model`` of the active run (registered as
        ``register_as`` where set); where MLflow's torch.export of it fails, pickled instead."""
        import mlflow.pytorch

        from mpca.ml.spec import load_model

        model = load_model(path)
        kwargs = log_model_kwargs(mlflow.pytorch.log_model, model, self.example, self.register_as)
        try:
            info = mlflow.pytorch.log_model(model, **kwargs)
        except Exception as e:  # noqa: BLE001 - torch.export cannot trace every model: pickle it
            if "serialization_format" in kwargs or not _accepts(mlflow.pytorch.log_model, "serialization_format"):
                raise
            log.warning("MLflow: torch.export of the model failed (%s); logging it pickled", error_line(e, 200))
            info = mlflow.pytorch.log_model(model, **kwargs, serialization_format="pickle")
        self.model_uri = info.model_uri


def _accepts(fn: Callable, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def log_model_kwargs(log_model: Callable, model, example, register_as: Optional[str]) -> Dict[str, Any]:
    """Keyword arguments of ``mlflow.pytorch.log_model`` for ``model`` on the installed MLflow: the name
    (``name=`` from MLflow 3, ``artifact_path=`` before), the signature (the example and the model's output on
    it) and the input example, the registered model's name."""
    kwargs: Dict[str, Any] = {("name" if _accepts(log_model, "name") else "artifact_path"): MODEL_NAME}
    if register_as:
        kwargs["registered_model_name"] = register_as
    if example is not None:
        import torch
        from mlflow.models import infer_signature

        with torch.no_grad():
            output = model(torch.from_numpy(example)).numpy()
        kwargs.update(signature=infer_signature(example, output), input_example=example)
    elif _accepts(log_model, "serialization_format"):
        kwargs["serialization_format"] = "pickle"  # MLflow 3's default, torch.export, needs an example
    return kwargs


def input_example(df, data, rows: int = EXAMPLE_ROWS):
    """The features of the first ``rows`` rows of a Spark DataFrame as the model takes them: a float32 numpy
    array of shape ``(rows, *data.input_shape)`` (``data``: a settings ``data`` section).  Read as
    ``DataFrame.take`` reads (:func:`mpca.compat.take_arrow`): the first partition, not every partition's first
    rows."""
    from mpca.compat import take_arrow
    from mpca.data.checks import tensors

    sample = take_arrow(df.select(data.features, data.label), rows)
    x, _ = tensors(sample, data.features, data.label, data.input_shape)
    return x.numpy()


class TensorBoardTracker(RunObserver):
    """Each history row as scalars under ``mpca/`` in a TensorBoard event file (step = cycle)."""

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("tracking.tensorboard needs TensorBoard: pip install tensorboard") from None
        self.writer_cls, self.log_dir, self.writer = SummaryWriter, log_dir, None

    def start(self, settings) -> None:
        self.writer = self.writer_cls(self.log_dir)

    def __call__(self, row: Dict[str, Any]) -> None:
        if self.writer is None:
            self.start(None)
        for k, v in _metrics(row).items():
            self.writer.add_scalar(f"mpca/{k}", v, int(row.get("cycle", 0)), walltime=None)

    def finish(self, result) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def describe(self) -> Dict[str, Any]:
        return {"tensorboard": {"log_dir": self.log_dir}}


class Trackers(RunObserver):
    """Several observers as one ``on_cycle`` (each a :class:`~mpca.observers.RunObserver` or a function of a row)."""

    def __init__(self, hooks: Iterable[OnCycle]):
        self.hooks = [observer_of(h) for h in hooks if h is not None]

    def start(self, settings) -> None:
        for h in self.hooks:
            h.start(settings)

    def __call__(self, row) -> None:
        for h in self.hooks:
            h(row)

    def finish(self, result) -> None:
        for h in self.hooks:
            h.finish(result)

    def take_input_example(self, df, data) -> None:
        for h in self.hooks:
            h.take_input_example(df, data)

    def log_outputs(self, outputs) -> None:
        for h in self.hooks:
            h.log_outputs(outputs)

    def describe(self) -> Dict[str, Any]:
        """Each tracker's whereabouts (``summary.json``'s ``tracking``): ``mlflow``, ``tensorboard``."""
        out: Dict[str, Any] = {}
        for h in self.hooks:
            out.update(h.describe())
        return out


def mlflow_from_environment() -> bool:
    """Whether MLflow's own environment asks for tracking: one of :data:`MLFLOW_ENV` set or an MLflow run
    active in this process — and MLflow importable (where it is not: False, and a log line)."""
    named = [k for k in MLFLOW_ENV if os.environ.get(k)]
    if not named and "mlflow" not in sys.modules:
        return False  # no run can be active in a process that never imported mlflow
    try:
        import mlflow
    except ImportError:
        if named:
            log.info("%s set but MLflow is not installed: nothing goes to MLflow (pip install 'mpca[mlflow]')",
                     ", ".join(named))
        return False
    return bool(named) or mlflow.active_run() is not None


def from_config(section) -> Optional[Trackers]:
    """The trackers a job config's ``tracking`` section asks for (None when it asks for none).  Without
    ``tracking.mlflow``, MLflow's own environment (:func:`mlflow_from_environment`) adds an MLflow tracker
    as if ``mlflow: {}`` had been given."""
    hooks = []
    ml = section.mlflow
    if ml is not None:
        hooks.append(MLflowTracker(ml.experiment, ml.tracking_uri, ml.run_name, register_as=ml.register_as))
    elif mlflow_from_environment():
        hooks.append(MLflowTracker())  # the URI, experiment or run MLflow itself picks up
    if section.tensorboard is not None:
        hooks.append(TensorBoardTracker(section.tensorboard.dir))
    return Trackers(hooks) if hooks else None
