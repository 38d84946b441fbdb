"""DiLoCo with a delayed outer step (Kale, Douillard and Donchev 2025, arXiv 2502.12996, "eager updates"; the
one-step-delay DiLoCo of the same paper with ``eager: false``): no agent waits on the wire.

At the end of round r (H inner steps) the agent takes its outer gradient Δ_r = θ − x (θ: its copy of the global
model), sends it, and goes straight on with round r + 1 — from a new θ computed *now*, without round r's average,
which is still travelling.  Round r − 1's average Δ̄_{r−1} has arrived meanwhile (it travelled during round r), and
the agent takes its outer Nesterov step with

* ``eager: true`` (the default): Δ̂ = Δ_r / M + Δ̄_{r−1} − Δ_{r−1} / M — its own fresh outer gradient stands in
  for its term of round r's average, the other M − 1 workers' terms are a round late
  (:func:`~mpca.algorithm.rules.eager_outer_gradient`; the term taken back is the one the agent added, so that
  the sum stays exact when M changes or its outer gradient missed the average);
* ``eager: false``: Δ̄_{r−1}, the average one round late (the naive delayed step; round 0 takes none).

Then x ← θ.  The agent waits only when Δ̄_{r−1} has not arrived by the end of round r: the exchange took longer
than a whole round.  The driver keeps the consensus θ̄ (the outer steps on the averages, lagging one round:
:class:`~mpca.algorithm.outer.OuterDriver`), which it evaluates, checkpoints and hands to replacements.
M is the number of contributors to the average (the driver sends it with every cycle).  A replacement starts
from θ̄ with the driver's outer momentum (:meth:`~mpca.algorithm.outer.OuterDriver.join_state`).
"""
from __future__ import annotations

import collections
import functools
from typing import List, Literal, Optional

import torch
from pydantic import Field

from mpca.algorithm.base import AgentContext, Algorithm, Params
from mpca.algorithm.outer import OuterAgent, OuterDriver
from mpca.algorithm.registry import register
from mpca.algorithm.rules import eager_outer_gradient


class DelayedDiLoCoAgent(OuterAgent):
    """Rounds of H steps; at a round's end the outer gradient goes up and the outer step is taken at once with the
    previous round's average (waiting for it only if it has not arrived)."""

    def __init__(self, ctx: AgentContext, every: int, eager: bool, lr: float, momentum: float):
        super().__init__(ctx, lr, momentum, queue=2)  # round r + 1 may end before the driver took round r's
        if ctx.shards.layout.num_shards != 1:
            raise ValueError("delayed DiLoCo exchanges the whole model: use one shard")
        self.every, self.eager = every, eager
        self.own_term: Optional[torch.Tensor] = None  # e_{r−1}: what it added for itself in the previous round
        self.averages: collections.deque = collections.deque()  # delivered (Δ̄, M), oldest first
        self.due: Optional[torch.Tensor] = None  # a finished round's outer gradient waiting for Δ̄_{r−1}

    def after_step(self) -> None:
        self.steps += 1
        if self.steps % self.every:
            return
        own = self.outer_gradient(0)
        self.take_snapshot(0, own)
        if self.own_term is None:  # its first round (from the start or a join): no average is due; one there is used
            self._step(own, self.averages.popleft() if self.averages else None)
        elif self.averages:
            self._step(own, self.averages.popleft())
        else:
            with self.cond:
                self.due = own  # the previous round's average is still on the wire: between_steps waits

    def _step(self, own: torch.Tensor, average) -> None:
        """The outer step that ends a round (Δ̂ eager, or the late average), then x ← θ."""
        mean, workers = average if average is not None else (None, float(self.ctx.agents))
        if self.eager:
            grad, term = eager_outer_gradient(own, self.own_term, mean, workers)
        else:
            grad, term = mean, torch.zeros_like(own)
        if grad is not None:
            self.outer_step(0, grad)
        torch._foreach_copy_(self.ctx.shards.views(0), self.ctx.shards.split(0, self.theta[0]))
        self.own_term = term
        with self.cond:
            self.due = None
            self.cond.notify_all()

    def between_steps(self) -> None:
        with self.cond:
            while self.due is not None and not self.ctx.stopping():
                self.cond.wait(0.1)

    def waiting(self) -> bool:
        with self.cond:
            return self.due is not None and not self.ctx.stopping()

    def receive(self, shard: int, pieces: List[torch.Tensor], params: Params) -> None:
        if not self.fresh(shard, params):
            return  # its join vectors already hold this outer step
        average = (self.flat(pieces), float(params.get("workers") or self.ctx.agents))
        if self.due is not None:
            self._step(self.due, average)
        else:
            self.averages.append(average)

    def joined(self, pieces, params: Params, state=None) -> None:
        super().joined(pieces, params, state)
        self.own_term, self.due = None, None
        self.averages.clear()


@register
class DelayedDiLoCo(Algorithm):
    """DiLoCo whose outer step is applied one round late (eager updates): agents never wait for the exchange."""

    name: Literal["delayed_diloco"] = "delayed_diloco"
    summary = "DiLoCo with the outer step one round late and eager local updates; agents never wait on the wire"
    waits_for_driver = True  # its agents pause for the driver's model (mpca.exchange.lock_step)
    every: int = Field(50, ge=1, description="H: inner steps per round")
    eager: bool = Field(True, description="eager updates (the agent's fresh outer gradient stands in for its "
                        "term of the late average) or the naive one-round delay")
    outer_lr: float = Field(0.35, gt=0.0, description="the outer step's learning rate: half DiLoCo's 0.7, because "
                            "each agent's own fresh outer gradient also passes through the outer momentum (measured: "
                            "docs/results/2026-11-29-rivals.md)")
    outer_momentum: float = Field(0.9, ge=0.0, lt=1.0)

    def agent_factory(self):
        return functools.partial(DelayedDiLoCoAgent, every=self.every, eager=self.eager, lr=self.outer_lr,
                                 momentum=self.outer_momentum)

    def driver_rule(self, joint, agents):
        return OuterDriver(joint, agents, self.outer_lr, self.outer_momentum)
