"""Hermans' asynchronous parameter-server algorithms (Hermans, *Gradient Energy Matching* / master's thesis
2017, the final text; ../shared/seeds/hermans-thesis-2017.txt is an early draft) through the driver's
parameter service, each worker on its own clock.

Every worker trains with its own optimizer and, every λ local steps, commits its accumulated update
Δ = x_i − x_pull (the sum of its −η∇ steps since it last pulled) to the server, which folds it into the
centre x̃ and answers with the new centre, which the worker pulls (x_i ← x̃, x_pull ← x̃).  The variants
differ only in what the server adds:

* ``downpour`` — DOWNPOUR (Dean et al. 2012): x̃ ← x̃ + Δ (λ = 1 commits every step's −η∇);
* ``agn`` — Accumulated Gradient Normalization: x̃ ← x̃ + Δ / λ;
* ``adag`` — AGN with a per-weight scale: x̃ ← x̃ + (Δ / λ) ⊙ 1 / (γ⁻¹ (x̃_t − x̃_{t−τ})² + 1), where x̃_{t−τ}
  is the centre this worker pulled (the server keeps it per worker) and γ = 1e-4 by default;
* ``dynsgd`` — DynSGD: x̃ ← x̃ + Δ / (τ + 1), τ = the centre's updates since this worker's pull (staleness);
* ``aeasgd`` — asynchronous EASGD with the thesis' ρ and η: every λ steps e = ρη (x_i − x̃),
  x_i ← x_i − e, x̃ ← x̃ + e (the ``easgd`` rule with α = ρη).

(dist-keras' ``ADAG`` class implements AGN; the names here follow the thesis.)  Server state: the centre,
an update counter, and per worker the counter at its last pull (and, for ``adag``, the centre it pulled:
K model copies) — bounded by the number of agents.  Staleness τ of every commit is kept in ``history``
(the last 100,000).
"""
from __future__ import annotations

import collections
import functools
from typing import Dict, List, Literal, Optional

import torch
from pydantic import Field

from mpca.algorithm.base import DriverRule, RunningMean, ServiceAgent, ServiceAlgorithm
from mpca.algorithm.easgd import EASGD
from mpca.algorithm.registry import register

VARIANTS = ("downpour", "agn", "adag", "dynsgd")


def server_update(variant: str, center: torch.Tensor, delta: torch.Tensor, steps: int, staleness: int,
                  pulled: Optional[torch.Tensor] = None, gamma: float = 1e-4) -> torch.Tensor:
    """The new centre after one commit of ``delta`` accumulated over ``steps`` local steps (see module doc)."""
    if steps < 1 or staleness < 0:
        raise ValueError(f"steps must be >= 1 and staleness >= 0, got {steps}, {staleness}")
    if variant == "downpour":
        return center + delta
    if variant == "agn":
        return center + delta / steps
    if variant == "dynsgd":
        return center + delta / (staleness + 1)
    if variant == "adag":
        if pulled is None:
            raise ValueError("adag needs the centre the worker pulled")
        return center + (delta / steps) / ((center - pulled) ** 2 / gamma + 1.0)
    raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")


class CommitAgent(ServiceAgent):
    """Every λ steps: commit Δ = x_i − x_pull, then pull the centre the server answers."""

    def __init__(self, ctx, every: int):
        super().__init__(ctx)
        self.every = every
        self.since = 0
        self.commits = 0
        with ctx.lock:
            self.pulled = ctx.shards.read(0)  # the model it starts from is the server's w0 (never w0 = 0)

    def after_step(self) -> None:
        self.since += 1

    def hand_in(self) -> None:
        if self.since:
            self.since = self.every  # commit what it accumulated, now
            self.between_steps()

    def between_steps(self) -> None:
        if self.since < self.every:
            return
        shards = self.ctx.shards
        with self.ctx.lock:
            delta = shards.read(0) - self.pulled
        # "accumulated": the steps in this commit (the agent's counters carry its total "steps")
        _, center = self.call_service("commit", delta, accumulated=self.since)  # waits, as the worker does
        with self.ctx.lock:
            shards.write(0, center)  # pull
        self.pulled = center
        self.since = 0
        self.commits += 1

    def on_reset(self) -> None:
        self.pulled = self.ctx.shards.read(0)  # a reset put the model back: nothing accumulated since
        self.since = 0


