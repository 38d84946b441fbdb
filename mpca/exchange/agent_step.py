"""An agent's training step with its rule's hooks, and its contribution as it goes on the wire — the sequence the
runtime's agent (:class:`mpca.runtime.agent.Agent`) and the simulator's (:class:`mpca.sim.agents.SimAgent`) both
run, written once.

Its batches (:class:`BatchOrder`): a new permutation of its rows every epoch from its own generator.

A step: ``before_step``, zero_grad, forward and backward (:func:`forward_backward`); ``after_backward`` (DDP's
all-reduce: each driver calls it, the runtime timing it as exchange time, the simulator charging the all-reduce
on its clock); the optimizer's step and ``after_step`` (:func:`optimizer_step`)."""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np
import torch

from mpca.algorithm.base import AgentRule
from mpca.algorithm.wire import ErrorFeedback


def batch_seed(seed: int, agent: int) -> int:
    """The seed of agent ``agent``'s batch order in a run of seed ``seed``."""
    return seed + 7919 * agent


class BatchOrder:
    """An agent's batches: a new permutation of its ``rows`` every epoch from its own generator (seeded with
    ``seed``, :func:`batch_seed`; or ``gen``, one the agent has drawn from already), cut into batches of
    ``batch_size`` (the last one of an epoch may be shorter); each epoch's order moved to ``device`` once (where
    the rows are)."""

    def __init__(self, rows: int, batch_size: int, seed: Optional[int] = None,
                 gen: Optional[torch.Generator] = None, device: Optional[torch.device] = None):
        if (seed is None) == (gen is None):
            raise ValueError("a batch order takes a seed or a generator")
        self.rows, self.batch_size, self.device = rows, batch_size, device
        self.gen = gen if gen is not None else torch.Generator().manual_seed(seed)
        self.order = self._permutation()
        self.lo = 0

    def _permutation(self) -> torch.Tensor:
        order = torch.randperm(self.rows, generator=self.gen)
        return order if self.device is None else order.to(self.device)

    @property
    def epoch_done(self) -> bool:
        """The epoch's last batch has been drawn (the next one starts a new permutation)."""
        return self.lo >= self.rows

    def next(self) -> torch.Tensor:
        if self.epoch_done:
            self.order, self.lo = self._permutation(), 0
        idx = self.order[self.lo:self.lo + self.batch_size]
        self.lo += self.batch_size
        return idx


def forward_backward(rule: AgentRule, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable,
                     x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """before_step, zero_grad, forward and backward on one batch; the loss (not read back: a device sync)."""
    rule.before_step()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss


def optimizer_step(rule: AgentRule, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's step, then after_step (e.g. MPCA's pull toward x̂*, Eq. 7)."""
    optimizer.step()
    rule.after_step()


def finite(vec: torch.Tensor, weight: float) -> Tuple[torch.Tensor, float, bool]:
    """A contribution that never lets NaN/Inf reach the joint model: a non-finite vector goes up as zeros with
    weight 0; (vector, weight, whether it was finite)."""
    if bool(torch.isfinite(vec).all()):
        return vec, float(weight), True
    return torch.zeros_like(vec), 0.0, False


def wire_bytes(feedback: ErrorFeedback, shard: int, vec: torch.Tensor, weight: float) -> bytes:
    """The contribution's payload: encoded with the agent's error feedback (lossy formats keep the residual) when it
    carries weight, the raw values otherwise (nothing to add: no residual is spent)."""
    values = vec.numpy()
    return feedback.encode(shard, values) if weight > 0 else np.ascontiguousarray(values).tobytes()


__all__ = ["BatchOrder", "batch_seed", "finite", "forward_backward", "optimizer_step", "wire_bytes"]
