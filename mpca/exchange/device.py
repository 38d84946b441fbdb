"""An agent's device: the time each training step takes — in virtual time for the simulator (:class:`ComputeModel`,
:class:`AgentClock`: fixed, or drawn from a log-normal around it, seeded, divided by each agent's speed) and waited
out in wall time by the runtime's emulated devices (:class:`DeviceClock`, ``emulation.device_step_s``, its speed
``emulation.device_speed``: a straggler has speed < 1, its steps take T / speed, in both)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, Optional

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


class DeviceClock:
    """Each training step's real compute time and CPU, and — with ``step_s`` set — an emulated accelerator:
    the real step runs, then the training loop waits out the rest of ``step_s``, so every step takes that
    wall time whatever the host's CPU does (the same for every algorithm).  Time the step spent in the
    rule's communicating hooks (DDP's all-reduce) is not compute: it comes on top, as on a real device.

    The wait happens outside the step lock, so an exchange request is served during it at once (a real
    device would make it wait for the step in flight at most).  A step whose real compute exceeds
    ``step_s`` is counted ``late``: the emulation does not hold for it."""

    FIELDS = ("compute_s", "cpu_s", "device_idle_s", "late_steps")

    def __init__(self, step_s: Optional[float] = None, sleep=time.sleep):
        self.step_s, self._sleep = step_s, sleep
        self.compute_s = 0.0  # wall time of the real steps (hooks' exchange time excluded)
        self.cpu_s = 0.0  # this process's CPU time during them
        self.device_idle_s = 0.0  # waited out to make each step take step_s
        self.late_steps = 0

    def start(self, exchange_s: float) -> tuple:
        return time.perf_counter(), time.process_time(), exchange_s

    def finish(self, started: tuple, exchange_s: float) -> None:
        wall0, cpu0, exchange0 = started
        compute = time.perf_counter() - wall0 - (exchange_s - exchange0)
        self.compute_s += compute
        self.cpu_s += time.process_time() - cpu0
        if self.step_s is None:
            return
        if compute > self.step_s:
            self.late_steps += 1
        else:
            self._sleep(self.step_s - compute)
            self.device_idle_s += self.step_s - compute

    def counters(self) -> Dict[str, float]:
        return {k: getattr(self, k) for k in self.FIELDS}


__all__ = ["AgentClock", "ComputeModel", "DeviceClock"]
