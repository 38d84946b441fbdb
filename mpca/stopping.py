"""When a run stops: the stop rules of the ``stop:`` settings, checked once per cycle."""
from __future__ import annotations

import time
from typing import Optional

from mpca.config import StopSection


class StopRules:
    """``reason(...)`` returns why the run should stop now (``target_error``, ``max_cycles``,
    ``max_seconds``, ``max_epochs``) or None to go on."""

    def __init__(self, stop: StopSection, t0: float):
        self.stop, self.t0 = stop, t0

    def target_met(self, error: float) -> bool:
        return self.stop.target_error is not None and error <= self.stop.target_error

    def reason(self, cycles_done: int, epochs: float, target_met: bool) -> Optional[str]:
        s = self.stop
        if target_met:
            return "target_error"
        if s.max_cycles is not None and cycles_done >= s.max_cycles:
            return "max_cycles"
        if s.max_seconds is not None and time.time() - self.t0 >= s.max_seconds:
            return "max_seconds"
        if s.max_epochs is not None and epochs >= s.max_epochs:
            return "max_epochs"
        return None
