"""Live progress on the driver: one updating line on a terminal or in a notebook, periodic log lines otherwise."""
from __future__ import annotations

import collections
import logging
import math
import sys
import time
from typing import Optional, Tuple

log = logging.getLogger("mpca.progress")


def _fmt_eta(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def in_notebook() -> bool:
    """Whether this driver is a Jupyter/Databricks notebook kernel (its stderr is no terminal, and log lines
    at INFO are not shown there by default)."""
    shell = sys.modules.get("IPython") and getattr(sys.modules["IPython"], "get_ipython", lambda: None)()
    return shell is not None and type(shell).__name__ in ("ZMQInteractiveShell", "DatabricksShell")


class Progress:
    """``mode``: ``bar`` (updating line), ``log`` (a line every ``log_every_s``), ``notebook`` (an updating
    output line in the cell), ``off``, or ``auto`` (``notebook`` in a notebook kernel, ``bar`` on a
    terminal, ``log`` otherwise — spark-submit logs, CI).  ``metric``: what the line follows (``eval.metric``):
    the holdout ``error`` in percent, or its ``loss`` in nats with bits beside it; ``target``: that metric's."""

    def __init__(self, mode: str = "auto", target: Optional[float] = None, log_every_s: float = 10.0,
                 stream=None, metric: str = "error"):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "notebook" if in_notebook() else "bar" if getattr(self.stream, "isatty", lambda: False)() else "log"
        if mode not in ("bar", "log", "notebook", "off"):
            raise ValueError(f"progress mode must be auto, bar, log, notebook or off, got {mode!r}")
        self._handle = None  # the notebook's output line
        self.mode = mode
        self.target = target
        self.metric = metric
        self.log_every_s = log_every_s
        self._last_log = 0.0
        # (wall, error) of the last 4 evaluations for the time-to-target estimate (bounded: runs last days)
        self._errors: collections.deque = collections.deque(maxlen=4)
        self.cycle = 0
        self.samples_per_s = float("nan")
        self.error = float("nan")
        self.agents: Optional[Tuple[int, int]] = None  # (answering, expected) in the latest cycle
        self.t0 = time.time()

    def eta_to_target(self) -> Optional[float]:
        """Seconds to the target error at the current rate of improvement (linear over recent evaluations)."""
        if self.target is None or len(self._errors) < 2:
            return None
        (t1, e1), (t2, e2) = self._errors[max(0, len(self._errors) - 4)], self._errors[-1]
        if e2 <= self.target:
            return 0.0
        rate = (e1 - e2) / (t2 - t1) if t2 > t1 else 0.0
        return (e2 - self.target) / rate if rate > 0 else None

    def _value(self, v: float) -> str:
        if self.metric == "loss":
            return f"{v:.3f} nats ({v / math.log(2.0):.3f} bits)" if math.isfinite(v) else "-"
        return f"{100 * v:.2f}%" if math.isfinite(v) else "-"

    def line(self) -> str:
        sps = f"{self.samples_per_s:,.0f}" if math.isfinite(self.samples_per_s) else "-"
        tgt = ""
        if self.target is not None:
            target = f"{100 * self.target:.1f}%" if self.metric == "error" else f"{self.target:.3f}"
            tgt = f" | to {target}: {_fmt_eta(self.eta_to_target())}"
        agents = f" | agents {self.agents[0]}/{self.agents[1]}" if self.agents else ""
        return (f"cycle {self.cycle}{agents} | {sps} samples/s | holdout {self.metric} {self._value(self.error)}"
                f"{tgt} | {time.time() - self.t0:.0f}s")

    def update(self, cycle: int, error: Optional[float] = None, samples_per_s: Optional[float] = None,
               agents: Optional[Tuple[int, int]] = None) -> None:
        """``agents``: (how many answered the latest cycle, how many the run has); a change is logged at once."""
        self.cycle = cycle
        changed = agents is not None and self.agents is not None and agents != self.agents
        if agents is not None:
            self.agents = agents
        if samples_per_s is not None and math.isfinite(samples_per_s):
            self.samples_per_s = samples_per_s
        if error is not None and math.isfinite(error):
            self.error = error
            self._errors.append((time.time() - self.t0, error))
        if self.mode == "bar":
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()
        elif self.mode == "notebook":
            from IPython.display import display

            if self._handle is None:
                self._handle = display(self.line(), display_id=True)
            else:
                self._handle.update(self.line())
        elif self.mode == "log" and (error is not None or changed or time.time() - self._last_log >= self.log_every_s):
            self._last_log = time.time()
            log.info(self.line())

    def close(self) -> None:
        if self.mode == "bar":
            self.stream.write("\n")
            self.stream.flush()
