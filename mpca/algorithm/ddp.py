"""Per-step synchronous data parallelism (what TorchDistributor's DDP gives): after every backward pass the
agents average their gradients with an all-reduce (torch.distributed: gloo on the CPU, NCCL on GPUs), so
every replica takes the same optimizer step.  The driver arranges the rendezvous (a TCPStore it hosts)
and only observes the model; nothing else is exchanged through Spark.  The agents reach the store and each
other through the transport their runner provides (:mod:`mpca.algorithm.collective`): torch.distributed on
Spark, the K agents met in one process in the simulator.

With a lossy wire format (bf16, int8, int4) the gradients go round a ring of encoded messages with error
feedback instead (:mod:`mpca.algorithm.ring`, DDP's compression hook: 2 (K − 1) / K of the encoded gradient
per rank and step; every replica applies the same decoded bytes, so they stay identical); the two flags (stop,
re-form) then travel in their own exact all-reduce.

Agents come and go (:mod:`mpca.algorithm.membership`): a lost rank makes the others' all-reduce fail and they
re-form the process group without it; Spark's retried task (a replacement) asks to join and the members
re-form with it; each new group starts from one member's model and optimizer state, so the replicas are
identical again without a checkpoint.

torch.distributed's store and collectives are not authenticated (as with TorchDistributor): run ``ddp``
on a network you trust.
"""
from __future__ import annotations

import collections
import datetime
import functools
import json
import logging
import time
from typing import Literal, Optional

import torch
from pydantic import Field

from mpca.algorithm.base import AgentRule, Algorithm
from mpca.algorithm.collective import Collective
from mpca.algorithm.membership import Generation, Membership, first_generation
from mpca.algorithm.registry import register
from mpca.algorithm.rounds import digest
from mpca.algorithm.single import ObservingDriver
from mpca.algorithm.wire import ErrorFeedback

log = logging.getLogger("mpca.ddp")


