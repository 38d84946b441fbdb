"""Holdout evaluation of the joint model on the driver, inline or in a background thread."""
from __future__ import annotations

import collections
import copy
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch


@dataclass(frozen=True)
class EvalResult:
    error: float  # classification error in [0, 1] (nan for regression)
    loss: float


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn, batch_size: int = 1024) -> EvalResult:
    model.eval()
    if x.shape[0] == 0:
        return EvalResult(float("nan"), float("nan"))
    wrong, loss_sum = 0, 0.0
    classify = not y.is_floating_point()
    for lo in range(0, x.shape[0], batch_size):
        out = model(x[lo:lo + batch_size])
        yb = y[lo:lo + batch_size]
        loss_sum += float(loss_fn(out, yb)) * yb.shape[0]
        if classify:
            wrong += int((out.argmax(dim=1) != yb).sum())
    n = x.shape[0]
    return EvalResult(wrong / n if classify else float("nan"), loss_sum / n)


def has_batchnorm(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


@torch.no_grad()
def recalibrate_batchnorm(model: torch.nn.Module, x: torch.Tensor, batch_size: int = 256) -> None:
    """Running statistics of every BatchNorm layer re-estimated from the inputs ``x`` (a cumulative average over
    the batches, as ``torch.optim.swa_utils.update_bn``).  With ``buffers="local"`` each agent keeps its own
    statistics and the joint model has none; this gives the evaluated and the saved model statistics that
    match their weights."""
    if x.shape[0] == 0:
        return
    torch.optim.swa_utils.update_bn([x[lo:lo + batch_size] for lo in range(0, x.shape[0], batch_size)], model)


class SampleRate:
    """Each agent's samples/s from its cumulative sample count, over the last ``window_s`` seconds of
    observations (at least the last two): one figure per exchange cycle, from the first cycle on when the
    agents' counts at start are the first observation."""

    def __init__(self, window_s: float = 2.0):
        self.window_s = window_s
        self._seen: Dict[int, collections.deque] = {}

    def observe(self, reports, now: Optional[float] = None) -> Dict[int, float]:
        """Record ``reports`` (agent → report with a cumulative ``samples``) at ``now``; the rates per agent."""
        now = time.time() if now is None else now
        rates = {}
        for a, r in reports.items():
            if r.samples is None:
                continue
            seen = self._seen.setdefault(a, collections.deque())
            if seen and int(r.samples) < seen[-1][1]:
                seen.clear()  # a replacement agent counts from 0 again
            seen.append((now, int(r.samples)))
            while len(seen) > 2 and now - seen[1][0] >= self.window_s:
                seen.popleft()  # keep the newest observation at least window_s old, drop older ones
            (t_old, s_old), (t_new, s_new) = seen[0], seen[-1]
            if t_new > t_old:
                rates[a] = max(0.0, (s_new - s_old) / (t_new - t_old))
        return rates


class BackgroundEvaluator:
    """Evaluates snapshots of the joint model in a thread, so the pipeline never waits for it.

    :meth:`submit` takes a snapshot (skipped while the previous one is still being evaluated);
    :meth:`drain` returns the finished history rows, each with the snapshot it scored under
    ``"_snapshot"`` (the trainer keeps the one that met the target)."""

    def __init__(self, model: torch.nn.Module, bound, buffers: str, hx: torch.Tensor, hy: torch.Tensor, loss_fn,
                 calibration: Optional[torch.Tensor] = None):
        self.model = copy.deepcopy(model)
        self.calibration = calibration  # training inputs for BatchNorm statistics (buffers="local")
        self.bound = bound.layout.bind_module(self.model, buffers)
        self.hx, self.hy, self.loss_fn = hx, hy, loss_fn
        self._lock = threading.Lock()
        self._ready: List[dict] = []
        self._busy = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def submit(self, joints, cycle: int, wall: float, reports, epochs: float = float("nan"),
               metrics: Optional[Callable[[], Dict[str, float]]] = None,
               sps: Optional[Dict[int, float]] = None, present: int = 0) -> bool:
        """Score ``joints`` in the background (skipped while the previous evaluation runs: returns False);
        ``metrics``: the algorithm's own figures (:meth:`~mpca.algorithm.base.DriverRule.metrics`), taken only
        when scored; ``sps``: each agent's samples/s (:class:`SampleRate`); ``present``: how many agents the
        cycle had (membership; 0 for the initial model, before any agent)."""
        if self._busy.is_set():
            return False  # previous evaluation still running: skip rather than stall
        snap = [j.clone() for j in joints]
        weights = {a: r.weight for a, r in reports.items()}
        rates = {a: r.steps_per_s for a, r in reports.items()}
        resets = sum(r.resets for r in reports.values())
        sps = dict(sps or {})
        extra = metrics() if metrics is not None else {}
        self._busy.set()

        def work():
            try:
                for s, v in enumerate(snap):
                    self.bound.write(s, v)
                if self.calibration is not None:
                    recalibrate_batchnorm(self.model, self.calibration)
                r = evaluate(self.model, self.hx, self.hy, self.loss_fn)
                row = {"wall_s": wall, "cycle": cycle + 1, "holdout_error": r.error, "holdout_loss": r.loss,
                       "samples_per_s": float(sum(sps.values())) if sps else float("nan"), "epochs": epochs,
                       "agents": present, "resets": resets, "weight": weights, "agent_steps_per_s": rates, "agent_samples_per_s": sps, **extra, "_snapshot": snap}
                with self._lock:
                    self._ready.append(row)
            finally:
                self._busy.clear()

        self._thread = threading.Thread(target=work, name="mpca-eval", daemon=True)
        self._thread.start()
        return True

    def wait(self, timeout: float = 30.0) -> None:
        """Until the evaluation under way (if any) has finished."""
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self) -> List[dict]:
        with self._lock:
            out, self._ready = self._ready, []
        return out

    def close(self) -> None:
        self.wait()
