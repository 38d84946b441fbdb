"""An agent in lock step with the driver's cycles (``training.lock_step``): a reproducible run, written once for the
runtime's agents (:class:`mpca.runtime.agent.Agent`, which waits on it in wall time) and the simulator's
(:mod:`mpca.sim.simulator`, which parks the agent in virtual time).

The paper's agents never pause: a cycle takes whatever each agent holds when its yield request arrives, and a
broadcast is pulled toward between whichever two steps it arrives (§4.2, Eq. 7), so what a run computes depends on
the timing of every step.  In lock step each cycle has a *window* of exactly ``steps`` steps per agent: the agent
takes them, then waits; the cycle's yield takes its contribution then (never earlier), and the cycle's broadcast,
where the cycle's job carries one, is received right after that yield (held if it arrives first).  The next window
opens when both have happened.  Every agent then contributes and receives at the same step counts whatever the
speeds of the devices, the links and Spark's scheduling — with ``cluster.reduce: ordered`` (the driver adds the
partials in agent order) the joint model is the same bit for bit in every run and in the simulator.  What it
costs: training pauses for the exchange, which the paper's pipeline exists to hide.

The gate is a state machine with no clock and no lock of its own: its driver calls it under the agent's lock and
waits where it says so.  A yield request of a later cycle than the window's (the broadcast it waits for never
came: a deliver task that failed, a cycle abandoned) opens the window without it; a late broadcast of an earlier
cycle is then received when it comes, as in the paper's runs.
"""
from __future__ import annotations

from typing import Callable, Optional


class LockStep:
    """One agent's windows of ``steps`` steps (see the module doc)."""

    def __init__(self, steps: int):
        if steps < 1:
            raise ValueError(f"training.lock_step is a number of steps >= 1, got {steps}")
        self.steps = steps
        self.taken = 0  # steps of the current window
        self.awaiting: Optional[int] = None  # the cycle whose broadcast the closed window waits for
        self.yielded_cycle: Optional[int] = None  # the latest cycle whose yield took this agent's contribution
        self._held: Optional[tuple] = None  # (cycle, receive) of a broadcast that came before its cycle's yield

    # ------------------------------------------------------------------ the training loop
    def may_step(self) -> bool:
        """Whether the window has a step left (else the agent waits for the cycle's exchange)."""
        return self.taken < self.steps and self.awaiting is None

    def stepped(self) -> None:
        self.taken += 1

    # ------------------------------------------------------------------ the exchange
    def ready(self, cycle: Optional[int]) -> bool:
        """Whether a yield of ``cycle`` may take the contribution now: the window's steps are all taken.  A
        request of a later cycle than the broadcast awaited gives up waiting for it (it never came)."""
        if self.awaiting is not None and cycle is not None and cycle > self.awaiting:
            self._open()
        return self.taken >= self.steps or self.awaiting is not None

    def yielded(self, cycle: Optional[int], broadcasts: bool) -> None:
        """The yield of ``cycle`` took the contribution; ``broadcasts``: the cycle's job hands this agent a
        broadcast too (the next window waits for it)."""
        self.yielded_cycle = cycle
        held, self._held = self._held, None
        if held is not None:  # it came first: received right after the yield
            held[1]()
        if broadcasts and cycle is not None and (held is None or held[0] != cycle):
            self.awaiting = cycle  # closed until the broadcast comes
        else:
            self._open()

    def deliver(self, cycle: Optional[int], receive: Callable[[], None]) -> None:
        """A broadcast of ``cycle``: ``receive`` (the rule's hook) runs now where the cycle's yield has taken the
        contribution (opening the next window if it waited for it), else when it does."""
        if cycle is None or (self.yielded_cycle is not None and cycle <= self.yielded_cycle):
            receive()
            if self.awaiting is not None and cycle is not None and cycle >= self.awaiting:
                self._open()
            return
        self._held = (cycle, receive)

    def reset(self) -> None:
        """A fresh window (an agent that joined from the joint model, or reset to it)."""
        self.taken, self.awaiting, self._held = 0, None, None

    def _open(self) -> None:
        self.taken, self.awaiting = 0, None

    @property
    def waiting(self) -> bool:
        """The agent waits: its window's steps are taken, or the broadcast it waits for has not come."""
        return not self.may_step()


__all__ = ["LockStep"]
