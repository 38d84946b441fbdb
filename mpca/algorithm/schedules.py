"""Hyper-parameter schedules of MPCA SGD, each a pure function of the cycle count.

* α — the elastic pull of Eq. 7, §6.3: 0 for the first cycles (agents explore
  alone), then a jump to a high value (e.g. 0.5) that forces the agents onto a
  common descent path, then a geometric decay to the target (e.g. 0.05).
* β — the blend rate of Eq. 8, §4.5/§7.1: 1.0 at the start (the random joint
  model holds no information), ramped down by a constant factor to 0.9 over the
  first ~20 exchange cycles.
* γ — the extrapolation distance of Eq. 5, §4.3: ramped linearly from ~0 to
  e.g. 0.7 as the trajectory stabilises.
"""
from __future__ import annotations

from dataclasses import dataclass


def _check_unit(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")


def _check_cycles(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _geometric(start: float, end: float, k: int, n: int) -> float:
    """``start`` moved towards ``end`` by a constant factor per step, reaching it after ``n`` steps."""
    if n == 0 or k >= n:
        return end
    if start == 0.0 or end == 0.0:  # a constant factor cannot reach or leave 0: interpolate linearly
        return start + (end - start) * k / n
    return start * (end / start) ** (k / n)


@dataclass(frozen=True)
class AlphaSchedule:
    """α(c): ``0`` for ``c < hold_cycles``, then ``peak`` decaying geometrically to ``target``
    over ``decay_cycles``, then ``target`` (§6.3)."""

    hold_cycles: int = 3
    peak: float = 0.5
    decay_cycles: int = 20
    target: float = 0.05

    def __post_init__(self):
        _check_cycles("alpha.hold_cycles", self.hold_cycles)
        _check_cycles("alpha.decay_cycles", self.decay_cycles)
        _check_unit("alpha.peak", self.peak)
        _check_unit("alpha.target", self.target)

    def __call__(self, cycle: int) -> float:
        if cycle < self.hold_cycles:
            return 0.0
        return _geometric(self.peak, self.target, cycle - self.hold_cycles, self.decay_cycles)

    @classmethod
    def constant(cls, value: float) -> "AlphaSchedule":
        return cls(hold_cycles=0, peak=value, decay_cycles=0, target=value)


@dataclass(frozen=True)
class BetaSchedule:
    """β(c): ``start`` ramped by a constant factor to ``target`` over ``ramp_cycles`` (§7.1)."""

    start: float = 1.0
    target: float = 0.9
    ramp_cycles: int = 20

    def __post_init__(self):
        _check_unit("beta.start", self.start)
        _check_unit("beta.target", self.target)
        _check_cycles("beta.ramp_cycles", self.ramp_cycles)
        if self.target == 0.0:
            raise ValueError("beta.target must be > 0: with beta = 0 the joint model never changes")

    def __call__(self, cycle: int) -> float:
        return _geometric(self.start, self.target, cycle, self.ramp_cycles)


@dataclass(frozen=True)
class GammaSchedule:
    """γ(c): linear ramp from ``start`` to ``target`` over ``ramp_cycles`` (§4.3)."""

    start: float = 0.0
    target: float = 0.7
    ramp_cycles: int = 30

    def __post_init__(self):
        _check_cycles("gamma.ramp_cycles", self.ramp_cycles)
        for name, v in (("gamma.start", self.start), ("gamma.target", self.target)):
            if not (0.0 <= v <= 4.0):
                raise ValueError(f"{name} must lie in [0, 4] (cycles of look-ahead), got {v!r}")

    def __call__(self, cycle: int) -> float:
        if self.ramp_cycles == 0 or cycle >= self.ramp_cycles:
            return self.target
        return self.start + (self.target - self.start) * cycle / self.ramp_cycles
