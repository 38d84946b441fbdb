"""Weak synchronization: Partially Synchronous Parallelism SGD (PSP-SGD, ../shared/seeds/weak-sync-ps-sgd.txt,
Algorithm 1) on the driver's parameter service, each worker on its own clock.

The server keeps the model in P parameter blocks, each with its own timestamp tᵢ (the paper's one server
per block).  A worker computes one mini-batch gradient on the blocks it holds, pushes every block with the
timestamp of the block value it used, and pulls:

* **partial push** (server, lines 4–14): a gradient block with t′ < tᵢ is stale — dropped and counted;
  otherwise it is summed into gᵢ and d ← d + 1.  Block i's iteration ends when all k workers have pushed,
  or τ1 (``push_timeout_s``) after the c-th gradient arrived (τ1 = 0: at the c-th); then
  wᵢ ← wᵢ − d·η·(gᵢ / d) (line 13, the linear scaling rule with plain SGD as the updater) and tᵢ ← tᵢ + 1.
* **partial pull** (worker, lines 8–15): the worker waits until ⌈b·P⌉ blocks (``pull_fraction`` b) are newer
  than the ones it holds, then up to τ2 (``pull_timeout_s``) more for the rest (τ2 = 0: not at all), or
  until every block is newer; it takes the newer blocks and keeps its last values for the others.

With c = k, b = 1 and τ1 = τ2 = 0 every iteration waits for everyone, and the trajectory is synchronous SGD
with the summed gradient, w ← w − η·Σⱼ gⱼ (the paper's learning rate scales with d).

Where this differs from the letter of Algorithm 1, and why:

* Workers start from the server's w⁰ (the runtime ships the joint model to every agent), not w⁰ ← 0.
* A worker's timestamp is kept **per block**: the timestamp of the block value it holds.  Algorithm 1's
  worker increments one t per iteration whatever it received, so under partial push a worker that fell
  behind would stay behind for ever and every one of its gradients would be dropped; here it catches up
  at its next pull.  In the synchronous case both are the same.
* One round trip carries the push and the pull (the reply is the pull), and the server answers with only
  the blocks newer than the worker's (the paper's communication saving).
* Timeouts are applied when a request arrives or a waiting pull wakes up, not by a timer: nobody needs a
  block update before someone asks for it.
* Slow servers (the paper's §4.2 simulation: 0.16% of pull responses delayed 4 s) are emulated with
  ``emulate_delay_fraction`` / ``emulate_delay_s``: that fraction of block updates becomes visible to pulls
  only after the delay (for benchmarks; 0 by default).

Server state: the P blocks and their sums, counters and timestamps (one model and one gradient
accumulator in all), plus the last 100,000 block iterations in ``history`` — bounded, whatever the run's length.
"""
from __future__ import annotations

import collections
import math
import random
import threading
import time
from typing import Dict, List, Literal, Optional, Tuple

import numpy as np
import torch
from pydantic import Field, model_validator

from mpca.algorithm.base import DriverRule, GradientPusher, RunningMean, ServiceAlgorithm
from mpca.algorithm.registry import register

MAX_BLOCKS = 256  # the block timestamps travel in the JSON header


