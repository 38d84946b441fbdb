"""Synchronous model averaging (SparkNet, §3.1): every H local steps the agents' models are averaged,
R = (1/K) Σ x_i, and the average replaces every local model; training pauses while the exchange runs."""
from __future__ import annotations

import functools
from typing import Literal

from pydantic import Field

from mpca.algorithm.base import Algorithm
from mpca.algorithm.registry import register
from mpca.algorithm.rounds import RoundAgent, RoundDriver
from mpca.algorithm.rules import finish_reduction


class SyncAgent(RoundAgent):
    def receive(self, shard, pieces, params):
        self.start_round(pieces, params)

    def contribution(self, shard, params):
        return self.ctx.shards.read(0), 1.0, self.round_report()  # weight 1 each: the arithmetic mean


class SyncDriver(RoundDriver):
    def on_reduced(self, cycle, shard, partial):
        return self.next_round(finish_reduction(partial, self.joint[0]))  # the average replaces x̃


@register
class Sync(Algorithm):
    """SparkNet: average every H local steps; agents wait for the average."""

    name: Literal["sync"] = "sync"
    summary = "average of all models every H local steps; agents wait for it"
    waits_for_driver = True  # its agents pause for the driver's model (mpca.exchange.lock_step)
    every: int = Field(50, ge=1, description="H: local steps per round")

    def agent_factory(self):
        return functools.partial(SyncAgent, every=self.every)

    def driver_rule(self, joint, agents):
        return SyncDriver(joint, agents)
