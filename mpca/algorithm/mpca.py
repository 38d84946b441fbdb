"""MPCA SGD (Langer et al. 2018): the elastic pull on the agents, Eqs. 9 → 8 → 4 → 5 on the driver.

Agent (every step, §4.4): x_i ← x_i − α (x_i − x̂*) toward the latest projected joint shards (Eq. 7), fused
over all shards; per shard s it counts τ_s, the steps made since s was last yielded, which weighs its
contribution in Eq. 9 (§4.6, measured, not configured).  The target x̂* is, by default, x* plus the agent's
own steps since it contributed to the reduction behind x* (``pull: compensated``, mpca's deviation from the
paper: the projection arrives one pipeline cycle after the contribution, two with Fig. 8's overlapped staging,
and pulling toward x* itself would undo those cycles' progress); ``pull: elastic`` is the paper's x̂* = x*.

Driver (per reduced shard, §4.5/§4.3): R = Σ τ_i x_i / Σ τ_i (Eq. 9), x̃_t = (1 − β) x̃_{t−1} + β R (Eq. 8),
ṽ_t = δ ṽ_{t−1} + (1 − δ)(x̃_t − x̃_{t−1}) (Eq. 4), broadcast x* = x̃_t + γ ṽ_t (Eq. 5).  The runtime's
pipeline overlaps the exchange with training over S shards (§4.2, Figs. 6–8).  By default (``stage: between``,
mpca's second deviation) it stages each reduction as its job ends, not while the next job runs as Fig. 8 does:
staging (Eqs. 9 → 5 and a broadcast variable) takes a few hundredths of a second against cycles of seconds, and
overlapping it made every projection a whole cycle older.  Its exchange goes in ``int8`` by default (mpca's
third deviation, ``wire.format: fp32`` is the paper's): a shard up and its projection down in a quarter of the
bytes, with error feedback on both (:mod:`mpca.algorithm.wire`).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Literal, Optional, get_args

import torch
from pydantic import Field, model_validator

from mpca.algorithm.base import AgentContext, AgentRule, Algorithm, DriverRule, Params
from mpca.algorithm.joint import JointShard, MPCAHyper
from mpca.algorithm.registry import register
from mpca.algorithm.rules import compensated_pull_, elastic_pull_, extrapolate
from mpca.algorithm.schedules import AlphaSchedule, BetaSchedule, GammaSchedule
from mpca.algorithm.weighted_sum import WeightedSum


Pull = Literal["compensated", "elastic"]  # Eq. 7's target: see MPCA.pull
PULLS = get_args(Pull)


class MPCAAgent(AgentRule):
    """Eq. 7 before every step, τ per shard (Eq. 9's weights).

    ``pull="elastic"``: the target is the delivered x* (the paper).  ``pull="compensated"``: per shard the
    agent keeps what it contributed (y_i) until the projection built from it arrives, then pulls by the
    residual r = y_i − x* (:func:`~mpca.algorithm.rules.compensated_pull_`); without a contribution behind
    the delivery (the first one, a join, a second delivery of the same reduction) r = x_i − x* at receipt.
    """

    def __init__(self, ctx: AgentContext, weighting: str = "tau", pull: str = "compensated"):
        super().__init__(ctx)
        if pull not in PULLS:
            raise ValueError(f"pull must be one of {PULLS}, got {pull!r}")
        S = ctx.shards.layout.num_shards
        self.weighting = weighting
        self.pull = pull
        self._pull_ = elastic_pull_ if pull == "elastic" else compensated_pull_  # chosen once, not per step
        self.tau = [0] * S
        self.targets: List[Optional[List[torch.Tensor]]] = [None] * S  # per shard: x* (elastic) or r (compensated)
        self.sent: List[Optional[torch.Tensor]] = [None] * S  # compensated: y_i, until its projection arrives
        self.alpha = 0.0
        self._views: List[torch.Tensor] = []
        self._targets: List[torch.Tensor] = []

    def before_step(self) -> None:
        if self.alpha > 0 and self._views:  # Eq. 7, before the gradient
            self._pull_(self._views, self._targets, self.alpha)

    def after_step(self) -> None:
        for s in range(len(self.tau)):
            self.tau[s] += 1

    def on_reset(self) -> None:
        self.tau = [0] * len(self.tau)  # steps before the fault carry no weight
        if self.pull == "compensated":  # the model is back on a joint model: no disagreement left to correct
            self.targets = [None] * len(self.targets)
            self.sent = [None] * len(self.sent)
            self._rebuild()

    def contribution_lost(self, shard: int, extra) -> None:
        self.tau[shard] += int(extra.get("tau", 0))  # those steps weigh in the next contribution of the shard

    def receive(self, shard: int, pieces: List[torch.Tensor], params: Params) -> None:
        self.alpha = float(params["alpha"])
        if self.pull == "elastic":
            self.targets[shard] = pieces
        else:
            sent, self.sent[shard] = self.sent[shard], None
            held = self.ctx.shards.split(shard, sent) if sent is not None else self.ctx.shards.views(shard)
            self.targets[shard] = torch._foreach_sub(held, pieces)  # r = y_i − x* (or x_i − x*)
        self._rebuild()

    def _rebuild(self) -> None:
        """One fused pull over every shard that has a target (lists rebuilt on delivery, not in the step loop)."""
        have = [i for i, t in enumerate(self.targets) if t is not None]
        self._views = [v for i in have for v in self.ctx.shards.views(i)]
        self._targets = [t for i in have for t in self.targets[i]]

    def contribution(self, shard: int, params: Params):
        tau, self.tau[shard] = self.tau[shard], 0
        weight = float(tau) if self.weighting == "tau" else float(tau > 0)  # "uniform": Fig. 10c's ablation
        vec = self.ctx.shards.read(shard)
        if self.pull == "compensated":
            self.sent[shard] = vec  # read() made a copy; the runtime only reads it
        return vec, weight, {"tau": tau}


class MPCADriver(DriverRule):
    """One :class:`JointShard` (x̃, ṽ) per shard; α travels with every cycle."""

    def __init__(self, joint: List[torch.Tensor], agents: int, hyper: MPCAHyper, stage: str = "between"):
        super().__init__(joint, agents)
        self.hyper = hyper
        self.stage = stage
        self.shards = [JointShard(j) for j in self.joint]
        self._gamma = 0.0  # γ of the latest projection (Eq. 5), for join_vectors

    def join_vectors(self) -> List[torch.Tensor]:
        """x* = x̃ + γ ṽ (Eq. 5) for every shard: a replacement agent starts where the others are pulled."""
        with self.lock:
            return [extrapolate(s.joint, s.velocity, self._gamma) for s in self.shards]

    def stage_lag(self, first: bool = False) -> int:
        """``stage="between"`` (the default): every reduction is staged when its job ends and broadcast by the
        next job (lag 1, as Figs. 6–7 do with S ≤ 2), whatever S; ``"overlapped"``: Fig. 8's third phase
        (:meth:`DriverRule.stage_lag`), staged while the next job runs and broadcast by the job after it."""
        return 1 if self.stage == "between" else super().stage_lag(first)

    def cycle_params(self, cycle: int) -> Params:
        return {"alpha": self.hyper.alpha(cycle)}

    def on_reduced(self, cycle: int, shard: int, partial: WeightedSum) -> torch.Tensor:
        h = self.hyper
        star = self.shards[shard].update(partial, h.beta(cycle), h.gamma(cycle), h.delta)  # Eqs. 9, 8, 4, 5
        with self.lock:
            self._gamma = h.gamma(cycle)
            self.joint[shard] = self.shards[shard].joint
        return star

    def state_dict(self) -> Dict[str, Any]:
        return {"joint": [s.joint.clone() for s in self.shards], "velocity": [s.velocity.clone() for s in self.shards],
                "reductions": [s.reductions for s in self.shards]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.shards = [JointShard(j, v, int(r)) for j, v, r in zip(state["joint"], state["velocity"], state["reductions"])]
        self.joint = [s.joint for s in self.shards]


@register
class MPCA(Algorithm):
    """MPCA SGD: S shards in a 3-phase pipeline, elastic pull every step, τ-weighted reduction, projection."""

    name: Literal["mpca"] = "mpca"
    summary = "elastic pull every step toward a projected joint model; shards pipelined by the driver"
    # int8 with error feedback (a deviation from the paper's full-precision exchange; wire.format: fp32 keeps it):
    # on a slow link the cycle is the driver's port, and a quarter of the bytes makes it ~2x shorter
    default_wire = "int8"
    shards: int = Field(3, ge=1, description="S: shards in flight (3 = stage, broadcast, reduce at once)")
    delta: float = Field(0.8, description="trajectory smoothing δ of Eq. 4, in [0, 1]")
    weighting: Literal["tau", "uniform"] = Field("tau", description="Eq. 9 weights: measured τ or 1 per agent")
    pull: Pull = Field(
        "compensated", description="Eq. 7's target: x* plus the agent's own steps since its contribution "
        "(compensated, default: a deviation from the paper) or x* itself (elastic, the paper)")
    stage: Literal["between", "overlapped"] = Field(
        "between", description="when a reduced shard is staged: as its job ends, broadcast by the next job "
        "(between, default: a deviation from the paper) or while the next job runs, broadcast a job later "
        "(overlapped: Fig. 8's third phase, for staging that takes a large part of a cycle)")
    alpha: AlphaSchedule = Field(default_factory=AlphaSchedule)
    beta: BetaSchedule = Field(default_factory=BetaSchedule)
    gamma: GammaSchedule = Field(default_factory=GammaSchedule)

    @model_validator(mode="after")
    def _hyper_is_valid(self):
        self.hyper()  # MPCAHyper and the schedules check their own bounds: validated in one place
        return self

    @property
    def num_shards(self) -> int:
        return self.shards

    def hyper(self) -> MPCAHyper:
        return MPCAHyper(alpha=self.alpha, beta=self.beta, gamma=self.gamma, delta=self.delta)

    def agent_factory(self):
        return functools.partial(MPCAAgent, weighting=self.weighting, pull=self.pull)

    def driver_rule(self, joint, agents):
        return MPCADriver(joint, agents, self.hyper(), self.stage)
