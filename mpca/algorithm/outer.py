"""Outer steps taken on the agents: what Streaming DiLoCo and delayed-outer-step DiLoCo share.

In DiLoCo (Douillard et al. 2023) every worker computes the same outer step from the all-reduced outer
gradient.  On mpca's runtime the driver's treeReduce is the all-reduce: each agent yields its outer gradient
Δ_i = θ − x_i (θ: its copy of the global model, x_i: its local model), the driver averages them (Eq. 9 with
weight 1 each), takes the outer Nesterov step on its joint model (the model it evaluates, checkpoints and
hands to a replacement) and broadcasts the *average outer gradient* Δ̄, in the run's wire format (int4 is
Streaming DiLoCo's 4-bit exchange, with the driver's error feedback), not the new model: every agent decodes the
same bytes and takes the same outer step on its own copy of θ, as the paper's workers do.  With ``fp32`` the
agents' copies equal the driver's joint model bit for bit; with a lossy format they follow it within what the
error feedback carries over (a fraction of one quantisation step of Δ̄, times the outer step's gain).

A delivery carries the version of what it brings (``params["versions"]``: the driver's count of outer steps per
shard), so that a replacement whose join vectors already hold a step ignores its late delivery.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Dict, List, Optional

import torch

from mpca.algorithm.base import AgentContext, AgentRule, DriverRule, Params
from mpca.algorithm.rules import finish_reduction, nesterov_outer_step


class OuterDriver(DriverRule):
    """Per shard: Δ̄ = Σ Δ_i / n, the joint shard's outer Nesterov step (its own momentum per shard), Δ̄ broadcast
    by the next cycle's job (lag 1).  Cycle c reduces shard (c − c₀) mod S, c₀ the run's first cycle: the agents
    of a run resumed from a checkpoint start their schedule afresh, with shard 0."""

    deliver_before_yield = True  # an agent may wait for a delivery before it reaches its next sync step

    def __init__(self, joint: List[torch.Tensor], agents: int, lr: float, momentum: float):
        super().__init__(joint, agents)
        self.lr, self.momentum = lr, momentum
        self.momentum_bufs: List[Optional[torch.Tensor]] = [None] * len(joint)
        self.versions = [0] * len(joint)  # outer steps taken per shard
        self.workers = float(agents)  # contributors to the latest reduction (the M of eager updates)
        self.first_cycle: Optional[int] = None  # c₀: this run's first cycle (not checkpointed)

    def reduce_shard(self, cycle: int) -> int:
        if self.first_cycle is None:
            self.first_cycle = cycle
        return (cycle - self.first_cycle) % self.num_shards

    def stage_lag(self, first: bool = False) -> int:
        return 1  # staged as the job ends (a few vector operations), broadcast by the next job

    def cycle_params(self, cycle: int) -> Params:
        return {"fragment": self.reduce_shard(cycle), "versions": list(self.versions), "workers": self.workers}

    def on_reduced(self, cycle: int, shard: int, partial) -> torch.Tensor:
        mean = finish_reduction(partial, torch.zeros_like(self.joint[shard]))  # Δ̄ (0 when nobody contributed)
        if partial.total is not None and partial.weight > 0:
            self.workers = float(partial.weight)
        new, buf = nesterov_outer_step(self.joint[shard], mean, self.momentum_bufs[shard], self.lr, self.momentum)
        with self.lock:
            self.joint[shard], self.momentum_bufs[shard] = new, buf
            self.versions[shard] += 1
        return mean

    def join_state(self) -> List[torch.Tensor]:
        """The outer momentum per shard (zeros before the first step: the same next step as none), so that a
        replacement applies the next averages as the agents already there do.  Without it its copy θ would stay
        apart from theirs and the driver's by lr μ b / (1 − μ) — many rounds of progress — for the rest of the run."""
        with self.lock:
            return [torch.zeros_like(j) if b is None else b.clone() for j, b in zip(self.joint, self.momentum_bufs)]

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "momentum_bufs": list(self.momentum_bufs), "versions": list(self.versions)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.momentum_bufs = list(state.get("momentum_bufs") or [None] * len(self.joint))
        self.versions = [int(v) for v in state.get("versions") or [0] * len(self.joint)]


