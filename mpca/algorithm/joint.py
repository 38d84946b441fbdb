"""The driver's joint model of one shard and its update per reduction (Eqs. 8, 4, 5)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mpca.algorithm.rules import blend, extrapolate, finish_reduction, trajectory
from mpca.algorithm.schedules import AlphaSchedule, BetaSchedule, GammaSchedule
from mpca.algorithm.weighted_sum import WeightedSum


@dataclass(frozen=True)
class MPCAHyper:
    """Hyper-parameters of MPCA SGD: the three schedules and the trajectory smoothing δ (Eq. 4)."""

    alpha: AlphaSchedule = field(default_factory=AlphaSchedule)
    beta: BetaSchedule = field(default_factory=BetaSchedule)
    gamma: GammaSchedule = field(default_factory=GammaSchedule)
    delta: float = 0.8

    def __post_init__(self):
        if not 0.0 <= self.delta <= 1.0:
            raise ValueError(f"delta must lie in [0, 1], got {self.delta!r}")


class JointShard:
    """x̃ and ṽ of one shard on the driver.

    :meth:`update` performs, for one completed reduction: Eq. 9 (finish), Eq. 8
    (blend with β), Eq. 4 (trajectory from the real states x̃_t, x̃_{t-1}), and
    returns x* by Eq. 5 — the projection that is broadcast.  The projection is
    never stored as a joint state.
    """

    def __init__(self, joint: torch.Tensor, velocity: torch.Tensor | None = None, reductions: int = 0):
        self.joint = joint.detach().clone()
        self.velocity = torch.zeros_like(self.joint) if velocity is None else velocity.detach().clone()
        self.reductions = reductions

    def update(self, partial: WeightedSum, beta: float, gamma: float, delta: float) -> torch.Tensor:
        reduced = finish_reduction(partial, self.joint)  # Eq. 9
        new_joint = blend(self.joint, reduced, beta)  # Eq. 8
        self.velocity = trajectory(self.velocity, new_joint, self.joint, delta)  # Eq. 4
        self.joint = new_joint
        self.reductions += 1
        return extrapolate(self.joint, self.velocity, gamma)  # Eq. 5
