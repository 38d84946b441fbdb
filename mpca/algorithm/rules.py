"""The update rules of MPCA SGD and of the baselines, one function per equation.

Everything here is pure tensor arithmetic: no Spark, no I/O.  Equation numbers
refer to Langer et al., "Distributed Training of Deep Learning Models: A
Taxonomic Perspective" / MPCA SGD (2018), seeds/mpca-sgd-langer-2018.txt.

Driver side, per shard: reduce (Eq. 9) → blend (Eq. 8) → trajectory (Eq. 4)
→ extrapolate (Eq. 5).  Agent side, every step: elastic pull (Eq. 7, toward x* or
toward the delay-compensated target), then the optimizer step.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from mpca.algorithm.weighted_sum import WeightedSum  # noqa: F401 - Eq. 9's partial sums, here with the rest


# --------------------------------------------------------------------------- Eq. 9
def finish_reduction(partial: WeightedSum, joint: torch.Tensor) -> torch.Tensor:
    """Eq. 9 at the root: R = Σ τ_i x_i / Σ τ_i; when Σ τ_i = 0, R = x̃ (the joint shard is kept)."""
    if partial.total is None or partial.weight <= 0:
        return joint.clone()
    return (torch.as_tensor(partial.total) / partial.weight).to(joint.dtype)


def tau_weighted_reduce(shards: Sequence[torch.Tensor], taus: Sequence[float], joint: torch.Tensor) -> torch.Tensor:
    """Eq. 9: R(x^1..x^K) = Σ τ_i x_i / Σ τ_i, with τ_i = 0 → weight 0 and Σ τ_i = 0 → x̃."""
    if len(shards) != len(taus):
        raise ValueError(f"{len(shards)} shards but {len(taus)} taus")
    acc = WeightedSum(None, 0.0)
    for x, tau in zip(shards, taus):
        acc = acc.combine(WeightedSum.of(x, tau))
    return finish_reduction(acc, joint)


def reduction_weights(taus: Sequence[float]) -> list:
    """The weights τ_i / Σ τ_j that Eq. 9 gives each agent (all 0 when Σ τ = 0)."""
    total = float(sum(taus))
    if any(t < 0 for t in taus):
        raise ValueError("taus must be >= 0")
    return [0.0 if total == 0 else float(t) / total for t in taus]


# --------------------------------------------------------------------------- Eq. 8
def blend(joint: torch.Tensor, reduced: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 8: x̃_t = (1 - β) x̃_{t-1} + β R."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    return torch.lerp(joint, reduced.to(joint.dtype), beta)


# --------------------------------------------------------------------------- Eq. 4
def trajectory(velocity: torch.Tensor, joint_new: torch.Tensor, joint_old: torch.Tensor, delta: float) -> torch.Tensor:
    """Eq. 4: ṽ_t = δ ṽ_{t-1} + (1 - δ)(x̃_t - x̃_{t-1}).

    Both joint states must be *real* states produced by Eq. 8, never
    extrapolated ones (§4.3: that would be very unstable).
    """
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must lie in [0, 1], got {delta}")
    return velocity * delta + (joint_new - joint_old) * (1.0 - delta)


# --------------------------------------------------------------------------- Eq. 5
def extrapolate(joint: torch.Tensor, velocity: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. 5: x*_{t+γ} = x̃_t + γ ṽ_t (γ = 0 disables the projection)."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if gamma == 0:
        return joint.clone()
    return joint + velocity * gamma


# --------------------------------------------------------------------------- Eq. 7
@torch.no_grad()
def elastic_pull_(local: Sequence[torch.Tensor], target: Sequence[torch.Tensor], alpha: float) -> None:
    """Eq. 7, in place: x_i ← x_i - α (x_i - x*) = lerp(x_i, x*, α), fused over all tensors.

    Applied by each agent just before computing gradients, every step; ``local``
    are the live views of one shard, ``target`` the projected joint shard
    (same shapes, dtypes and devices).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if alpha == 0.0 or not local:
        return
    torch._foreach_lerp_(list(local), list(target), alpha)


