"""Asynchronous EASGD (Zhang et al. 2015; §3.2 of the MPCA paper) through the driver's parameter service.

Every τ local steps an agent, on its own clock, sends x_i to the service; from the same x_i and x̃ the
service computes d = α (x_i − x̃), moves the centre x̃ ← x̃ + d (Eq. 3) and answers d, which the agent
applies as x_i ← x_i − d (Eq. 2).  α = 0.9 / K by default (elastic symmetry, §6.3).
"""
from __future__ import annotations

import collections
import functools
from typing import Literal, Optional

import torch
from pydantic import Field

from mpca.algorithm.base import DriverRule, ServiceAgent, ServiceAlgorithm
from mpca.algorithm.registry import register


class EASGDAgent(ServiceAgent):
    def __init__(self, ctx, every: int):
        super().__init__(ctx)
        self.every = every
        self.since = 0
        self.exchanges = 0

    def after_step(self) -> None:
        self.since += 1

    def hand_in(self) -> None:
        if self.since:
            self.since = self.every  # its last exchange, now
            self.between_steps()

    def between_steps(self) -> None:
        if self.since < self.every:
            return
        shards = self.ctx.shards
        with self.ctx.lock:
            x = shards.read(0)
        _, d = self.call_service("easgd", x)  # the training thread waits, as in EASGD
        with self.ctx.lock:
            torch._foreach_sub_(shards.views(0), shards.split(0, d))  # Eq. 2: x_i ← x_i − α (x_i − x̃)
        self.since = 0
        self.exchanges += 1


class EASGDDriver(DriverRule):
    """The centre x̃; each request moves it by α (x_i − x̃) (Eq. 3) and answers that difference.  ``alpha`` None:
    0.9 / K for the K agents present (elastic symmetry, §6.3), following the run's membership."""

    HISTORY = 100_000

    def __init__(self, joint, agents, alpha: Optional[float]):
        super().__init__(joint, agents)
        self.symmetric = alpha is None
        self.alpha = 0.9 / agents if alpha is None else alpha
        self.exchanges = 0
        self.history = collections.deque(maxlen=self.HISTORY)  # agent ids in the order they were served

    def serve(self, agent, header, payload):
        x = self.model_sized(header, payload, "easgd")
        with self.lock:
            d = (x - self.joint[0]) * self.alpha
            self.joint[0] = self.joint[0] + d  # Eq. 3
            self.exchanges += 1
            self.history.append(agent)
        return {"ok": True}, d

    def on_membership(self, agents):
        if self.symmetric:
            with self.lock:
                self.alpha = 0.9 / agents

    def metrics(self):
        return {"alpha": self.alpha}

    def state_dict(self):
        return {**super().state_dict(), "exchanges": self.exchanges}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.exchanges = int(state.get("exchanges", 0))


@register
class EASGD(ServiceAlgorithm):
    """Asynchronous EASGD through the driver's parameter service."""

    name: Literal["easgd"] = "easgd"
    summary = "every τ local steps each agent exchanges α(x_i − x̃) with the driver's parameter service"
    every: int = Field(10, ge=1, description="τ: local steps between an agent's exchanges")
    alpha: Optional[float] = Field(None, gt=0.0, le=1.0,
                                   description="elastic coefficient; default 0.9 / the agents present")

    def agent_factory(self):
        return functools.partial(EASGDAgent, every=self.every)

    def driver_rule(self, joint, agents):
        return EASGDDriver(joint, agents, self.alpha)
