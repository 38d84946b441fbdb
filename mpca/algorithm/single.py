"""One agent and no exchange: the denominator of every speed-up.  The driver only observes the agent's
model (a snapshot per cycle, for evaluation and checkpoints); nothing is ever sent back."""
from __future__ import annotations

from typing import Literal

from mpca.algorithm.base import AgentRule, Algorithm, DriverRule
from mpca.algorithm.registry import register
from mpca.algorithm.rules import finish_reduction


class ObservingDriver(DriverRule):
    """Keeps the (weighted) mean of the agents' models as the joint model and broadcasts nothing."""

    def on_reduced(self, cycle, shard, partial):
        with self.lock:
            self.joint[shard] = finish_reduction(partial, self.joint[shard])
        return None


@register
class Single(Algorithm):
    """A single agent training alone."""

    name: Literal["single"] = "single"
    summary = "one agent, no exchange (the driver only observes its model)"
    default_cycle_interval_s = 1.0  # the driver's snapshots of the model, for evaluation and checkpoints
    scored_model = "agent"  # its own model, not the driver's snapshot of it

    def check_agents(self, agents):
        if agents != 1:
            raise ValueError(f"algorithm 'single' trains one agent, got agents={agents}: set agents to 1")

    def agent_factory(self):
        return AgentRule

    def driver_rule(self, joint, agents):
        return ObservingDriver(joint, agents)
