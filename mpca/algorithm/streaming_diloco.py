"""Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512; torchft's ``DiLoCo`` with ``fragment_sync_delay``,
``fragment_update_alpha`` and ``should_quantize``): DiLoCo over P fragments of the model, synchronised in turn.

* **Fragments** (§2.2): the model's layers in P groups — ``strided`` (layer l in fragment l mod P, the paper's
  choice) or ``sequential`` (consecutive layers) — the runtime's P shards (:func:`~mpca.algorithm.sharding.
  fragment_groups`); ``bytes`` cuts the flat vector into P equal parts as mpca's shards (a deviation, for models
  of a few layers of very different sizes, where whole layers make one fragment carry nearly all the bytes).
  Cycle c of the driver reduces fragment c mod P.
* **Period and stagger**: fragment p's outer gradient Δ_p = θ_p − x_p is taken after local steps
  r H + ⌊(p + 1) H / P⌉ (r = 0, 1, …): every fragment every H steps, one fragment every H / P steps.
* **Overlap τ** (§2.3): the agent keeps training while Δ_p travels; the fragment's outer step is applied τ
  steps after Δ_p was taken (the agent waits there only if the average has not arrived).  τ < H / P, so a
  fragment's result is in before the next fragment's outer gradient is taken.
* **Mixing α**: the fragment, τ steps further than its outer gradient, becomes (1 − α) x_p + α θ_p
  (:func:`~mpca.algorithm.rules.mix_`; torchft's ``fragment_update_alpha`` is 1 − α).
* **Outer Nesterov momentum per fragment**, on every agent and on the driver (:mod:`mpca.algorithm.outer`).
* **Wire**: the outer gradients go up, and their average down, in the run's wire format, by default int4 with
  the driver's and each agent's error feedback (the paper's 4 bits; ``wire.format`` overrides).

With P = 1, τ = 0, α = 1 and ``wire.format: fp32`` it is DiLoCo bit for bit (tests/unit/test_streaming_diloco.py):
one fragment synced every H steps, the agent waits for the outer step, and takes the outer result whole.
"""
from __future__ import annotations

import functools
from typing import List, Literal, Optional

import torch
from pydantic import Field, model_validator

from mpca.algorithm.base import AgentContext, Algorithm, Params
from mpca.algorithm.outer import OuterAgent, OuterDriver
from mpca.algorithm.registry import register
from mpca.algorithm.rules import mix_
from mpca.algorithm.sharding import ShardLayout


def sync_offset(k: int, every: int, fragments: int) -> int:
    """Steps from the start of a period to the outer gradient of the k-th fragment in sync order (k = 0 … P − 1):
    ⌊(k + 1) H / P⌉, at least 1."""
    return max(1, round((k + 1) * every / fragments))