@torch.no_grad()
def compensated_pull_(local: Sequence[torch.Tensor], residual: Sequence[torch.Tensor], alpha: float) -> None:
    """Eq. 7 toward a delay-compensated target, in place on both lists: x_i ← x_i − α r, then r ← (1 − α) r.

    ``residual`` r holds x_i − x̂*, where the target x̂* = x* + (x_i − y_i) is the projected joint shard plus
    the agent's own progress since it contributed y_i to the reduction that produced x*: at receipt
    r = y_i − x*, the agent's disagreement with the others *when it contributed*.  Each pull is exactly
    Eq. 7 (x_i − α (x_i − x̂*)); the gradient step then moves x_i and x̂* alike, so r only shrinks by the pull.
    The pull corrects disagreement and never undoes the steps made while the exchange was in flight (the
    plain target x* lags them by the pipeline's delay).  mpca's deviation from the paper: see ``MPCA.pull``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if alpha == 0.0 or not local:
        return
    torch._foreach_add_(list(local), list(residual), alpha=-alpha)
    torch._foreach_mul_(list(residual), 1.0 - alpha)


# --------------------------------------------------------------------------- baselines
def model_average(shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """SparkNet (§3.1): R = (1/K) Σ x_i; the result replaces the joint model."""
    if not shards:
        raise ValueError("model_average needs at least one shard")
    acc = torch.zeros_like(shards[0], dtype=torch.float64)
    for x in shards:
        acc += x
    return (acc / len(shards)).to(shards[0].dtype)


@torch.no_grad()
def easgd_exchange_(local: Sequence[torch.Tensor], center: Sequence[torch.Tensor], alpha: float) -> None:
    """Asynchronous EASGD (Eqs. 2–3), in place on both sides, from the same x_t^i and x̃_t:

    Eq. 2: x^i ← x^i - α (x^i - x̃);  Eq. 3: x̃ ← x̃ + α (x^i - x̃).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    diffs = torch._foreach_sub(list(local), list(center))
    torch._foreach_mul_(diffs, alpha)
    torch._foreach_sub_(list(local), diffs)
    torch._foreach_add_(list(center), diffs)


# --------------------------------------------------------------------------- DiLoCo
@torch.no_grad()
def nesterov_outer_step(joint: torch.Tensor, grad: torch.Tensor, momentum_buf: Optional[torch.Tensor], lr: float,
                        momentum: float) -> tuple:
    """DiLoCo's outer step (Douillard et al. 2023): SGD with Nesterov momentum on the averaged pseudo-gradient
    Δ = x̃ − mean_i(x_i), as ``torch.optim.SGD(nesterov=True, dampening=0)`` computes it:

    b ← μ b + Δ (b = Δ on the first step);  x̃ ← x̃ − lr (Δ + μ b).  Returns (new x̃, new b).
    """
    if lr <= 0:
        raise ValueError(f"outer lr must be > 0, got {lr}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"outer momentum must lie in [0, 1), got {momentum}")
    grad = grad.to(joint.dtype)
    buf = grad.clone() if momentum_buf is None else momentum_buf * momentum + grad
    return joint - (grad + buf * momentum) * lr, buf


# --------------------------------------------------------------------------- Streaming DiLoCo, eager updates
@torch.no_grad()
def mix_(local: Sequence[torch.Tensor], outer: Sequence[torch.Tensor], alpha: float) -> None:
    """Streaming DiLoCo's merge (Douillard et al. 2025, §2.3) of a fragment's outer result into the local
    fragment, which kept training for τ steps meanwhile: x_i ← (1 − α) x_i + α θ (in place).  α = 1 takes the
    outer result as DiLoCo does (copied, bit for bit); α = 0 keeps the local fragment.  (torchft's
    ``fragment_update_alpha`` is the local fragment's weight, 1 − α here.)"""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"the mixing factor must lie in [0, 1], got {alpha}")
    local, outer = list(local), [o.to(dtype=l.dtype, device=l.device) for o, l in zip(outer, local)]
    if alpha == 1.0:
        torch._foreach_copy_(local, outer)
    elif alpha > 0.0:
        torch._foreach_lerp_(local, outer, alpha)


def eager_outer_gradient(own: torch.Tensor, own_term_before: Optional[torch.Tensor],
                         mean_before: Optional[torch.Tensor], workers: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The outer gradient an agent applies at the end of round r with eager updates (Kale, Douillard and Donchev
    2025): the round's average is not back yet, so the agent's own fresh outer gradient stands in for its term
    and the other M − 1 workers' terms come from round r − 1's average, which has arrived:

        Δ̂ = e_r + (Δ̄_{r−1} − e_{r−1}),   e_r = Δ_r^own / M

    where e_{r−1} is the term the agent added for itself a round earlier, exactly as it added it (the paper's
    Δ_{r−1}^own / M with the same M).  Summed over rounds this telescopes to the averages applied plus the agent's
    latest own term, also when M changes between rounds (a worker lost or joining) or Δ_{r−1} never reached
    the average (its term is then taken back, as a worker that missed an all-reduce).  In round 0 (no average
    yet) Δ̂ = e_0; after a join, with an average but no earlier term, Δ̂ = e_r + Δ̄.  Returns (Δ̂, e_r)."""
    if workers <= 0:
        raise ValueError(f"workers must be > 0, got {workers}")
    term = own / workers
    out = term
    if mean_before is not None:
        out = out + mean_before.to(own.dtype)
        if own_term_before is not None:
            out = out - own_term_before
    return out, term
