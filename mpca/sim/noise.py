"""How much a task gains from more samples per unit of time: its gradient noise scale, measured by a short pilot.

McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training" (arXiv 1812.06162):

* the *simple noise scale* ``B = tr(Σ) / |G|²`` (their Eq. 2.9), Σ the per-sample gradients' covariance and G
  the true gradient, estimated from the squared norms of gradients over two batch sizes (their App. A.1): with
  ``E|G_b|² = |G|² + tr(Σ)/b``,
  ``|G|² ≈ (b_big |G_big|² − b_small |G_small|²) / (b_big − b_small)`` and
  ``tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/b_small − 1/b_big)``;
* steps to a target at batch b: ``S(b) = S_min (1 + B / b)`` (their Eq. 2.11), so K agents that together draw
  K·b samples per step need fewer steps than one agent by at most
  ``(1 + B/b) / (1 + B/(K b))`` (:func:`ideal_speedup`): K when B ≫ K·b (every sample is new information),
  1 when B ≪ b (one agent's batch already estimates the gradient well).

``mpca plan`` simulates its algorithms on a proxy task whose ``B`` is not the user's; it measures both after the
same pilot (:func:`pilot`: ``steps`` training steps at the same batch, then the estimate) and scales each
cell's simulated speed-up by the ratio of the two ceilings (:mod:`mpca.sim.plan`).  ``B`` grows as the loss falls
(their Fig. 4): a pilot's B is that of early training, below the B near a tight target, so the correction is
on the side of predicting less gain.  The estimate uses plain gradients, whatever the optimizer.  Measured
(docs/results/2026-11-28-plan.md): mpca's agents under Adam gained more than this ceiling on the teacher MLP
(4.0× at K = 4 where (1 + B/b)/(1 + B/(Kb)) = 2.26), so ``mpca plan`` trains the job's own model by default and
keeps this as its coarse route."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict

import torch

PILOT_STEPS = 200  # training steps before the estimate (the pilot's default)
DRAWS = 12  # pairs of batch gradients averaged (the estimate's default)
BIG = 8  # the big batch is this many small ones (capped by the sample's rows)


@dataclass(frozen=True)
class NoiseScale:
    """One estimate: ``b_simple`` = tr(Σ)/|G|², from ``draws`` pairs of gradients at ``small`` and ``big``
    samples, after ``steps`` pilot steps (training loss ``loss`` over the last of them)."""

    b_simple: float
    grad_sq: float  # |G|², the true gradient's squared norm
    trace: float  # tr(Σ), the per-sample gradients' total variance
    small: int
    big: int
    draws: int
    steps: int
    loss: float
    wall_s: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"B = {self.b_simple:.3g} samples (|G|^2 {self.grad_sq:.3g}, tr(Sigma) {self.trace:.3g}; "
                f"{self.draws} pairs of batches of {self.small} and {self.big}, after {self.steps} pilot steps, "
                f"training loss {self.loss:.3g})")


def from_norms(small_sq: float, big_sq: float, small: int, big: int) -> tuple:
    """(|G|², tr(Σ)) from the mean squared norms of gradients over ``small`` and ``big`` samples (App. A.1)."""
    if not 0 < small < big:
        raise ValueError(f"need 0 < small < big batch sizes, got {small} and {big}")
    grad_sq = (big * big_sq - small * small_sq) / (big - small)
    trace = (small_sq - big_sq) / (1.0 / small - 1.0 / big)
    return grad_sq, trace


def simple_noise_scale(grad_sq: float, trace: float) -> float:
    """B_simple = tr(Σ)/|G|²; +inf when the noise swamps the estimate of |G|² (≤ 0: no measurable signal), 0 when
    no noise was measured."""
    if trace <= 0:
        return 0.0
    return float("inf") if grad_sq <= 0 else trace / grad_sq


def ideal_speedup(b_noise: float, batch: int, agents: int) -> float:
    """Fewer steps to a target for ``agents`` × ``batch`` samples a step than for ``batch``:
    (1 + B/b) / (1 + B/(K b)) (McCandlish et al. Eq. 2.11); K in the limit B → ∞."""
    if agents < 1 or batch < 1:
        raise ValueError(f"agents and batch must be >= 1, got {agents} and {batch}")
    if b_noise == float("inf"):
        return float(agents)
    return (1 + b_noise / batch) / (1 + b_noise / (agents * batch))


def _grad_sq(model: torch.nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    return float(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))


def estimate(model: torch.nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor, small: int,
             draws: int = DRAWS, big_factor: int = BIG, generator: torch.Generator = None) -> tuple:
    """((|G|², tr(Σ)), big): ``draws`` batches of ``big`` rows (without replacement, ``big_factor`` × ``small`` or
    all rows), the gradient's squared norm over each and over its first ``small`` rows, averaged, then
    :func:`from_norms`.  The model is left with no gradients."""
    n = len(y)
    big = min(n, big_factor * small)
    if big <= small:
        raise ValueError(f"the noise scale needs more than {small} rows (one batch), got {n}")
    model.train()
    small_sq = big_sq = 0.0
    for _ in range(draws):
        ids = torch.randperm(n, generator=generator)[:big]
        bx, by = x[ids], y[ids]
        big_sq += _grad_sq(model, loss_fn, bx, by)
        small_sq += _grad_sq(model, loss_fn, bx[:small], by[:small])
    model.zero_grad(set_to_none=True)
    return from_norms(small_sq / draws, big_sq / draws, small, big), big


def pilot(model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer, x: torch.Tensor,
          y: torch.Tensor, batch: int, steps: int = PILOT_STEPS, draws: int = DRAWS, seed: int = 0) -> NoiseScale:
    """``steps`` training steps of one agent on random batches of these rows, then :func:`estimate` there: the
    noise scale a run meets once past its first steps (module doc).  On one thread (restored after)."""
    if steps < 0:
        raise ValueError(f"pilot steps must be >= 0, got {steps}")
    wall = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        losses = []
        for _ in range(steps):
            ids = torch.randint(len(y), (batch,), generator=gen)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[ids]), y[ids])
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        (grad_sq, trace), big = estimate(model, loss_fn, x, y, batch, draws, generator=gen)
    finally:
        torch.set_num_threads(threads)
    tail = losses[-max(1, steps // 10):] if losses else [float("nan")]
    return NoiseScale(b_simple=simple_noise_scale(grad_sq, trace), grad_sq=grad_sq, trace=trace, small=batch,
                      big=big, draws=draws, steps=steps, loss=sum(tail) / len(tail),
                      wall_s=time.perf_counter() - wall)


__all__ = ["DRAWS", "NoiseScale", "PILOT_STEPS", "estimate", "from_norms", "ideal_speedup", "pilot",
           "simple_noise_scale"]
