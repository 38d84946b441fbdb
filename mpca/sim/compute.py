"""Per-step device time: fixed, or drawn from a log-normal around it (seeded), divided by each agent's speed
(a straggler has speed < 1: its steps take T / speed, as ``training.device_speed`` does under the runtime's
emulated devices)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict

import numpy as np


@dataclass(frozen=True)
class ComputeModel:
    """``step_s``: T, the device time of one step; ``jitter``: σ of a log-normal factor with mean 1 (0: fixed);
    ``speeds``: agent → speed factor (default 1)."""

    step_s: float = 0.3
    jitter: float = 0.0
    speeds: Dict[int, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self):
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise ValueError(f"step time must be a finite number > 0, got {self.step_s}")
        if not 0 <= self.jitter < 2:
            raise ValueError(f"jitter must lie in [0, 2), got {self.jitter}")
        bad = {a: s for a, s in self.speeds.items() if not (s > 0 and math.isfinite(s))}
        if bad:
            raise ValueError(f"agent speeds must be finite numbers > 0, got {bad}")

    def clock(self, agent: int) -> "AgentClock":
        return AgentClock(self, agent)


class AgentClock:
    """One agent's step times: its own seeded stream, so agents' draws do not depend on event order."""

    def __init__(self, model: ComputeModel, agent: int):
        self.mean = model.step_s / model.speeds.get(agent, 1.0)
        self.jitter = model.jitter
        self.rng = np.random.default_rng([model.seed, 26, agent])

    def next_step_s(self) -> float:
        if self.jitter == 0:
            return self.mean
        s = self.jitter  # log-normal with mean 1: exp(N(−σ²/2, σ²))
        return self.mean * float(self.rng.lognormal(-s * s / 2, s))
