"""Eq. 9's partial sums (Σ τ_i x_i, Σ τ_i), on numpy arrays or torch tensors alike.

Apart from :mod:`mpca.algorithm.rules` because the exchange tasks sum numpy arrays with it: this module
imports neither torch nor numpy, so the executors' Python workers that run the control and exchange jobs
never import torch (:mod:`mpca.runtime.jobs`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class WeightedSum:
    """Partial result of the τ-weighted reduction: Σ τ_i x_i and Σ τ_i over some agents.

    Works on torch tensors and numpy arrays alike (the exchange tasks send numpy).
    Partials combine associatively (:meth:`combine`), which is what lets Spark's
    treeReduce compute Eq. 9 across the cluster; :func:`finish_reduction`
    divides at the root.
    """

    total: Optional[Any]  # Σ τ_i x_i, None when no agent contributed a positive weight
    weight: float  # Σ τ_i

    @staticmethod
    def of(x: Any, tau: float) -> "WeightedSum":
        if tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        if tau == 0:  # an agent that made no step carries weight 0 (and its x is not even needed)
            return WeightedSum(None, 0.0)
        return WeightedSum(x * float(tau), float(tau))

    def combine(self, other: "WeightedSum") -> "WeightedSum":
        if self.total is None:
            return WeightedSum(other.total, self.weight + other.weight)
        if other.total is None:
            return WeightedSum(self.total, self.weight + other.weight)
        return WeightedSum(self.total + other.total, self.weight + other.weight)
