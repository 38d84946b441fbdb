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
    error: float  # classification error in [0, 1] (nan for regression): of every label (a sequence's: per token)
    loss: float  # the loss function's mean over the rows (cross-entropy: nats per label)


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn, batch_size: int = 1024) -> EvalResult:
    """The model's holdout error and loss on ``(x, y)`` in batches of ``batch_size`` rows.  Class-index labels
    may be one per row (``y``: (n,), the output (n, C)) or one per position (a sequence: ``y`` (n, T), the
    output (n, T, C)): the error is the share of labels whose arg-max class is wrong.  The loss is ``loss_fn``'s
    batch mean weighted by the batch's rows (every row holds as many labels)."""
    model.eval()
    if x.shape[0] == 0:
        return EvalResult(float("nan"), float("nan"))
    wrong, labels, loss_sum = 0, 0, 0.0
    classify = not y.is_floating_point()
    for lo in range(0, x.shape[0], batch_size):
        out = model(x[lo:lo + batch_size])
        yb = y[lo:lo + batch_size]
        loss_sum += float(loss_fn(out, yb)) * yb.shape[0]
        if classify:
            wrong += int((out.argmax(dim=-1) != yb).sum())
            labels += yb.numel()
    n = x.shape[0]
    return EvalResult(wrong / labels if classify else float("nan"), loss_sum / n)


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
    """Scores snapshots of the joint model in a thread, so the pipeline never waits for it.

    :meth:`submit` takes a snapshot and queues it: one is scored while one more waits, the oldest kept, so a
    due score is late by at most one scoring, never by a whole cycle; a submission while both places are taken
    is skipped (returns False) rather than stalling the pipeline or holding more copies of the model.  The
    holdout may come after the first submissions (:meth:`set_holdout`: the agents set it aside as their rows
    arrive); they wait for it, each scored as the model was when it was taken and reported under that wall
    time.  :meth:`drain` returns the finished history rows, each with the snapshot it scored under
    ``"_snapshot"`` (the trainer keeps the one that met the target)."""

    DEPTH = 2  # snapshots held at once: the one being scored and the one due next

    def __init__(self, model: torch.nn.Module, bound, buffers: str, loss_fn,
                 calibration: Optional[torch.Tensor] = None):
        self.model = copy.deepcopy(model)
        self.calibration = calibration  # training inputs for BatchNorm statistics (buffers="local")
        self.bound = bound.layout.bind_module(self.model, buffers)
        self.loss_fn = loss_fn
        self._holdout: Optional[tuple] = None
        self._cond = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._scoring = False
        self._closed = False
        self._error: Optional[BaseException] = None
        self._ready: List[dict] = []
        self._thread = threading.Thread(target=self._work, name="mpca-eval", daemon=True)
        self._thread.start()

    @property
    def has_holdout(self) -> bool:
        return self._holdout is not None

    def set_holdout(self, hx: torch.Tensor, hy: torch.Tensor) -> None:
        """The rows every snapshot is scored on; the snapshots queued before they came are scored now."""
        with self._cond:
            self._holdout = (hx, hy)
            self._cond.notify_all()

    def submit(self, joints, cycle: int, wall: float, reports, epochs: float = float("nan"),
               metrics: Optional[Callable[[], Dict[str, float]]] = None,
               sps: Optional[Dict[int, float]] = None, present: int = 0) -> bool:
        """Queue ``joints`` for scoring (skipped while :attr:`DEPTH` snapshots are held: returns False);
        ``metrics``: the algorithm's own figures (:meth:`~mpca.algorithm.base.DriverRule.metrics`), taken only
        when queued; ``sps``: each agent's samples/s (:class:`SampleRate`); ``present``: how many agents the
        cycle had (membership; 0 for the initial model, before any agent)."""
        with self._cond:
            if self._closed or len(self._queue) + self._scoring >= self.DEPTH:
                return False
        row = {"wall_s": wall, "cycle": cycle + 1, "holdout_error": float("nan"), "holdout_loss": float("nan"),
               "samples_per_s": float(sum(sps.values())) if sps else float("nan"),
               "epochs": epochs, "agents": present, "resets": sum(r.resets for r in reports.values()),
               "weight": {a: r.weight for a, r in reports.items()},
               "agent_steps_per_s": {a: r.steps_per_s for a, r in reports.items()},
               "agent_samples_per_s": dict(sps or {}), **(metrics() if metrics is not None else {}),
               "_snapshot": [j.clone() for j in joints]}
        with self._cond:
            self._queue.append(row)
            self._cond.notify_all()
        return True

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (self._queue and self._holdout is not None))
                if not (self._queue and self._holdout is not None):
                    return  # closed, and nothing left that can be scored
                row, (hx, hy) = self._queue.popleft(), self._holdout
                self._scoring = True
            try:
                for s, v in enumerate(row["_snapshot"]):
                    self.bound.write(s, v)
                if self.calibration is not None:
                    recalibrate_batchnorm(self.model, self.calibration)
                r = evaluate(self.model, hx, hy, self.loss_fn)
                row.update(holdout_error=r.error, holdout_loss=r.loss)
            except BaseException as e:  # the run reports it (drain): a curve that silently stops is worse
                row, self._error = None, e
            with self._cond:
                if row is not None:
                    self._ready.append(row)
                self._scoring = False
                self._cond.notify_all()

    def wait(self, timeout: float = 30.0) -> None:
        """Until every queued snapshot that can be scored (the holdout is there) has been."""
        with self._cond:
            self._cond.wait_for(lambda: self._holdout is None or not (self._queue or self._scoring), timeout)

    def drain(self) -> List[dict]:
        """The finished rows, in the order their snapshots were taken; raises what a scoring raised."""
        with self._cond:
            if self._error is not None:
                raise self._error
            out, self._ready = self._ready, []
        return out

    def close(self, timeout: float = 30.0) -> None:
        """Score what is queued, where the holdout is there, then stop the thread."""
        self.wait(timeout)
        with self._cond:
            self._closed = True
            self._queue.clear()  # what is left could not be scored in time, or never can (no holdout)
            self._cond.notify_all()
        self._thread.join(timeout)
