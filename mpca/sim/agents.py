"""A simulated agent: its own model copy, optimizer, rows and batch order, and the library's agent rule built
by the algorithm's factory with a real :class:`~mpca.algorithm.base.AgentContext`.  :meth:`SimAgent.step` calls
the rule's hooks in the order the runtime's training loop calls them (``mpca/runtime/agent.py``): before_step,
zero_grad, forward and backward, after_backward, the optimizer's step, after_step; between_steps is the
simulator's to call, after the step's device time."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

import torch

from mpca.algorithm.base import AgentContext, AgentRule, Algorithm
from mpca.algorithm.sharding import ShardLayout
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.exchange.agent_step import BatchOrder, batch_seed, finite, forward_backward, optimizer_step, wire_bytes
from mpca.exchange.lock_step import LockStep


class SimAgent:
    """One agent of the simulation (see the module doc); ``service``: its simulated service client or None;
    ``lock_step``: its windows of that many steps per cycle (``training.lock_step``), or None; ``collective``:
    its handle on the agents' transport (ddp's, :mod:`mpca.sim.collective`), or None."""

    def __init__(self, agent_id: int, agents: int, algorithm: Algorithm, layout: ShardLayout,
                 init_state: Dict[str, torch.Tensor], model_fn: Callable[[], torch.nn.Module], loss_fn,
                 optimizer_fn, features: torch.Tensor, labels: torch.Tensor, batch_size: int, codec: Codec,
                 seed: int = 0, service: Any = None, lock_step: Optional[int] = None, collective: Any = None):
        self.id = agent_id
        torch.manual_seed(seed + 1000 * agent_id)  # as the runtime's agent
        self.model = model_fn()
        self.model.load_state_dict(init_state, strict=True)
        self.model.train()
        self.loss_fn = loss_fn
        self.optimizer = optimizer_fn(self.model.parameters())
        self.shards = layout.bind_module(self.model, algorithm.buffers)
        self.features, self.labels = features, labels
        self.batches = BatchOrder(int(features.shape[0]), batch_size, batch_seed(seed, agent_id))
        self.codec = codec
        self.feedback = ErrorFeedback(codec)  # its contributions' residuals (lossy formats), as the runtime's
        self.steps = 0
        self.samples = 0
        self.last_loss = float("nan")
        self.stopping = False
        self.service = service
        self.pace = LockStep(lock_step) if lock_step else None
        ctx = AgentContext(agent_id=agent_id, agents=agents, model=self.model, optimizer=self.optimizer,
                           shards=self.shards, device=torch.device("cpu"), rows=int(features.shape[0]),
                           service=service, lock=threading.Lock(), stats=self.counters,
                           stopping=lambda: self.stopping, wire=ErrorFeedback(codec), collective=collective)
        self.rule: AgentRule = algorithm.agent_factory()(ctx)

    def counters(self) -> Dict[str, Any]:
        return {"steps": self.steps, "samples": self.samples, "loss": self.last_loss}

    def step(self) -> None:
        """One training step, the hooks in the runtime's order."""
        batch = self.compute_gradients()
        self.rule.after_backward()
        self.apply_step(batch)

    def compute_gradients(self) -> tuple:
        """before_step, zero_grad, forward and backward on the next batch; (batch size, loss)."""
        idx = self.batches.next()
        x, y = self.features[idx], self.labels[idx]
        return int(x.shape[0]), forward_backward(self.rule, self.model, self.optimizer, self.loss_fn, x, y)

    def apply_step(self, batch: tuple) -> None:
        """The optimizer's step, after_step, the counters."""
        size, loss = batch
        optimizer_step(self.rule, self.optimizer)
        self.steps += 1
        self.samples += size
        if self.steps % 10 == 0:
            self.last_loss = float(loss.detach())

    def contribution_bytes(self, shard: int, params: dict) -> Optional[tuple]:
        """The rule's contribution as it goes on the wire: (payload bytes, weight, extra); a non-finite vector
        goes up with weight 0, as the runtime's agent sends it."""
        vec, weight, extra = self.rule.contribution(shard, params)
        vec, weight, _ = finite(vec, weight)
        return wire_bytes(self.feedback, shard, vec, weight), weight, extra
