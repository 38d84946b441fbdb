"""The pure algorithms: sharding, update rules, schedules and one module per algorithm (no Spark, no I/O).

Importing this package registers the built-in algorithms: ``mpca`` (default), ``single``, ``sync``,
``easgd``, ``diloco``, ``ddp``, Hermans' and Rudra's parameter-server families and ``weaksync`` (see :mod:`mpca.algorithm.base` for the seam they share).
"""
from mpca.algorithm.base import AgentContext, AgentRule, Algorithm, DriverRule, ServiceAgent
from mpca.algorithm.joint import JointShard, MPCAHyper
from mpca.algorithm.registry import build as build_algorithm
from mpca.algorithm.registry import names as algorithm_names
from mpca.algorithm.registry import register
from mpca.algorithm.rules import (
    WeightedSum,
    blend,
    compensated_pull_,
    easgd_exchange_,
    elastic_pull_,
    extrapolate,
    finish_reduction,
    model_average,
    nesterov_outer_step,
    reduction_weights,
    tau_weighted_reduce,
    trajectory,
)
from mpca.algorithm.schedules import AlphaSchedule, BetaSchedule, GammaSchedule
from mpca.algorithm.sharding import BoundShards, Segment, ShardLayout, TensorSpec, exchanged_tensors

# the built-in algorithms register themselves on import
from mpca.algorithm import mpca as _mpca, single as _single, sync as _sync  # noqa: E402,F401  isort: skip
from mpca.algorithm import easgd as _easgd, diloco as _diloco, ddp as _ddp  # noqa: E402,F401  isort: skip
from mpca.algorithm import hermans as _hermans, rudra as _rudra, weaksync as _weaksync  # noqa: E402,F401  isort: skip

__all__ = [
    "AgentContext", "AgentRule", "Algorithm", "AlphaSchedule", "BetaSchedule", "BoundShards", "DriverRule",
    "GammaSchedule", "JointShard", "MPCAHyper", "Segment", "ShardLayout", "TensorSpec", "WeightedSum",
    "algorithm_names", "blend", "build_algorithm", "compensated_pull_", "easgd_exchange_", "elastic_pull_",
    "exchanged_tensors", "extrapolate", "finish_reduction", "model_average", "nesterov_outer_step",
    "reduction_weights", "register", "ServiceAgent", "tau_weighted_reduce", "trajectory",
]
