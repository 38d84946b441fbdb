"""An agent's lock step (``training.lock_step``) on the wall clock: the exchange core's windows
(:class:`mpca.exchange.lock_step.LockStep`) behind a condition variable, which the training loop waits on before a
step and an exchange task's yield waits on for the window's last step.  The simulator parks its agents on the same
windows in virtual time."""
from __future__ import annotations

import threading
from typing import Callable, Optional

from mpca.exchange.lock_step import LockStep


class PacedWindows:
    """Agent ``agent``'s windows of ``steps`` steps; ``stopping()``: the run is ending (nobody waits then)."""

    def __init__(self, steps: int, stopping: Callable[[], bool]):
        self.gate = LockStep(steps)
        self.stopping = stopping
        self.cond = threading.Condition()

    def before_step(self) -> None:
        """The training loop, before a step: wait while the window is closed."""
        with self.cond:
            while not self.gate.may_step() and not self.stopping():
                self.cond.wait(0.05)

    def stepped(self) -> None:
        with self.cond:
            self.gate.stepped()
            self.cond.notify_all()

    def ready(self, cycle: Optional[int], timeout_s: float) -> bool:
        """A yield of ``cycle``: wait until the window's steps are taken; False if ``timeout_s`` passes first."""
        with self.cond:
            return self.cond.wait_for(lambda: self.gate.ready(cycle) or self.stopping(), timeout_s)

    def yielded(self, cycle: Optional[int], broadcasts: bool) -> None:
        """Called with the agent's step lock held (a held broadcast is received here)."""
        with self.cond:
            self.gate.yielded(cycle, broadcasts)
            self.cond.notify_all()

    def deliver(self, cycle: Optional[int], receive: Callable[[], None]) -> None:
        """Called with the agent's step lock held: ``receive`` now, or at the cycle's yield."""
        with self.cond:
            self.gate.deliver(cycle, receive)
            self.cond.notify_all()

    def reset(self) -> None:
        with self.cond:
            self.gate.reset()
            self.cond.notify_all()


__all__ = ["PacedWindows"]
