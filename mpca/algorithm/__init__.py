"""The pure algorithm: sharding, update rules and schedules (no Spark, no I/O)."""
from mpca.algorithm.joint import JointShard, MPCAHyper
from mpca.algorithm.rules import (
    WeightedSum,
    blend,
    easgd_exchange_,
    elastic_pull_,
    extrapolate,
    finish_reduction,
    model_average,
    reduction_weights,
    tau_weighted_reduce,
    trajectory,
)
from mpca.algorithm.schedules import AlphaSchedule, BetaSchedule, GammaSchedule
from mpca.algorithm.sharding import BoundShards, Segment, ShardLayout, TensorSpec, exchanged_tensors

__all__ = [
    "AlphaSchedule", "BetaSchedule", "BoundShards", "GammaSchedule", "JointShard", "MPCAHyper", "Segment",
    "ShardLayout", "TensorSpec", "WeightedSum", "blend", "easgd_exchange_", "elastic_pull_", "exchanged_tensors",
    "extrapolate", "finish_reduction", "model_average", "reduction_weights", "tau_weighted_reduce", "trajectory",
]
