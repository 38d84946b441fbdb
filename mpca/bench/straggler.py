"""A straggler for benchmarks (the paper's Fig. 10c): one agent made slower by a given factor.

``slowed(optimizer_fn, agent, speed)`` returns an ``optimizer_fn`` whose optimizers, on Spark partition
``agent`` only, sleep after every step so that the agent's steps take ``1 / speed`` times as long as they
would (``speed = 0.5``: half speed).  The driver and every other agent get the optimizer unchanged.

With emulated devices (``training.device_step_s`` = T) the straggler is a slower device instead: the agent
reads ``device_speed`` off its optimizer and waits out T / speed per step (:class:`mpca.runtime.agent.DeviceClock`),
and the optimizer stops sleeping itself — its sleep would count as the step's compute, make every step late
and be absorbed by the padding (the agent would not be slowed at all).
"""
from __future__ import annotations

import functools
import time
from typing import Callable


class _Slowed:
    """Delegates to the real optimizer; ``step`` stretches the time since the previous step, unless an
    emulated device runs the steps (``on_device``, set by the agent), which is then ``device_speed`` × as fast."""

    def __init__(self, inner, speed: float):
        self._inner, self.device_speed, self._mark = inner, speed, None
        self.on_device = False

    def step(self, *args, **kwargs):
        out = self._inner.step(*args, **kwargs)
        if self.on_device:
            return out
        now = time.perf_counter()
        if self._mark is not None:
            time.sleep((1.0 / self.device_speed - 1.0) * (now - self._mark))
        self._mark = time.perf_counter()
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _build(optimizer_fn: Callable, agent: int, speed: float, params):
    from pyspark import TaskContext

    opt = optimizer_fn(params)
    tc = TaskContext.get()
    return _Slowed(opt, speed) if tc is not None and tc.partitionId() == agent else opt


def slowed(optimizer_fn: Callable, agent: int, speed: float) -> Callable:
    if not 0.0 < speed <= 1.0 or agent < 0:
        raise ValueError(f"a straggler needs an agent >= 0 and a speed in (0, 1], got {agent}:{speed}")
    return functools.partial(_build, optimizer_fn, agent, speed)


def parse(text: str):
    """``"1:0.5"`` → (1, 0.5)."""
    try:
        agent, speed = text.split(":")
        return int(agent), float(speed)
    except ValueError:
        raise ValueError(f"--straggler takes AGENT:SPEED, e.g. 1:0.5, got {text!r}") from None
