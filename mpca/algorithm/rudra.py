"""Rudra (Gupta, Zhang and Wang 2016): learners push one mini-batch gradient each, with the timestamp of
the weights they used, to a parameter server on the driver, and pull its weights back.

The server keeps the weights θ and their timestamp ts.  A gradient computed on weights of timestamp j and
applied in the update that advances ts from i to i + 1 has staleness σ = i − j; the update's ⟨σ⟩ is the
mean over its gradients (the paper's vector clock, Eq. 2), kept in ``history`` per update.  Protocols:

* ``rudra-hardsync`` — every learner's gradient of the current ts is averaged into one update; a learner
  waits for that update (σ ≡ 0).  Learning rate α0·√(λμ/B) (μ the mini-batch, B the reference batch,
  ``reference_batch``; §V-B) — the configurations with the same μλ product then train alike.
* ``rudra-softsync`` with ``n`` — the server updates after c = ⌊λ/n⌋ gradients, averaged; a learner pushes
  and pulls the current weights without waiting (⟨σ⟩ ≈ n).  α = α0/⟨σ⟩ (Eq. 6; ``modulate``).
* ``rudra-async`` — every gradient is applied on arrival (c = 1), as ``rudra-softsync`` with n = λ.

The learner's own optimizer does not act: its step is replaced by the server's weights.
"""
from __future__ import annotations

import collections
import math
import threading
from typing import List, Literal, Optional

import numpy as np
import torch
from pydantic import Field

from mpca.algorithm.base import DriverRule, GradientPusher, RunningMean, ServiceAlgorithm
from mpca.algorithm.registry import register