class CommitServer(DriverRule):
    """The centre and the per-worker pull bookkeeping; one commit at a time."""

    HISTORY = 100_000

    def __init__(self, joint, agents, variant: str, gamma: float):
        super().__init__(joint, agents)
        self.variant, self.gamma = variant, gamma
        self.updates = 0
        self.pulled_at: Dict[int, int] = {a: 0 for a in range(agents)}  # update count at each worker's pull
        self.pulled: Dict[int, torch.Tensor] = ({a: self.joint[0].clone() for a in range(agents)}
                                                 if variant == "adag" else {})
        self.history = collections.deque(maxlen=self.HISTORY)  # (agent, staleness) per commit
        self._staleness = RunningMean()

    def serve(self, agent, header, payload):
        delta = self.model_sized(header, payload, "commit")
        steps = int(header.get("accumulated", 1))
        with self.lock:
            staleness = self.updates - self.pulled_at.get(agent, 0)
            self.joint[0] = server_update(self.variant, self.joint[0], delta, max(1, steps), staleness,
                                          self.pulled.get(agent), self.gamma)
            self.updates += 1
            self.history.append((agent, staleness))
            self._staleness.add(staleness)
            center = self.joint[0].clone()
            self.pulled_at[agent] = self.updates  # the worker pulls what we answer
            if self.variant == "adag":
                self.pulled[agent] = center
        return {"ok": True, "staleness": staleness}, center

    def metrics(self):
        """Commits since the last call and their mean staleness τ."""
        with self.lock:
            n, tau = self._staleness.take()
            return {"commits": n, "mean_staleness": tau}

    def state_dict(self):
        return {**super().state_dict(), "updates": self.updates}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.updates = int(state.get("updates", 0))
        self.pulled_at = {a: self.updates for a in self.pulled_at}  # after a resume every worker pulls afresh


class _Commit(ServiceAlgorithm):
    every: int = Field(1, ge=1, description="λ: local steps between a worker's commits")

    def agent_factory(self):
        return functools.partial(CommitAgent, every=self.every)

    def driver_rule(self, joint, agents):
        return CommitServer(joint, agents, self.name, getattr(self, "gamma", 1e-4))


@register
class Downpour(_Commit):
    """DOWNPOUR: the server adds every committed update."""

    name: Literal["downpour"] = "downpour"
    summary = "asynchronous: every λ steps a worker commits its accumulated update and pulls the centre"


@register
class AGN(_Commit):
    """Accumulated Gradient Normalization: the server adds the commit divided by λ."""

    name: Literal["agn"] = "agn"
    summary = "asynchronous: commits of λ accumulated steps, normalized by λ"
    every: int = Field(10, ge=1, description="λ: local steps between a worker's commits")


@register
class ADAG(_Commit):
    """AGN with the per-weight scale 1 / (γ⁻¹ (x̃_t − x̃_{t−τ})² + 1)."""

    name: Literal["adag"] = "adag"
    summary = "AGN, each weight scaled down by how far the centre moved since the worker pulled"
    every: int = Field(10, ge=1, description="λ: local steps between a worker's commits")
    gamma: float = Field(1e-4, gt=0.0, description="γ of the per-weight scale")


@register
class DynSGD(_Commit):
    """Each commit divided by its staleness + 1."""

    name: Literal["dynsgd"] = "dynsgd"
    summary = "asynchronous: each commit divided by (staleness + 1)"


@register
class AEASGD(EASGD):
    """Asynchronous EASGD in the thesis' terms: α = ρη, every λ steps."""

    name: Literal["aeasgd"] = "aeasgd"
    summary = "asynchronous elastic averaging, α = ρη, every λ steps"
    rho: float = Field(5.0, gt=0.0, description="ρ: the elastic force")
    eta: float = Field(0.01, gt=0.0, description="η: the step size it is applied with (α = ρη ≤ 1)")

    def driver_rule(self, joint, agents):
        from mpca.algorithm.easgd import EASGDDriver

        if self.rho * self.eta > 1.0:
            raise ValueError(f"rho * eta = {self.rho * self.eta:g} must be <= 1")
        return EASGDDriver(joint, agents, self.rho * self.eta)


__all__: List[str] = ["server_update", "Downpour", "AGN", "ADAG", "DynSGD", "AEASGD"]
