"""The pure algorithms: sharding, update rules, schedules and one module per algorithm (no Spark, no I/O).

The registry (:mod:`mpca.algorithm.registry`) registers the built-in algorithms the first time it is asked:
``mpca`` (default), ``single``, ``sync``, ``easgd``, ``diloco``, ``ddp``, Hermans' and Rudra's
parameter-server families and ``weaksync`` (see :mod:`mpca.algorithm.base` for the seam they share).

The names below are imported when first used (PEP 562), so that a module that needs only a torch-free part
(the wire format, Eq. 9's partial sums: what the exchange tasks on the executors use) does not import torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "mpca.algorithm.base": ("AgentContext", "AgentRule", "Algorithm", "DriverRule", "ServiceAgent", "ServiceAlgorithm"),
    "mpca.algorithm.joint": ("JointShard", "MPCAHyper"),
    "mpca.algorithm.registry": ("register",),
    "mpca.algorithm.rules": ("blend", "compensated_pull_", "easgd_exchange_", "eager_outer_gradient", "elastic_pull_",
                             "extrapolate", "finish_reduction", "mix_", "model_average", "nesterov_outer_step",
                             "reduction_weights", "tau_weighted_reduce", "trajectory"),
    "mpca.algorithm.schedules": ("AlphaSchedule", "BetaSchedule", "GammaSchedule"),
    "mpca.algorithm.sharding": ("BoundShards", "Segment", "ShardLayout", "TensorSpec", "exchanged_tensors"),
    "mpca.algorithm.weighted_sum": ("WeightedSum",),
}
_RENAMED = {"build_algorithm": ("mpca.algorithm.registry", "build"),
            "algorithm_names": ("mpca.algorithm.registry", "names")}
_WHERE = {name: (module, name) for module, names in _EXPORTS.items() for name in names}
_WHERE.update(_RENAMED)

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'mpca.algorithm' has no attribute {name!r}")
    module, attr = _WHERE[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # once: later lookups find it directly
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_WHERE))