class RudraLearner(GradientPusher):
    """After each backward pass: push the gradient with the weights' timestamp, pull the server's weights."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.ts: Optional[int] = None  # None: the timestamp of the model it was started or reset from (the server's)
        self.pushes = 0
        self._pulled: Optional[torch.Tensor] = None

    def after_backward(self) -> None:
        reply, self._pulled = self.call_service("push", self.gradient(), ts=self.ts)
        self.ts = int(reply["ts"])
        self.pushes += 1

    def after_step(self) -> None:
        if self._pulled is not None:  # the server's weights replace whatever the local optimizer did
            self.ctx.shards.write(0, self._pulled)
            self._pulled = None

    def on_reset(self) -> None:
        self.ts = None  # back on the latest joint model


class RudraServer(DriverRule):
    """θ, ts, the gradients waiting for the next update, and ⟨σ⟩ per update."""

    HISTORY = 100_000

    def __init__(self, joint, agents, protocol: str, n: int, lr: float, modulate: bool, batch_size: int,
                 reference_batch: int, timeout_s: float = 55.0):
        super().__init__(joint, agents)
        if protocol not in ("hardsync", "softsync"):
            raise ValueError(f"protocol must be hardsync or softsync, got {protocol!r}")
        self.protocol, self.modulate, self.timeout_s = protocol, modulate, timeout_s
        self.n, self.base_lr, self.batch_scale = n, lr, batch_size / reference_batch
        self._learners(agents)
        self.ts = 0
        self.pending: List[tuple] = []  # (gradient, its timestamp)
        self.history = collections.deque(maxlen=self.HISTORY)  # (ts after the update, ⟨σ⟩, learning rate)
        self.cond = threading.Condition(self.lock)
        self.stopping = False
        self._sigma = RunningMean()
        self._lr = self.lr  # the last update's learning rate

    def _learners(self, learners: int) -> None:
        """λ learners: c gradients per update (hardsync λ, softsync ⌊λ/n⌋) and hardsync's α0·√(λμ/B)."""
        self.c = learners if self.protocol == "hardsync" else max(1, learners // self.n)
        self.lr = self.base_lr * math.sqrt(learners * self.batch_scale) if self.protocol == "hardsync" else self.base_lr

    def on_membership(self, agents):
        """λ follows the learners present: a hardsync update no longer waits for one that left or was lost (its
        waiting learners are released at once when the gradients in hand now suffice)."""
        with self.cond:
            self._learners(agents)
            if self.pending and len(self.pending) >= self.c:
                self._apply()

    def _apply(self) -> None:
        """One update from the pending gradients (lock held): θ ← θ − α · mean(g)."""
        stale = [self.ts - ts for _, ts in self.pending]
        mean_sigma = float(np.mean(stale))
        lr = self.lr / max(1.0, mean_sigma) if self.modulate else self.lr
        grad = torch.stack([g for g, _ in self.pending]).mean(dim=0)
        self.joint[0] = self.joint[0] - lr * grad
        self.ts += 1
        self.pending = []
        self.history.append((self.ts, mean_sigma, lr))
        self._sigma.add(mean_sigma)
        self._lr = lr
        self.cond.notify_all()

    def serve(self, agent, header, payload):
        grad = self.model_sized(header, payload, "push")
        ts = header.get("ts")
        with self.cond:
            ts = self.ts if ts is None else int(ts)  # None: a first push, on the model the learner started from
            if self.stopping:  # the run is ending: no more updates, the learner takes the weights and stops
                return {"ok": True, "ts": self.ts}, self.joint[0].clone()
            if ts > self.ts:
                raise ValueError(f"gradient timestamp {ts} is ahead of the server's {self.ts}")
            self.pending.append((grad, ts))
            if len(self.pending) >= self.c:
                self._apply()
            elif self.protocol == "hardsync":  # wait for the others' gradients of this timestamp
                target = self.ts + 1
                if not self.cond.wait_for(lambda: self.ts >= target or self.stopping, timeout=self.timeout_s):
                    raise TimeoutError(f"hardsync: not all {self.c} learners pushed within {self.timeout_s:.0f}s")
            return {"ok": True, "ts": self.ts}, self.joint[0].clone()

    def metrics(self):
        """Updates since the last call, their mean ⟨σ⟩ (the paper's Fig. 3) and the last learning rate."""
        with self.lock:
            n, sigma = self._sigma.take()
            return {"updates": n, "mean_staleness": sigma, "lr": self._lr}

    def on_stop(self) -> None:
        """The run ends: learners waiting for the others' gradients take the current weights and stop."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def state_dict(self):
        return {**super().state_dict(), "ts": self.ts}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.ts = int(state.get("ts", 0))


class _Rudra(ServiceAlgorithm):
    lr: float = Field(0.05, gt=0.0, description="α0: the server's SGD learning rate")
    batch_size: int = Field(32, ge=1, description="μ: the learners' mini-batch (for hardsync's √(λμ/B))")
    reference_batch: int = Field(128, ge=1, description="B: the reference model's batch (hardsync)")

    def agent_factory(self):
        return RudraLearner

    def _server(self, joint, agents, protocol: str, n: int, modulate: bool) -> RudraServer:
        return RudraServer(joint, agents, protocol, n, self.lr, modulate, self.batch_size, self.reference_batch)


@register
class RudraHardsync(_Rudra):
    """All λ gradients of a timestamp averaged into one update; σ ≡ 0."""

    name: Literal["rudra-hardsync"] = "rudra-hardsync"
    summary = "Rudra hardsync: every learner's gradient averaged per update, learners wait (σ = 0)"

    def driver_rule(self, joint, agents):
        return self._server(joint, agents, "hardsync", 1, False)


@register
class RudraSoftsync(_Rudra):
    """An update after ⌊λ/n⌋ gradients; α = α0/⟨σ⟩."""

    name: Literal["rudra-softsync"] = "rudra-softsync"
    summary = "Rudra n-softsync: an update after ⌊λ/n⌋ gradients, learning rate divided by ⟨σ⟩"
    n: int = Field(1, ge=1, description="n: the server updates after ⌊λ/n⌋ gradients (⟨σ⟩ ≈ n)")
    modulate: bool = Field(True, description="α = α0/⟨σ⟩ (Eq. 6)")

    def driver_rule(self, joint, agents):
        if self.n > agents:
            raise ValueError(f"n = {self.n} exceeds the {agents} learners")
        return self._server(joint, agents, "softsync", self.n, self.modulate)


@register
class RudraAsync(_Rudra):
    """Every gradient applied on arrival."""

    name: Literal["rudra-async"] = "rudra-async"
    summary = "Rudra async: every gradient applied on arrival"
    modulate: bool = Field(False, description="α = α0/⟨σ⟩ (as softsync)")

    def driver_rule(self, joint, agents):
        return self._server(joint, agents, "softsync", agents, self.modulate)



