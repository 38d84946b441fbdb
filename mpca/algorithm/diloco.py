"""DiLoCo (Douillard et al. 2023): H inner steps, then an outer SGD step with Nesterov momentum on the
averaged pseudo-gradient Δ = mean_i(x̃ − x_i); the agents restart from the new joint model and keep their
inner optimizer's state."""
from __future__ import annotations

import functools
from typing import Literal

import torch
from pydantic import Field

from mpca.algorithm.base import Algorithm
from mpca.algorithm.registry import register
from mpca.algorithm.rounds import RoundAgent, RoundDriver
from mpca.algorithm.rules import finish_reduction, nesterov_outer_step


class DiLoCoAgent(RoundAgent):
    def __init__(self, ctx, every: int):
        super().__init__(ctx, every)
        self.round_start = ctx.shards.read(0)

    def receive(self, shard, pieces, params):
        if self.start_round(pieces, params):
            self.round_start = self.ctx.shards.read(0)

    def contribution(self, shard, params):
        pseudo_grad = self.round_start - self.ctx.shards.read(0)  # start of round minus local model
        return pseudo_grad, 1.0, self.round_report()


class DiLoCoDriver(RoundDriver):
    def __init__(self, joint, agents, lr: float, momentum: float):
        super().__init__(joint, agents)
        self.lr, self.momentum = lr, momentum
        self.momentum_buf = None

    def on_reduced(self, cycle, shard, partial):
        delta = finish_reduction(partial, torch.zeros_like(self.joint[0]))  # mean pseudo-gradient (0 if none)
        joint, self.momentum_buf = nesterov_outer_step(self.joint[0], delta, self.momentum_buf, self.lr, self.momentum)
        return self.next_round(joint)

    def state_dict(self):
        return {**super().state_dict(), "momentum_buf": self.momentum_buf}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.momentum_buf = state.get("momentum_buf")


@register
class DiLoCo(Algorithm):
    """DiLoCo: outer Nesterov SGD over averaged pseudo-gradients every H inner steps."""

    name: Literal["diloco"] = "diloco"
    summary = "outer Nesterov SGD on averaged pseudo-gradients every H inner steps; agents wait for it"
    waits_for_driver = True  # its agents pause for the driver's model (mpca.exchange.lock_step)
    every: int = Field(50, ge=1, description="H: inner steps per round")
    outer_lr: float = Field(0.7, gt=0.0)
    outer_momentum: float = Field(0.9, ge=0.0, lt=1.0)

    def agent_factory(self):
        return functools.partial(DiLoCoAgent, every=self.every)

    def driver_rule(self, joint, agents):
        return DiLoCoDriver(joint, agents, self.outer_lr, self.outer_momentum)
