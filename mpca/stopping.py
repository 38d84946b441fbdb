"""When a run stops: the stop rules of the ``stop:`` settings, checked once per cycle, and stop signals."""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # not at run time: the exchange tasks import this module (via the roster) without torch
    from mpca.config import StopSection

LN2 = math.log(2.0)


def metric_column(metric: str) -> str:
    """The history's column of ``eval.metric`` (``error`` or ``loss``): ``holdout_error``, ``holdout_loss``."""
    return f"holdout_{metric}"


class StopRules:
    """``reason(...)`` returns why the run should stop now (``target_error`` or ``target_loss``, ``interrupted``,
    ``max_cycles``, ``max_seconds``, ``max_epochs``) or None to go on; the target is that of ``metric``
    (``eval.metric``)."""

    def __init__(self, stop: StopSection, t0: float, requested=None, metric: str = "error"):
        self.stop, self.t0, self.requested = stop, t0, requested  # requested: an Event (a signal, request_stop)
        self.metric = metric

    @property
    def target_reason(self) -> str:
        return f"target_{self.metric}"

    def target_met(self, value: float) -> bool:
        """Whether ``value`` of the run's metric (a history row's :func:`metric_column`) meets the target."""
        target = self.stop.target
        return target is not None and math.isfinite(value) and value <= target

    def reason(self, cycles_done: int, epochs: float, target_met: bool) -> Optional[str]:
        s = self.stop
        if target_met:
            return self.target_reason
        if self.requested is not None and self.requested.is_set():
            return "interrupted"
        if s.max_cycles is not None and cycles_done >= s.max_cycles:
            return "max_cycles"
        if s.max_seconds is not None and time.time() - self.t0 >= s.max_seconds:
            return "max_seconds"
        if s.max_epochs is not None and epochs >= s.max_epochs:
            return "max_epochs"
        return None


class StopSignals:
    """While active (in the main thread), SIGTERM — how YARN, Kubernetes, Airflow and Databricks end a job —
    and a first Ctrl-C ask the run to stop after the current cycle, so that it still writes its final model,
    checkpoint and summary; a second Ctrl-C interrupts at once.  ``event`` is set on the first signal and
    ``signum`` tells which; :attr:`exit_code` is 128 + signum (130, 143)."""

    def __init__(self):
        import threading

        self.event = threading.Event()
        self.signum: Optional[int] = None
        self._old = {}

    def _handle(self, signum, frame):
        import signal

        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum
        self.event.set()

    @property
    def exit_code(self) -> Optional[int]:
        return None if self.signum is None else 128 + self.signum

    def __enter__(self) -> "StopSignals":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for s, old in self._old.items():
            signal.signal(s, old)
