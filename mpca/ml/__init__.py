"""Spark ML face of mpca: an Estimator that trains with any algorithm, a Model that scores DataFrames."""
from mpca.ml.estimator import TorchClassificationModel, TorchClassifier
from mpca.ml.spec import ModelSpec, load_model, save_model

__all__ = ["TorchClassifier", "TorchClassificationModel", "ModelSpec", "save_model", "load_model"]
