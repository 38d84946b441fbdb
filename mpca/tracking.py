"""Experiment tracking through the Trainer's ``on_cycle`` hook: MLflow and TensorBoard.

The hook protocol: ``on_cycle(row)`` gets every history row (an evaluation of the joint model: ``cycle``,
``wall_s``, ``holdout_error``, ``holdout_loss``, ``samples_per_s``, ``epochs``, per-agent weights …).
An ``on_cycle`` object may also have ``start(settings)`` (called before the agents start) and
``finish(result)`` (called with the :class:`~mpca.trainer.FitResult` when the fit ends, None if it
failed); ``mpca train`` then hands the files it wrote to ``log_outputs(paths)``.  :class:`Trackers` fans
one hook out to several.

``mpca train`` sets them up from the config's ``tracking`` section::

    tracking:
      mlflow: {experiment: nightly-retrain, tracking_uri: null, run_name: null}   # pip install 'mpca[mlflow]'
      tensorboard: {dir: runs/tb}                                                # pip install tensorboard
"""
from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Callable, Dict, Iterable, Optional

from mpca.errors import UserError

log = logging.getLogger("mpca.tracking")

METRICS = ("holdout_error", "holdout_loss", "samples_per_s", "epochs", "resets")


def _metrics(row: Dict[str, Any]) -> Dict[str, float]:
    out = {}
    for k in METRICS:
        v = row.get(k)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


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


class MLflowTracker:
    """Logs the settings as params, each history row as metrics (step = cycle), and at the end the final
    error and the job's outputs (model, history, plot, summary) as artifacts."""

    def __init__(self, experiment: Optional[str] = None, tracking_uri: Optional[str] = None,
                 run_name: Optional[str] = None):
        try:
            import mlflow
        except ImportError:
            raise UserError("tracking.mlflow needs MLflow: pip install 'mpca[mlflow]' (or mlflow-skinny)") from None
        self.mlflow = mlflow
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        if experiment:
            mlflow.set_experiment(experiment)
        self.run_name = run_name
        self.run = None

    def start(self, settings) -> None:
        self.run = self.mlflow.start_run(run_name=self.run_name)
        self.mlflow.log_params(flat_params(settings))

    def __call__(self, row: Dict[str, Any]) -> None:
        if self.run is not None:
            self.mlflow.log_metrics(_metrics(row), step=int(row.get("cycle", 0)))

    def finish(self, result) -> None:
        """End of the fit (the Trainer calls it): final metrics, stop reason; the run ends."""
        if self.run is None:
            return
        try:
            if result is not None and result.final is not None:
                final = {"final_holdout_error": result.final.error, "final_holdout_loss": result.final.loss,
                         "wall_s": result.wall_s, "cycles": result.cycles}
                self.mlflow.log_metrics({k: float(v) for k, v in final.items() if v is not None and math.isfinite(v)})
                self.mlflow.set_tag("stop_reason", result.stop_reason)
        finally:
            self.run_id = self.run.info.run_id
            self.mlflow.end_run(status="FINISHED" if result is not None else "FAILED")
            self.run = None

    def log_outputs(self, outputs: Dict[str, Optional[str]]) -> None:
        """Attach files a job wrote after the fit (model.pt with its model.json, history, plot, summary)."""
        if getattr(self, "run_id", None) is None:
            return
        with self.mlflow.start_run(run_id=self.run_id):
            for path in outputs.values():
                if path and "://" not in path and os.path.isfile(path):
                    self.mlflow.log_artifact(path)
                    sidecar = path[:-3] + ".json" if path.endswith(".pt") else None
                    if sidecar and os.path.isfile(sidecar):
                        self.mlflow.log_artifact(sidecar)  # the architecture beside the weights


class TensorBoardTracker:
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


class Trackers:
    """Several hooks as one ``on_cycle``."""

    def __init__(self, hooks: Iterable[Callable]):
        self.hooks = [h for h in hooks if h is not None]

    def start(self, settings) -> None:
        for h in self.hooks:
            if hasattr(h, "start"):
                h.start(settings)

    def __call__(self, row) -> None:
        for h in self.hooks:
            h(row)

    def finish(self, result) -> None:
        for h in self.hooks:
            if hasattr(h, "finish"):
                h.finish(result)

    def log_outputs(self, outputs) -> None:
        for h in self.hooks:
            if hasattr(h, "log_outputs"):
                h.log_outputs(outputs)


def from_config(section) -> Optional[Trackers]:
    """The trackers a job config's ``tracking`` section asks for (None when it asks for none)."""
    hooks = []
    if section.mlflow is not None:
        hooks.append(MLflowTracker(section.mlflow.experiment, section.mlflow.tracking_uri, section.mlflow.run_name))
    if section.tensorboard is not None:
        hooks.append(TensorBoardTracker(section.tensorboard.dir))
    return Trackers(hooks) if hooks else None
