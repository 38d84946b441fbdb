"""The user API: ``Trainer(model_fn=..., loss_fn=..., optimizer_fn=..., agents=K).fit(df)``.

``model_fn``, ``loss_fn`` and ``optimizer_fn`` are shipped to executors with
cloudpickle (define them at module top level, or as lambdas/closures that
only capture picklable values).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from mpca.algorithm import MPCAHyper
from mpca.algorithm.sharding import BUFFER_MODES
from mpca.errors import UserError
from mpca.evaluation import EvalResult, evaluate
from mpca.runtime.run import AgentRun
from mpca.runtime.timeline import Timeline

log = logging.getLogger("mpca.trainer")


@dataclass
class FitResult:
    model: torch.nn.Module
    history: "object"  # pandas.DataFrame
    timeline: Timeline
    agents: List[dict]
    cycles: int
    wall_s: float
    stop_reason: str
    final: Optional[EvalResult] = None
    extra: Dict[str, object] = field(default_factory=dict)


def _positive(name: str, v, allow_none: bool = False, integer: bool = False):
    if v is None and allow_none:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    if integer:
        ok = ok and isinstance(v, int)
    if not ok:
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got {v!r}")


class Trainer:
    """Train a PyTorch model with MPCA SGD on the active (classic) Spark session."""

    def __init__(self, model_fn: Callable[[], torch.nn.Module], loss_fn: Callable, optimizer_fn: Callable,
                 *, agents: int = 2, shards: int = 3, hyper: Optional[MPCAHyper] = None, batch_size: int = 64,
                 input_shape: Sequence[int] = (), features: str = "features", label: str = "label",
                 buffers: str = "average", holdout: float = 0.1, eval_every_cycles: int = 5,
                 max_cycles: Optional[int] = 100, max_seconds: Optional[float] = None,
                 target_error: Optional[float] = None, use_gpus: Optional[bool] = None, seed: int = 0,
                 executor_wait_s: float = 60.0, agent_start_timeout_s: float = 180.0,
                 spark=None, on_cycle: Optional[Callable[[dict], None]] = None):
        for name, fn in (("model_fn", model_fn), ("loss_fn", loss_fn), ("optimizer_fn", optimizer_fn)):
            if not callable(fn):
                raise ValueError(f"{name} must be callable, got {type(fn).__name__}")
        _positive("agents", agents, integer=True)
        _positive("shards", shards, integer=True)
        _positive("batch_size", batch_size, integer=True)
        _positive("eval_every_cycles", eval_every_cycles, integer=True)
        _positive("max_cycles", max_cycles, allow_none=True, integer=True)
        _positive("max_seconds", max_seconds, allow_none=True)
        if buffers not in BUFFER_MODES:
            raise ValueError(f"buffers must be one of {BUFFER_MODES}, got {buffers!r}")
        if not 0.0 <= holdout < 1.0:
            raise ValueError(f"holdout must lie in [0, 1), got {holdout!r}")
        if target_error is not None and not 0.0 <= target_error <= 1.0:
            raise ValueError(f"target_error must lie in [0, 1], got {target_error!r}")
        if max_cycles is None and max_seconds is None and target_error is None:
            raise ValueError("give at least one stop criterion: max_cycles, max_seconds or target_error")
        self.model_fn, self.loss_fn, self.optimizer_fn = model_fn, loss_fn, optimizer_fn
        self.agents, self.shards, self.hyper = agents, shards, hyper or MPCAHyper()
        self.batch_size, self.input_shape = batch_size, tuple(input_shape)
        self.features, self.label, self.buffers = features, label, buffers
        self.holdout, self.eval_every_cycles = holdout, eval_every_cycles
        self.max_cycles, self.max_seconds, self.target_error = max_cycles, max_seconds, target_error
        self.use_gpus, self.seed = use_gpus, seed
        self.executor_wait_s, self.agent_start_timeout_s = executor_wait_s, agent_start_timeout_s
        self.spark, self.on_cycle = spark, on_cycle

    # ------------------------------------------------------------------ helpers
    def _session(self):
        if self.spark is not None:
            return self.spark
        from pyspark.sql import SparkSession

        s = SparkSession.getActiveSession()
        if s is None:
            raise UserError("no active SparkSession: create one (e.g. mpca.runtime.cluster.local_session()) "
                            "or pass spark=...")
        return s

    def _split(self, df):
        cols = set(df.columns)
        for c in (self.features, self.label):
            if c not in cols:
                raise UserError(f"column {c!r} not in the data (columns: {sorted(cols)}); set features=/label=")
        if self.holdout > 0:
            train, hold = df.randomSplit([1.0 - self.holdout, self.holdout], seed=self.seed)
        else:
            train, hold = df, df.limit(0)
        from mpca.data.arrow import batches_to_tensors

        table = hold.select(self.features, self.label).toArrow()
        hx, hy = batches_to_tensors(table.to_batches(), self.features, self.label, self.input_shape)
        return train.select(self.features, self.label), hx, hy

    # ------------------------------------------------------------------ fit
    def fit(self, df) -> FitResult:
        spark = self._session()
        torch.manual_seed(self.seed)
        model = self.model_fn()
        train_df, hx, hy = self._split(df)
        run = AgentRun(spark, train_df, model=model, model_fn=self.model_fn, loss_fn=self.loss_fn,
                       optimizer_fn=self.optimizer_fn, agents=self.agents, shards=self.shards, hyper=self.hyper,
                       buffers=self.buffers, batch_size=self.batch_size, input_shape=self.input_shape,
                       features=self.features, label=self.label, use_gpus=self.use_gpus, seed=self.seed,
                       executor_wait_s=self.executor_wait_s, agent_start_timeout_s=self.agent_start_timeout_s)
        history: List[dict] = []
        t0 = time.time()
        cycles_done, stop_reason = 0, "max_cycles"
        evaluator = _BackgroundEval(model, run.bound, self.buffers, hx, hy, self.loss_fn)
        try:
            with run:
                c = 0
                while True:
                    rec = run.cycle(c)
                    cycles_done = c + 1
                    if c % self.eval_every_cycles == self.eval_every_cycles - 1:
                        evaluator.submit(run.joint_vectors(), c, time.time() - t0, rec)
                    for row in evaluator.drain():
                        history.append(row)
                        if self.on_cycle:
                            self.on_cycle(row)
                        if self.target_error is not None and row["holdout_error"] <= self.target_error:
                            stop_reason = "target_error"
                    if stop_reason == "target_error":
                        break
                    if self.max_cycles is not None and cycles_done >= self.max_cycles:
                        stop_reason = "max_cycles"
                        break
                    if self.max_seconds is not None and time.time() - t0 >= self.max_seconds:
                        stop_reason = "max_seconds"
                        break
                    c += 1
        finally:
            evaluator.close()
        for s, vec in enumerate(run.joint_vectors()):
            run.bound.write(s, vec)
        final = evaluate(model, hx, hy, self.loss_fn)
        wall = time.time() - t0
        history.append({"wall_s": wall, "cycle": cycles_done, "holdout_error": final.error, "holdout_loss": final.loss,
                        "samples_per_s": history[-1]["samples_per_s"] if history else float("nan"),
                        "tau": {}, "agent_samples_per_s": {}})
        import pandas as pd

        pipe = run.pipeline
        return FitResult(model.cpu(), pd.DataFrame(history), run.timeline, run.summaries, cycles_done, wall,
                         stop_reason, final,
                         extra={"run_id": run.run_id, "jobs": dict(pipe.jobs), "job_group": pipe.job_group,
                                "layout": run.layout.describe()})


class _BackgroundEval:
    """Evaluates snapshots of the joint model in a thread, so the pipeline never waits for it."""

    def __init__(self, model, bound, buffers, hx, hy, loss_fn):
        import copy

        self.model = copy.deepcopy(model)
        self.bound = bound.layout.bind_module(self.model, buffers)
        self.hx, self.hy, self.loss_fn = hx, hy, loss_fn
        self._lock = threading.Lock()
        self._ready: List[dict] = []
        self._busy = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_samples: Dict[int, tuple] = {}

    def submit(self, joints, cycle: int, wall: float, rec) -> None:
        if self._busy.is_set():
            return  # previous evaluation still running: skip rather than stall
        snap = [j.clone() for j in joints]
        taus = {a: e.get("tau") for a, e in rec.agents.items()}
        rates = {a: e.get("steps_per_s") for a, e in rec.agents.items()}
        samples = {a: e.get("samples") for a, e in rec.agents.items()}
        now = time.time()
        sps = {}
        for a, n in samples.items():
            if n is None:
                continue
            prev = self._last_samples.get(a)
            if prev is not None and now > prev[0]:
                sps[a] = (n - prev[1]) / (now - prev[0])
            self._last_samples[a] = (now, n)
        self._busy.set()

        def work():
            try:
                for s, v in enumerate(snap):
                    self.bound.write(s, v)
                r = evaluate(self.model, self.hx, self.hy, self.loss_fn)
                row = {"wall_s": wall, "cycle": cycle + 1, "holdout_error": r.error, "holdout_loss": r.loss,
                       "samples_per_s": float(sum(sps.values())) if sps else float("nan"),
                       "tau": taus, "agent_steps_per_s": rates, "agent_samples_per_s": sps}
                with self._lock:
                    self._ready.append(row)
            finally:
                self._busy.clear()

        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def drain(self) -> List[dict]:
        with self._lock:
            out, self._ready = self._ready, []
        return out

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(30)