class OuterAgent(AgentRule):
    """An agent's copy θ of the global model (one flat vector per shard, on its device), its outer momentum per
    shard, the outer gradients it took and has not yielded yet (the oldest goes up first; at most ``queue`` per
    shard: an agent that may take the next one before the driver asks for this one keeps both), and the versions
    of the averages delivered."""

    def __init__(self, ctx: AgentContext, lr: float, momentum: float, queue: int = 1):
        super().__init__(ctx)
        S = ctx.shards.layout.num_shards
        self.lr, self.momentum = lr, momentum
        self.theta = [ctx.shards.read(s, ctx.device) for s in range(S)]
        self.momentum_bufs: List[Optional[torch.Tensor]] = [None] * S
        self.have: List[Optional[int]] = [None] * S  # the latest version delivered per shard (None: none yet)
        self.snapshots = [collections.deque(maxlen=queue) for _ in range(S)]  # outer gradients awaiting a yield
        self.steps = 0
        self.cond = threading.Condition()

    # -------------------------------------------------------------- helpers
    def outer_gradient(self, shard: int) -> torch.Tensor:
        """Δ = θ − x for ``shard`` (on the agent's device)."""
        return self.theta[shard] - self.ctx.shards.read(shard, self.ctx.device)

    def take_snapshot(self, shard: int, delta: torch.Tensor) -> None:
        with self.cond:
            self.snapshots[shard].append(delta.cpu())
            self.cond.notify_all()

    def outer_step(self, shard: int, grad: torch.Tensor) -> torch.Tensor:
        """θ ← θ − lr (Δ + μ b) with b ← μ b + Δ (DiLoCo's outer Nesterov step, on this agent's copy)."""
        self.theta[shard], self.momentum_bufs[shard] = nesterov_outer_step(
            self.theta[shard], grad.to(self.theta[shard].device), self.momentum_bufs[shard], self.lr, self.momentum)
        return self.theta[shard]

    def fresh(self, shard: int, params: Params) -> bool:
        """Whether a delivery of ``shard`` brings a version this agent's θ does not hold yet (and note it)."""
        versions = params.get("versions")
        if versions is None:
            return True
        v = int(versions[shard])
        if self.have[shard] is not None and v <= self.have[shard]:
            return False
        self.have[shard] = v
        return True

    def flat(self, pieces: List[torch.Tensor]) -> torch.Tensor:
        wire = self.ctx.shards.layout.wire_dtype
        return torch.cat([p.reshape(-1).to(device=self.ctx.device, dtype=wire) for p in pieces])

    # -------------------------------------------------------------- seam
    def joined(self, pieces: List[List[torch.Tensor]], params: Params, state: Optional[torch.Tensor] = None) -> None:
        """A replacement: θ is the joint model it was handed (which holds ``params["versions"]``), its outer
        momentum the driver's (``state``: :meth:`OuterDriver.join_state`; none where it was not sent)."""
        versions = params.get("versions") or [None] * len(pieces)
        sizes = [self.ctx.shards.layout.shard_numel(s) for s in range(len(pieces))]
        bufs: List[Optional[torch.Tensor]] = [None] * len(pieces)
        if state is not None and state.numel():
            if state.numel() != sum(sizes):
                raise ValueError(f"join state has {state.numel()} values, the outer momentum {sum(sizes)}")
            bufs = list(torch.split(state.to(self.ctx.device), sizes))
        with self.cond:
            for s, p in enumerate(pieces):
                self.theta[s] = self.flat(p)
                self.momentum_bufs[s] = None if bufs[s] is None else bufs[s].to(self.theta[s].dtype).clone()
                self.have[s] = None if versions[s] is None else int(versions[s])
                self.snapshots[s].clear()
            self.cond.notify_all()

    def reset_target(self, shard: int, pieces: List[torch.Tensor]) -> List[torch.Tensor]:
        return self.ctx.shards.split(shard, self.theta[shard].clone())  # θ, not the outer gradient just received

    def yield_ready(self, shard: int, params: Params, timeout_s: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: bool(self.snapshots[shard]), timeout_s):
                raise TimeoutError(f"agent {self.ctx.agent_id} has no outer gradient of shard {shard} after "
                                   f"{timeout_s:.0f}s (step {self.steps})")

    def contribution(self, shard: int, params: Params):
        with self.cond:
            snap = self.snapshots[shard].popleft() if self.snapshots[shard] else None
        if snap is None:  # nothing taken since the last yield (a second request of the same cycle)
            return torch.zeros(self.ctx.shards.layout.shard_numel(shard), dtype=self.ctx.shards.layout.wire_dtype), \
                0.0, {}
        return snap, 1.0, {"steps": self.steps}

    def contribution_lost(self, shard: int, extra: Dict[str, Any]) -> None:
        """A lost outer gradient is not sent again: the next one, taken against the θ that includes everyone
        else's average, carries this agent's progress (as a worker that missed an all-reduce)."""

    def handed_in(self, shard: int, params: Params):
        return None  # a leaving agent's unfinished period is not an outer gradient of any round
