"""Per-step synchronous data parallelism (what TorchDistributor's DDP gives): after every backward pass the
agents average their gradients with an all-reduce (torch.distributed: gloo on the CPU, NCCL on GPUs), so
every replica takes the same optimizer step.  The driver arranges the rendezvous (a TCPStore it hosts)
and only observes the model; nothing else is exchanged through Spark.

With a lossy wire format (bf16, int8, int4) the gradients go round a ring of encoded messages with error
feedback instead (:mod:`mpca.algorithm.ring`, DDP's compression hook: 2 (K − 1) / K of the encoded gradient
per rank and step; every replica applies the same decoded bytes, so they stay identical); the stop flag then
travels in its own exact all-reduce of one value.

torch.distributed's store and collectives are not authenticated (as with TorchDistributor): run ``ddp``
on a network you trust.
"""
from __future__ import annotations

import collections
import datetime
import functools
from typing import Literal

import torch
from pydantic import Field

from mpca.algorithm.base import AgentRule, Algorithm
from mpca.algorithm.registry import register
from mpca.algorithm.ring import ring_all_reduce_
from mpca.algorithm.rounds import digest
from mpca.algorithm.single import ObservingDriver


class DDPAgent(AgentRule):
    """Joins the process group; averages gradients (plus a stop flag) with one all-reduce per step."""

    def __init__(self, ctx, timeout_s: float, verify_every: int):
        super().__init__(ctx)
        import torch.distributed as dist

        if ctx.rows == 0:
            raise ValueError(f"ddp needs rows on every agent; agent {ctx.agent_id} got an empty partition "
                             "(repartition the data or use fewer agents)")
        self.dist = dist
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(ctx.rendezvous["host"], int(ctx.rendezvous["port"]), None, False, timeout=timeout)
        prefixed = dist.PrefixStore(ctx.rendezvous["prefix"], store)
        backend = "nccl" if ctx.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=prefixed, rank=ctx.agent_id, world_size=ctx.agents, timeout=timeout)
        # a lossy wire format: the gradients go round mpca's ring of encoded messages (CPU tensors, hence a gloo
        # group beside an NCCL one), with this agent's error feedback
        self.feedback = ctx.wire if ctx.wire.codec.lossy else None
        self.ring_group = dist.new_group(backend="gloo") if self.feedback is not None and backend != "gloo" else None
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.verify_every = verify_every
        self.steps = 0
        self.wire_bytes = 0  # sent by a ring all-reduce: 2 (K − 1) / K of the gradient per step
        self.requested = False
        self.stop_all = False
        self.digests = collections.OrderedDict()

    def should_stop(self, requested: bool) -> bool:
        self.requested = self.requested or requested
        return self.stop_all  # every rank stops after the same step, so no all-reduce is left waiting

    def after_backward(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flag = torch.ones(1, device=self.ctx.device) if self.requested else torch.zeros(1, device=self.ctx.device)
        if self.feedback is None:
            flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads] + [flag])
            self.dist.all_reduce(flat)
            self.wire_bytes += int(flat.numel() * flat.element_size() * 2 * (self.ctx.agents - 1) / self.ctx.agents)
        else:
            self.dist.all_reduce(flag)  # exact: a quantised flag could round to 0 in a block of large gradients
            flat = torch.cat([g.detach().reshape(-1).to(torch.float32).cpu() for g in grads] + [flag.cpu()])
            self.wire_bytes += ring_all_reduce_(flat[:-1], self.ctx.agent_id, self.ctx.agents, self.feedback,
                                                self.dist, self.ring_group)
            flat = flat.to(self.ctx.device)
            flat[-1] = flag[0]
        flat /= self.ctx.agents
        off = 0
        for p, g in zip(self.params, grads):
            n = g.numel()
            p.grad = flat[off:off + n].view_as(g).to(g.dtype)
            off += n
        self.stop_all = bool(flat[-1] > 0)

    def after_step(self) -> None:
        self.steps += 1
        if self.verify_every and self.steps % self.verify_every == 0:
            self.digests[self.steps] = digest(self.ctx.shards.read(0))
            while len(self.digests) > 200:
                self.digests.popitem(last=False)

    def contribution(self, shard, params):
        return self.ctx.shards.read(0), 1.0, {"digests": {str(k): v for k, v in self.digests.items()},
                                              "wire_bytes": self.wire_bytes}

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class DDPDriver(ObservingDriver):
    def __init__(self, joint, agents, timeout_s: float):
        super().__init__(joint, agents)
        self.timeout_s = timeout_s
        self.store = None

    def rendezvous(self, host, port=0):
        import secrets

        import torch.distributed as dist

        self.store = dist.TCPStore(host, port, None, True, timeout=datetime.timedelta(seconds=self.timeout_s),
                                   wait_for_workers=False)
        return {"host": host, "port": self.store.port, "prefix": secrets.token_hex(8)}

    def close(self):
        self.store = None  # the store's server stops when the object goes


@register
class DDP(Algorithm):
    """Gradient averaging every step with torch.distributed inside the long-lived agent tasks."""

    name: Literal["ddp"] = "ddp"
    summary = "gradients all-reduced every step (torch.distributed); replicas stay identical"
    default_cycle_interval_s = 1.0  # the driver's snapshots of the model, for evaluation and checkpoints
    timeout_s: float = Field(120.0, gt=0.0, description="rendezvous and collective timeout")
    verify_every: int = Field(0, ge=0, description="record a fingerprint of the model every n steps (tests)")

    def agent_factory(self):
        return functools.partial(DDPAgent, timeout_s=self.timeout_s, verify_every=self.verify_every)

    def driver_rule(self, joint, agents):
        return DDPDriver(joint, agents, self.timeout_s)