class StreamingDiLoCoAgent(OuterAgent):
    """Takes each fragment's outer gradient at its step, applies the fragment's outer step τ steps later."""

    def __init__(self, ctx: AgentContext, every: int, overlap: int, mix: float, lr: float, momentum: float):
        super().__init__(ctx, lr, momentum)
        self.every, self.overlap, self.mix = every, overlap, mix
        P = ctx.shards.layout.num_shards
        self.next_sync = [sync_offset(p, every, P) for p in range(P)]  # the step of each fragment's next Δ
        self.apply_at: List[Optional[int]] = [None] * P  # the step its outer step is due (Δ's step + τ)
        self.pending: List[Optional[torch.Tensor]] = [None] * P  # the average delivered, not applied yet

    def _due(self, p: int) -> bool:
        return self.apply_at[p] is not None and self.steps >= self.apply_at[p]

    def _apply(self, p: int) -> None:
        """The fragment's outer step on θ_p with the delivered average, then the mix into the local fragment."""
        theta = self.outer_step(p, self.pending[p])
        mix_(self.ctx.shards.views(p), self.ctx.shards.split(p, theta), self.mix)
        with self.cond:
            self.pending[p], self.apply_at[p] = None, None
            self.cond.notify_all()

    def after_step(self) -> None:
        self.steps += 1
        for p in range(len(self.next_sync)):
            if self.steps == self.next_sync[p]:
                self.take_snapshot(p, self.outer_gradient(p))
                with self.cond:
                    self.apply_at[p] = self.steps + self.overlap
                self.next_sync[p] += self.every
            if self._due(p) and self.pending[p] is not None:
                self._apply(p)

    def between_steps(self) -> None:
        with self.cond:  # a fragment's outer step is due and its average has not arrived: wait for it
            while self.waiting_now() and not self.ctx.stopping():
                self.cond.wait(0.1)

    def waiting_now(self) -> bool:
        return any(self._due(p) and self.pending[p] is None for p in range(len(self.pending)))

    def waiting(self) -> bool:
        with self.cond:
            return self.waiting_now() and not self.ctx.stopping()

    def receive(self, shard: int, pieces: List[torch.Tensor], params: Params) -> None:
        if not self.fresh(shard, params):
            return  # its join vectors already hold this outer step
        self.pending[shard] = self.flat(pieces)
        if self.apply_at[shard] is None:  # it took no outer gradient of this round (it came late): apply now
            self.apply_at[shard] = self.steps
        if self._due(shard):
            self._apply(shard)

    def joined(self, pieces, params: Params, state=None) -> None:
        """A replacement: also its sync schedule, from the fragment the driver asks next."""
        super().joined(pieces, params, state)
        P = len(self.next_sync)
        first = (int(params.get("fragment", -1)) + 1) % P
        for k in range(P):
            p = (first + k) % P
            self.next_sync[p] = self.steps + sync_offset(k, self.every, P)
            self.apply_at[p], self.pending[p] = None, None


@register
class StreamingDiLoCo(Algorithm):
    """Streaming DiLoCo: DiLoCo over P fragments synced in turn, overlapped with τ inner steps, 4-bit exchange."""

    name: Literal["streaming_diloco"] = "streaming_diloco"
    summary = "DiLoCo over P fragments synced in turn every H steps, the exchange overlapped with τ steps, int4"
    waits_for_driver = True  # its agents pause for the driver's model (mpca.exchange.lock_step)
    default_wire = "int4"
    fragments: int = Field(3, ge=1, description="P: fragments of whole layers, one synced every H / P steps")
    fragment_layout: Literal["strided", "sequential", "bytes"] = Field(
        "strided", description="layer l in fragment l mod P (strided, the paper's), consecutive layers (sequential), "
        "or the flat vector cut into P parts of equal bytes as mpca's shards (bytes: a deviation, for models whose "
        "layers differ widely in size, e.g. an MLP)")
    every: int = Field(50, ge=1, description="H: inner steps between two syncs of the same fragment")
    overlap: int = Field(1, ge=0, description="τ: inner steps between taking a fragment's outer gradient and "
                         "applying its outer step (the exchange overlaps them); < H / P")
    mix: float = Field(0.5, ge=0.0, le=1.0, description="α: the fragment becomes (1 − α) local + α outer result "
                       "(1: DiLoCo's replacement; torchft's fragment_update_alpha is 1 − α)")
    outer_lr: float = Field(0.7, gt=0.0)
    outer_momentum: float = Field(0.9, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _overlap_fits(self):
        if self.every < self.fragments:
            raise ValueError(f"every (H = {self.every}) must be at least the number of fragments ({self.fragments})")
        gap = min(sync_offset(k, self.every, self.fragments) - (sync_offset(k - 1, self.every, self.fragments)
                                                                 if k else 0) for k in range(self.fragments))
        if self.overlap >= gap:
            raise ValueError(f"overlap (τ = {self.overlap}) must be below the steps between two fragments' syncs "
                             f"({gap} = H / P): a fragment's outer step is applied before the next one is taken")
        return self

    @property
    def num_shards(self) -> int:
        return self.fragments

    def shard_layout(self, module: torch.nn.Module) -> ShardLayout:
        return ShardLayout.from_module(module, self.fragments, self.buffers, fragments=self.fragment_layout)

    def agent_factory(self):
        return functools.partial(StreamingDiLoCoAgent, every=self.every, overlap=self.overlap, mix=self.mix,
                                 lr=self.outer_lr, momentum=self.outer_momentum)

    def driver_rule(self, joint, agents):
        return OuterDriver(joint, agents, self.outer_lr, self.outer_momentum)  # the fragments' outer steps
