"""The virtual clock: a heap of events ordered by virtual time, ties broken by the order they were scheduled
(so two events at the same instant run first-scheduled first, e.g. a delivery before the yield request that the
same job sends after it)."""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, List, Tuple

Event = Callable[[float], Any]  # called with its virtual time


class VirtualClock:
    """``schedule(t, event)``; :meth:`run_until` calls the events in (time, sequence) order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: List[Tuple[float, int, Event]] = []
        self._seq = itertools.count()

    def schedule(self, t: float, event: Event) -> None:
        if t < self.now:
            raise ValueError(f"cannot schedule an event at {t} before the clock's now {self.now}")
        heapq.heappush(self._heap, (float(t), next(self._seq), event))

    def __len__(self) -> int:
        return len(self._heap)

    def step(self) -> bool:
        """Run the earliest event (False when none is left)."""
        if not self._heap:
            return False
        t, _, event = heapq.heappop(self._heap)
        self.now = t
        event(t)
        return True

    def run_until(self, end: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Run every event at a time ≤ ``end`` in order, or until ``stop()`` says so; the clock ends at ``end``
        (or where it stopped)."""
        while self._heap and self._heap[0][0] <= end and not stop():
            self.step()
        if not stop():
            self.now = max(self.now, end)
