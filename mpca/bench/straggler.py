"""A straggler for benchmarks (the paper's Fig. 10c): one agent made slower by a given factor.

``slowed(optimizer_fn, agent, speed)`` returns an ``optimizer_fn`` whose optimizers, on Spark partition
``agent`` only, sleep after every step so that the agent's steps take ``1 / speed`` times as long as they
would (``speed = 0.5``: half speed).  The driver and every other agent get the optimizer unchanged.

With emulated devices (``emulation.device_step_s`` = T) the straggler is a slower device instead
(:func:`straggle` sets ``emulation.device_speed``; the agent waits out T / speed per step, see
:class:`mpca.exchange.device.DeviceClock`) and the optimizer is left alone — a sleeping optimizer would count
as the step's compute, make every step late and be absorbed by the padding (the agent would not be slowed).
"""
from __future__ import annotations

import functools
import time
from typing import Callable


class SlowedOptimizer:
    """Delegates to the real optimizer; ``step`` stretches the time since the previous step to 1 / speed."""

    def __init__(self, inner, speed: float):
        self._inner, self._speed, self._mark = inner, speed, None

    def step(self, *args, **kwargs):
        out = self._inner.step(*args, **kwargs)
        now = time.perf_counter()
        if self._mark is not None:
            time.sleep((1.0 / self._speed - 1.0) * (now - self._mark))
        self._mark = time.perf_counter()
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _build(optimizer_fn: Callable, agent: int, speed: float, params):
    from pyspark import TaskContext

    opt = optimizer_fn(params)
    tc = TaskContext.get()
    return SlowedOptimizer(opt, speed) if tc is not None and tc.partitionId() == agent else opt


def slowed(optimizer_fn: Callable, agent: int, speed: float) -> Callable:
    if not 0.0 < speed <= 1.0 or agent < 0:
        raise ValueError(f"a straggler needs an agent >= 0 and a speed in (0, 1], got {agent}:{speed}")
    return functools.partial(_build, optimizer_fn, agent, speed)


def straggle(settings, optimizer_fn: Callable, agent: int, speed: float):
    """``settings`` and ``optimizer_fn`` with agent ``agent`` at ``speed``: a slower emulated device where the
    settings emulate devices (``emulation.device_speed``), else a sleeping optimizer (:func:`slowed`)."""
    if settings.emulation.device_step_s is None:
        return settings, slowed(optimizer_fn, agent, speed)
    if not 0.0 < speed <= 1.0 or agent < 0:
        raise ValueError(f"a straggler needs an agent >= 0 and a speed in (0, 1], got {agent}:{speed}")
    emulation = settings.emulation.model_copy(update={"device_speed": {agent: speed}})
    return settings.model_copy(update={"emulation": emulation}), optimizer_fn
