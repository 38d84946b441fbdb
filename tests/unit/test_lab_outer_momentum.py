"""lab.outer_momentum: DiLoCo's outer Nesterov step on Eq. 8's move, against hand-computed values."""
import torch

from lab import outer_momentum
from mpca.algorithm.joint import JointShard
from mpca.algorithm.weighted_sum import WeightedSum

T = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731


def test_momentum_zero_is_eq_8_and_momentum_carries_the_moves(monkeypatch):
    monkeypatch.setattr(outer_momentum, "MU", 0.0)
    plain, patched = JointShard(T(0.0)), JointShard(T(0.0))
    for r in (1.0, 2.0):
        star = plain.update(WeightedSum(T(2 * r), 2.0), 0.9, 0.7, 0.8)
        assert torch.equal(outer_momentum.update_with_momentum(patched, WeightedSum(T(2 * r), 2.0), 0.9, 0.7, 0.8), star)
        assert torch.equal(patched.joint, plain.joint) and torch.equal(patched.velocity, plain.velocity)
    monkeypatch.setattr(outer_momentum, "MU", 0.5)
    s = JointShard(T(0.0))
    # R = 1, β = 1: Δ = 1, m = 1, x̃ = 0 + 1 + 0.5 = 1.5; ṽ = 0.2 · 1.5 = 0.3; γ = 0: x* = x̃
    assert torch.allclose(outer_momentum.update_with_momentum(s, WeightedSum(T(1.0), 1.0), 1.0, 0.0, 0.8), T(1.5))
    assert torch.allclose(s.velocity, T(0.3))
    # R = 2: Δ = 0.5, m = 0.5 · 1 + 0.5 = 1, x̃ = 1.5 + 0.5 + 0.5 = 2.5; ṽ = 0.8 · 0.3 + 0.2 · 1 = 0.44
    assert torch.allclose(outer_momentum.update_with_momentum(s, WeightedSum(T(2.0), 1.0), 1.0, 0.0, 0.8), T(2.5))
    assert torch.allclose(s.velocity, T(0.44)) and s.reductions == 2