def block_bounds(numel: int, blocks: int) -> List[Tuple[int, int]]:
    """``blocks`` contiguous [lo, hi) ranges covering ``numel`` values, sizes differing by at most one."""
    if blocks < 1 or blocks > numel:
        raise ValueError(f"cannot cut {numel} values into {blocks} blocks")
    edges = np.linspace(0, numel, blocks + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


class WeakSyncWorker(GradientPusher):
    """After each backward pass: push the gradient's blocks with the timestamps of the blocks used, pull the
    newer blocks (partial pull); after the local optimizer's step, put back the blocks held."""

    def __init__(self, ctx, blocks: int):
        super().__init__(ctx)
        with ctx.lock:
            self.held = ctx.shards.read(0)  # the server's w⁰: the runtime starts every agent from the joint model
        self.bounds = block_bounds(self.held.numel(), blocks)
        self.have: Optional[List[int]] = None  # the timestamp of each block held (None: those of the model it was
        # started or reset from — the server's at that moment, also after a resume or a rejoin)

    def after_backward(self) -> None:
        reply, values = self.call_service("push", self.gradient(), ts=self.have)
        if self.have is None:
            self.have = list(reply["base"])
        at = 0
        for i, ts in zip(reply["blocks"], reply["ts"]):
            lo, hi = self.bounds[i]
            self.held[lo:hi] = values[at:at + hi - lo]
            self.have[i] = int(ts)
            at += hi - lo

    def after_step(self) -> None:
        self.ctx.shards.write(0, self.held)  # the server's blocks (new or kept) replace the local step

    def on_reset(self) -> None:
        self.held = self.ctx.shards.read(0)  # the latest joint model
        self.have = None


class BlockServer(DriverRule):
    """The P parameter blocks of PSP-SGD's servers (see the module doc)."""

    HISTORY = 100_000

    def __init__(self, joint, agents: int, blocks: int, c: int, pull_fraction: float, push_timeout_s: float,
                 pull_timeout_s: float, lr: float, delay_fraction: float = 0.0, delay_s: float = 0.0,
                 seed: int = 0, timeout_s: float = 55.0):
        super().__init__(joint, agents)
        if not 1 <= c <= agents:
            raise ValueError(f"c (gradients per iteration) must be within 1..{agents} (the agents), got {c}")
        self.bounds = block_bounds(self.joint[0].numel(), blocks)
        self.c, self.tau1, self.tau2, self.lr = c, push_timeout_s, pull_timeout_s, lr
        self.need = max(1, math.ceil(pull_fraction * blocks - 1e-9))  # blocks a pull waits for
        self.ts = [0] * blocks
        self.sums = torch.zeros_like(self.joint[0])
        self.d = [0] * blocks
        self.deadline: List[Optional[float]] = [None] * blocks  # τ1 after the c-th gradient
        self.visible_at = [0.0] * blocks  # emulated slow servers: when block i's latest update may be pulled
        self.delay_fraction, self.delay_s, self.rng = delay_fraction, delay_s, random.Random(seed)
        self.timeout_s = timeout_s  # a pull never waits longer (below the client's 60 s)
        self.cond = threading.Condition(self.lock)
        self.stopping = False
        self.dropped = 0
        self.history = collections.deque(maxlen=self.HISTORY)  # (block, its new timestamp, d)
        self._d = RunningMean()
        self._dropped_seen = 0

    def _update(self, i: int, now: float) -> None:
        """Line 13: wᵢ ← wᵢ − d·η·(gᵢ/d) = wᵢ − η·gᵢ, and a new timestamp (lock held)."""
        lo, hi = self.bounds[i]
        w = self.joint[0]
        w[lo:hi] -= self.lr * self.sums[lo:hi]
        self.sums[lo:hi] = 0.0
        self.ts[i] += 1
        self.history.append((i, self.ts[i], self.d[i]))
        self._d.add(self.d[i])
        self.d[i], self.deadline[i] = 0, None
        delayed = self.delay_fraction > 0 and self.rng.random() < self.delay_fraction
        self.visible_at[i] = now + (self.delay_s if delayed else 0.0)
        self.cond.notify_all()

    def _expire(self, now: float) -> None:
        for i, dl in enumerate(self.deadline):
            if dl is not None and now >= dl:
                self._update(i, now)

    def _push(self, used: List[int], grad: torch.Tensor, now: float) -> None:
        for i, (lo, hi) in enumerate(self.bounds):
            if used[i] < self.ts[i]:
                self.dropped += 1  # lines 7–8: a stale gradient block
                continue
            self.sums[lo:hi] += grad[lo:hi]
            self.d[i] += 1
            if self.d[i] >= self.agents or (self.d[i] >= self.c and self.tau1 <= 0):
                self._update(i, now)
            elif self.d[i] >= self.c and self.deadline[i] is None:
                self.deadline[i] = now + self.tau1

    def _newer(self, have: List[int], now: float) -> List[int]:
        return [i for i in range(len(self.bounds)) if self.ts[i] > have[i] and self.visible_at[i] <= now]

    def _next_event(self, now: float) -> float:
        times = [t for t in self.deadline if t is not None] + [t for t in self.visible_at if t > now]
        return min(times) - now if times else float("inf")

    def _pull(self, have: List[int], start: float) -> List[int]:
        """Lines 8–15: wait for ⌈b·P⌉ newer blocks, then up to τ2 for all of them (lock held)."""
        enough_at = None
        while True:
            now = time.monotonic()
            self._expire(now)
            newer = self._newer(have, now)
            if len(newer) == len(self.bounds) or self.stopping:
                return newer
            if len(newer) >= self.need:
                enough_at = now if enough_at is None else enough_at
                if now >= enough_at + self.tau2:
                    return newer
                wait = enough_at + self.tau2 - now
            else:
                wait = start + self.timeout_s - now
                if wait <= 0:
                    raise TimeoutError(f"weaksync: {self.need} newer blocks did not come within {self.timeout_s:.0f}s "
                                       f"(c = {self.c} of {self.agents} agents: is an agent gone?)")
            self.cond.wait(timeout=max(1e-4, min(wait, self._next_event(now))))

    def serve(self, agent, header, payload):
        grad = self.model_sized(header, payload, "push")
        used = header.get("ts")
        if used is not None and (not isinstance(used, list) or len(used) != len(self.bounds)):
            raise ValueError(f"expected {len(self.bounds)} block timestamps, got {used!r}")
        start = time.monotonic()
        with self.cond:
            # None: a worker's first push, on the model it was started from — the server's current blocks
            used = list(self.ts) if used is None else [int(t) for t in used]
            if any(u > t for u, t in zip(used, self.ts)):
                raise ValueError(f"block timestamps {used} are ahead of the server's {self.ts}")
            self._expire(start)
            if not self.stopping:
                self._push(used, grad, start)
            newer = self._newer(used, start) if self.stopping else self._pull(used, start)
            values = torch.cat([self.joint[0][lo:hi] for lo, hi in (self.bounds[i] for i in newer)]) if newer \
                else self.joint[0][:0].clone()
            return {"ok": True, "blocks": newer, "ts": [self.ts[i] for i in newer], "base": used}, values

    def metrics(self) -> Dict[str, float]:
        with self.lock:
            n, mean_d = self._d.take()
            dropped, self._dropped_seen = self.dropped - self._dropped_seen, self.dropped
        return {"block_updates": n, "mean_d": mean_d, "dropped": dropped}

    def on_stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def state_dict(self):
        return {**super().state_dict(), "ts": list(self.ts)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.ts = [int(t) for t in state.get("ts", self.ts)]


@register
class WeakSync(ServiceAlgorithm):
    """PSP-SGD: partial push (c gradients + τ1) and partial pull (b of the blocks + τ2) over P blocks."""

    name: Literal["weaksync"] = "weaksync"
    summary = "weak synchronization (PSP-SGD): an iteration after c gradients + τ1, workers go on after b of the blocks + τ2"
    lr: float = Field(0.02, gt=0.0, description="η: the server's step per gradient (the step is d·η·mean)")
    blocks: int = Field(4, ge=1, le=MAX_BLOCKS, description="P: parameter blocks, each with its own timestamp")
    c: Optional[int] = Field(None, ge=1, description="gradients a block's iteration waits for (None: all agents)")
    pull_fraction: float = Field(1.0, gt=0.0, le=1.0, description="b: the fraction of blocks a pull waits for")
    push_timeout_s: float = Field(0.0, ge=0.0, description="τ1: how long an iteration waits after the c-th gradient")
    pull_timeout_s: float = Field(0.0, ge=0.0, description="τ2: how long a pull waits after b of the blocks")
    emulate_delay_fraction: float = Field(0.0, ge=0.0, le=1.0, description="benchmarks: the fraction of block "
                                          "updates pulls see only after emulate_delay_s (slow servers)")
    emulate_delay_s: float = Field(0.0, ge=0.0, le=30.0, description="benchmarks: the emulated server delay")

    @model_validator(mode="after")
    def _delay_needs_both(self):
        if (self.emulate_delay_fraction > 0) != (self.emulate_delay_s > 0):
            raise ValueError("emulate_delay_fraction and emulate_delay_s go together (both > 0, or both 0)")
        return self

    def check_agents(self, agents: int) -> None:
        if self.c is not None and self.c > agents:
            raise ValueError(f"algorithm.c = {self.c} exceeds the {agents} agents")

    def agent_factory(self):
        import functools

        return functools.partial(WeakSyncWorker, blocks=self.blocks)

    def driver_rule(self, joint, agents):
        self.check_agents(agents)
        return BlockServer(joint, agents, self.blocks, self.c or agents, self.pull_fraction, self.push_timeout_s,
                           self.pull_timeout_s, self.lr, self.emulate_delay_fraction, self.emulate_delay_s)