class DDPAgent(AgentRule):
    """Joins the process group; averages gradients (plus two flags: stop, re-form) with one all-reduce per step.

    When agents come and go the group re-forms (:mod:`mpca.algorithm.membership`): a collective that raises
    (a rank's executor lost) or the agreed flag that a newcomer waits (Spark's retried task) sends every member
    to the next generation between two steps; the new group starts from the source member's model and
    optimizer state, broadcast over its own collectives, so the replicas are identical again — no checkpoint.
    The step whose all-reduce failed is not taken (its gradients are dropped)."""

    POLL_JOINS_S = 1.0  # how often a member looks for newcomers (one store round trip)

    def __init__(self, ctx, timeout_s: float, verify_every: int, settle_s: float = 2.0):
        super().__init__(ctx)
        if ctx.rows == 0:
            raise ValueError(f"ddp needs rows on every agent; agent {ctx.agent_id} got an empty partition "
                             "(repartition the data or use fewer agents)")
        if ctx.collective is None:
            raise ValueError("ddp needs the transport among its agents: AgentContext.collective "
                             "(mpca.algorithm.collective) was not given")
        self.group: Collective = ctx.collective
        self.store = self.group.store(timeout_s)
        self.membership = Membership(prefixed("members", self.store), ctx.agent_id,
                                     ctx.agents, settle_s=settle_s, timeout_s=timeout_s, stopping=ctx.stopping)
        self.backend = "gloo"  # decided per generation by the transport (from the members' devices)
        self.codec = ctx.wire.codec
        self.feedback = None  # a lossy wire format's error feedback, per generation (its chunks are the world's)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.verify_every = verify_every
        self.steps = 0
        self.wire_bytes = 0  # sent by a ring all-reduce: 2 (K − 1) / K of the gradient per step
        self.requested = False
        self.stop_all = False
        self.digests = collections.OrderedDict()
        self.generation: Optional[Generation] = None
        self.reform: Optional[str] = None  # why this agent must re-form before its next step: lost, join, newcomer
        self.regroups = 0
        self._joins_polled = 0.0
        start = ctx.start_agents or ctx.agents
        if not self.membership.arrive(start):  # a replacement, or late: it enters the members' next generation
            self.reform = "newcomer"
        elif start == ctx.agents:
            self._form(first_generation(ctx.agents))
        else:  # an elastic start: generation 1 is whoever is up first (at least `start` of them)
            self.reform = "start"
            self.start_agents = start

    # ---------------------------------------------------------------- the group
    def _form(self, gen: Generation) -> None:
        # a lossy wire format: the gradients go round mpca's ring of encoded messages, with this agent's error
        # feedback (fresh: the chunks follow the world size)
        self.feedback = ErrorFeedback(self.codec) if self.codec.lossy else None
        self.backend = self.group.form(prefixed(f"g{gen.number}", self.store), gen.rank(self.ctx.agent_id),
                                       gen.world, self.ctx.device, lossy=self.feedback is not None)
        if gen.number > 0:
            adopt_state(self.group, self.ctx.model, self.ctx.optimizer, gen.rank(gen.source), self.ctx.device)
            self.steps = gen.steps
        self.generation = gen
        self.reform = None

    def _leave(self) -> None:
        self.generation = None
        self.group.leave()

    def between_steps(self) -> None:
        if self.reform is None or self.stop_all:
            return
        old, why = self.generation, self.reform
        self._leave()
        if why == "newcomer":
            gen = self.membership.join()
        elif why == "start":
            gen = self.membership.next(0, 0, expected=self.start_agents)
        else:  # a join brings the newcomers counted since the last generation; a loss: whoever is left
            expected = old.world + self.membership.joins() - old.joins if why == "join" and old else None
            gen = self.membership.next(old.number if old else self.membership.latest(), self.steps, expected)
        if gen is None:  # the driver asked to stop meanwhile
            self.stop_all = True
            return
        self._form(gen)
        self.regroups += 1
        log.warning("ddp: agent %s in generation %d (%s): members %s, from agent %s's replica at step %d",
                    self.ctx.agent_id, gen.number, why, list(gen.members), gen.source, gen.steps)

    def _joins_waiting(self) -> bool:
        now = time.monotonic()
        if now - self._joins_polled < self.POLL_JOINS_S:
            return False
        self._joins_polled = now
        return self.membership.joins() > self.generation.joins

    # ---------------------------------------------------------------- every step
    def should_stop(self, requested: bool) -> bool:
        self.requested = self.requested or requested
        return self.stop_all  # every rank stops after the same step, so no all-reduce is left waiting

    def after_backward(self) -> None:
        if self.generation is None or self.reform is not None:  # between groups: no step without the others
            for p in self.params:
                p.grad = None
            return
        gen = self.generation
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flags = torch.tensor([float(self.requested), float(self._joins_waiting())], device=self.ctx.device)
        try:
            if self.feedback is None:
                flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads] + [flags])
                self.group.all_reduce_(flat)
                self.wire_bytes += int(flat.numel() * flat.element_size() * 2 * (gen.world - 1) / gen.world)
                flags = flat[-2:]
                flat = flat[:-2]
            else:
                self.group.all_reduce_(flags)  # exact: a quantised flag could round to 0 among large gradients
                flat = torch.cat([g.detach().reshape(-1).to(torch.float32).cpu() for g in grads])
                self.wire_bytes += self.group.ring_all_reduce_(flat, self.feedback)
                flat = flat.to(self.ctx.device)
        except RuntimeError as e:  # a rank is gone (its connection closed) or silent past the timeout
            log.warning("ddp: agent %s: the all-reduce of generation %d failed (%s); re-forming the group with the "
                        "agents left", self.ctx.agent_id, gen.number, str(e).splitlines()[0][:200])
            self.reform = "lost"
            for p in self.params:
                p.grad = None
            return
        flat /= gen.world
        off = 0
        for p, g in zip(self.params, grads):
            n = g.numel()
            p.grad = flat[off:off + n].view_as(g).to(g.dtype)
            off += n
        self.stop_all = bool(flags[0] > 0)
        if flags[1] > 0 and not self.stop_all:
            self.reform = "join"  # every rank saw the same sum: all re-form after this step

    def after_step(self) -> None:
        if self.generation is None:
            return  # the step was not taken with the others
        self.steps += 1
        if self.verify_every and self.steps % self.verify_every == 0:
            self.digests[self.steps] = digest(self.ctx.shards.read(0))
            while len(self.digests) > 200:
                self.digests.popitem(last=False)

    def contribution(self, shard, params):
        gen = self.generation
        return self.ctx.shards.read(0), 1.0, {"digests": {str(k): v for k, v in self.digests.items()},
                                              "wire_bytes": self.wire_bytes, "regroups": self.regroups,
                                              "generation": gen.number if gen else None,
                                              "members": list(gen.members) if gen else []}

    def handed_in(self, shard, params):
        return None  # the replicas are identical: the ranks that stay hold what it has

    def close(self) -> None:
        self._leave()


