"""Synchronous rounds, shared by SparkNet-style averaging and DiLoCo: H local steps, then the agent waits.

An agent trains ``every`` local steps, then pauses until the driver's next joint model arrives (the
training pause of the synchronous approach, §3.1, Figs. 1 and 5).  The driver's cycle ``c`` collects
round ``r`` (the ``round`` parameter sent with the cycle): an agent yields only when it has finished
round ``r``, and a delivery starts round ``r + 1`` from the delivered model.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Any, Dict, List

import torch

from mpca.algorithm.base import AgentContext, AgentRule, DriverRule, Params


def digest(vec: torch.Tensor) -> str:
    """A short fingerprint of a vector's exact bits (replicas that match bit for bit match here)."""
    return hashlib.sha1(vec.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


class RoundAgent(AgentRule):
    """Counts the steps of the current round and pauses the training loop when the round is complete."""

    def __init__(self, ctx: AgentContext, every: int):
        super().__init__(ctx)
        if ctx.shards.layout.num_shards != 1:
            raise ValueError("synchronous rounds exchange the whole model: use one shard")
        self.every = every
        self.round = 0
        self.round_steps = 0
        self.start_digest = digest(ctx.shards.read(0))
        self.yielded = -1  # the latest round whose contribution an exchange took
        self.cond = threading.Condition()

    def _round_done(self) -> bool:
        return self.round_steps >= self.every

    def after_step(self) -> None:
        with self.cond:
            self.round_steps += 1
            if self._round_done():
                self.cond.notify_all()

    def between_steps(self) -> None:
        with self.cond:  # paused until the next round's model arrives (or the driver stops us)
            while self._round_done() and not self.ctx.stopping():
                self.cond.wait(0.1)

    def waiting(self) -> bool:
        """The round is complete: :meth:`between_steps` would wait for the next round's model."""
        with self.cond:
            return self._round_done() and not self.ctx.stopping()

    def yield_ready(self, shard: int, params: Params, timeout_s: float) -> None:
        want = int(params["round"])
        with self.cond:
            if not self.cond.wait_for(lambda: self.round == want and self._round_done(), timeout_s):
                raise TimeoutError(f"agent {self.ctx.agent_id} did not finish round {want} within {timeout_s:.0f}s "
                                   f"(it is in round {self.round} after {self.round_steps} of {self.every} steps)")
            self.yielded = want

    def handed_in(self, shard: int, params: Params):
        """Leaving mid-round: its round so far (the driver's next reduction is this round's); nothing when it made
        no step in it or the round's contribution was already taken."""
        with self.cond:
            if self.round_steps == 0 or self.yielded == self.round:
                return None
        return self.contribution(shard, params)

    def round_report(self) -> Dict[str, Any]:
        return {"round": self.round, "start_digest": self.start_digest, "round_steps": self.round_steps}

    def start_round(self, pieces: List[torch.Tensor], params: Params) -> bool:
        """Replace the local model by the delivered joint model and start the round it begins (``params``'
        ``round``, the driver's count, not this agent's: a replacement that joins mid-run enters the current
        round).  A delivery of the round the agent is already in (the same model its join handed it) is
        ignored, so the steps made since count; returns whether a round started."""
        round_ = int(params["round"])
        if round_ == self.round:
            return False
        torch._foreach_copy_(self.ctx.shards.views(0), pieces)
        with self.cond:
            self.round = round_
            self.round_steps = 0
            self.start_digest = digest(self.ctx.shards.read(0))
            self.cond.notify_all()
        return True


class RoundDriver(DriverRule):
    """Numbers the rounds: the cycle after ``n`` reductions of this run collects round ``n``."""

    deliver_before_yield = True  # where task slots are scarce, the agent must get its model before it can yield

    def __init__(self, joint: List[torch.Tensor], agents: int):
        super().__init__(joint, agents)
        if len(joint) != 1:
            raise ValueError("synchronous rounds exchange the whole model: use one shard")
        self.rounds = 0  # not checkpointed: restarted agents start again at round 0

    def cycle_params(self, cycle: int) -> Params:
        return {"round": self.rounds}

    def takes_hand_in(self, shard: int, extra: Dict[str, Any]) -> bool:
        """Only into the reduction of the round it was made in (a later round's average must not take a
        model, or a pseudo-gradient, of an earlier one)."""
        return int(extra.get("round", -1)) == self.rounds

    def next_round(self, joint: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.joint[0] = joint
            self.rounds += 1
        return joint