def prefixed(prefix: str, store):
    """``store``'s keys under ``prefix/`` (torch.distributed's PrefixStore, over any of its stores)."""
    from torch.distributed import PrefixStore

    return PrefixStore(prefix, store)


def adopt_state(group: Collective, model: torch.nn.Module, optimizer: torch.optim.Optimizer, src: int,
                device) -> None:
    """Every rank of the (new) group takes rank ``src``'s model (parameters and buffers) and optimizer state,
    over the group's own broadcasts: tensors as tensors, the optimizer's layout as JSON bytes — nothing is
    unpickled."""
    me = group.rank
    broadcast_tensors(group, list(model.state_dict().values()), src)
    meta, tensors = (optimizer_layout(optimizer) if me == src else (None, []))
    meta = broadcast_json(group, meta, src, device)
    if me != src:
        tensors = [torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                   for _, _, dtype, shape in meta["tensors"]]
    broadcast_tensors(group, tensors, src)
    if me != src:
        optimizer.load_state_dict(optimizer_state(meta, tensors))


def optimizer_layout(optimizer: torch.optim.Optimizer):
    """The optimizer's state as (JSON-able layout, its tensors in layout order)."""
    sd = optimizer.state_dict()
    layout, tensors, scalars = [], [], []
    for index, entry in sorted(sd["state"].items()):
        for key, value in sorted(entry.items()):
            if torch.is_tensor(value):
                layout.append([index, key, str(value.dtype).replace("torch.", ""), list(value.shape)])
                tensors.append(value)
            else:
                scalars.append([index, key, value])
    return {"groups": sd["param_groups"], "tensors": layout, "scalars": scalars}, tensors


def optimizer_state(meta, tensors) -> dict:
    """The optimizer ``state_dict`` that :func:`optimizer_layout` described."""
    state: dict = {}
    for (index, key, _, _), t in zip(meta["tensors"], tensors):
        state.setdefault(int(index), {})[key] = t
    for index, key, value in meta["scalars"]:
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": meta["groups"]}


def broadcast_tensors(group: Collective, tensors, src: int) -> None:
    """Broadcast ``tensors`` from ``src`` in place: one flat message per dtype and device."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for (dtype, device), ts in sorted(groups.items(), key=lambda kv: str(kv[0])):
        flat = torch.cat([t.detach().reshape(-1) for t in ts]) if ts else torch.empty(0, dtype=dtype, device=device)
        group.broadcast_(flat, src)
        off = 0
        with torch.no_grad():
            for t in ts:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()


def broadcast_json(group: Collective, value, src: int, device):
    """A JSON value from ``src`` to every rank (its length, then its UTF-8 bytes, as tensors)."""
    data = json.dumps(value).encode() if group.rank == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    group.broadcast_(size, src)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else \
        torch.empty(int(size), dtype=torch.uint8, device=device)
    group.broadcast_(buf, src)
    return json.loads(bytes(buf.cpu().numpy()).decode())


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
    rebuilds_initial_model = False  # every rank's first all-reduce needs the others: none can wait for a join
    scored_model = "agent"  # the replicas are identical
    collective = True
    timeout_s: float = Field(120.0, gt=0.0, description="rendezvous and collective timeout")
    verify_every: int = Field(0, ge=0, description="record a fingerprint of the model every n steps (tests)")
    regroup_settle_s: float = Field(2.0, gt=0.0, description="after a lost rank: how long the survivors' ready set "
                                    "must stay unchanged before they re-form the group without it")

    def agent_factory(self):
        return functools.partial(DDPAgent, timeout_s=self.timeout_s, verify_every=self.verify_every,
                                 settle_s=self.regroup_settle_s)

    def driver_rule(self, joint, agents):
        return DDPDriver(joint, agents, self.timeout_s)
