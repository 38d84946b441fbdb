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

from mpca.algorithm import JointShard, MPCAHyper, ShardLayout
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
                 target_error: Optional[float] = None, max_epochs: Optional[float] = None,
                 eval_every_seconds: Optional[float] = None, use_gpus: Optional[bool] = None, seed: int = 0,
                 executor_wait_s: float = 60.0, agent_start_timeout_s: float = 180.0,
                 checkpoint_dir: Optional[str] = None, checkpoint_every: int = 20, checkpoint_keep: int = 3,
                 resume: bool = False, init_from: Optional[str] = None, progress: str = "off",
                 holdout_max_rows: int = 5000, min_cycle_interval_s: float = 0.0,
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
        _positive("max_epochs", max_epochs, allow_none=True)
        _positive("eval_every_seconds", eval_every_seconds, allow_none=True)
        _positive("checkpoint_every", checkpoint_every, integer=True)
        _positive("checkpoint_keep", checkpoint_keep, integer=True)
        if resume and checkpoint_dir is None:
            raise ValueError("resume=True needs checkpoint_dir")
        if buffers not in BUFFER_MODES:
            raise ValueError(f"buffers must be one of {BUFFER_MODES}, got {buffers!r}")
        if not 0.0 <= holdout < 1.0:
            raise ValueError(f"holdout must lie in [0, 1), got {holdout!r}")
        if target_error is not None and not 0.0 <= target_error <= 1.0:
            raise ValueError(f"target_error must lie in [0, 1], got {target_error!r}")
        if max_cycles is None and max_seconds is None and target_error is None and max_epochs is None:
            raise ValueError("give at least one stop criterion: max_cycles, max_seconds, max_epochs or target_error")
        self.model_fn, self.loss_fn, self.optimizer_fn = model_fn, loss_fn, optimizer_fn
        self.agents, self.shards, self.hyper = agents, shards, hyper or MPCAHyper()
        self.batch_size, self.input_shape = batch_size, tuple(input_shape)
        self.features, self.label, self.buffers = features, label, buffers
        self.holdout, self.eval_every_cycles = holdout, eval_every_cycles
        self.max_cycles, self.max_seconds, self.target_error = max_cycles, max_seconds, target_error
        self.use_gpus, self.seed = use_gpus, seed
        self.executor_wait_s, self.agent_start_timeout_s = executor_wait_s, agent_start_timeout_s
        self.max_epochs, self.eval_every_seconds = max_epochs, eval_every_seconds
        self.checkpoint_dir, self.checkpoint_every, self.checkpoint_keep = checkpoint_dir, checkpoint_every, checkpoint_keep
        self.resume, self.init_from, self.progress = resume, init_from, progress
        self.holdout_max_rows = holdout_max_rows
        if min_cycle_interval_s < 0:
            raise ValueError(f"min_cycle_interval_s must be >= 0, got {min_cycle_interval_s!r}")
        self.min_cycle_interval_s = min_cycle_interval_s
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
        from pyspark.ml.linalg import VectorUDT

        if isinstance(df.schema[self.features].dataType, VectorUDT):  # ML vectors → array<float>
            from pyspark.ml.functions import vector_to_array

            df = df.withColumn(self.features, vector_to_array(self.features, "float32"))
        if self.holdout > 0:
            train, hold = df.randomSplit([1.0 - self.holdout, self.holdout], seed=self.seed)
        else:
            train, hold = df, df.limit(0)
        from mpca.data.arrow import batches_to_tensors

        table = hold.select(self.features, self.label).limit(self.holdout_max_rows).toArrow()
        hx, hy = batches_to_tensors(table.to_batches(), self.features, self.label, self.input_shape)
        return train.select(self.features, self.label), hx, hy

    # ------------------------------------------------------------------ fit
    def _restore(self, model, layout_specs) -> tuple:
        """Apply init_from / resume to the driver's model; return (joint shards or None, first cycle, prior wall)."""
        from mpca import checkpoint

        if self.init_from:
            state = checkpoint.load_model_state(self.init_from)
            try:
                model.load_state_dict(state)
            except RuntimeError as e:
                raise UserError(f"init_from {self.init_from!r} does not fit this model: {str(e).splitlines()[0]}") from None
        if not self.resume:
            return None, 0, 0.0
        ck = checkpoint.latest(self.checkpoint_dir)
        if ck is None:
            log.info("resume: no valid checkpoint in %s, starting fresh", self.checkpoint_dir)
            return None, 0, 0.0
        if ck.shards != self.shards or [tuple(x) for x in ck.layout] != layout_specs:
            raise UserError(f"checkpoint {ck.path} was written for another model or shard count "
                            f"({ck.shards} shards); resume with the same model and algorithm.shards")
        model.load_state_dict(ck.model_state)
        joint = [JointShard(j, v, r) for j, v, r in zip(ck.joint, ck.velocity, ck.reductions)]
        log.info("resuming from %s at cycle %d", ck.path, ck.cycle)
        return joint, ck.cycle, ck.wall_s

    def fit(self, df) -> FitResult:
        from mpca.progress import Progress

        spark = self._session()
        torch.manual_seed(self.seed)
        model = self.model_fn()
        layout = ShardLayout.from_module(model, self.shards, self.buffers)
        specs = [(t.name, t.numel, str(t.dtype)) for t in layout.specs]
        joint, first_cycle, prior_wall = self._restore(model, specs)
        train_df, hx, hy = self._split(df)
        run = AgentRun(spark, train_df, model=model, model_fn=self.model_fn, loss_fn=self.loss_fn,
                       optimizer_fn=self.optimizer_fn, agents=self.agents, shards=self.shards, hyper=self.hyper,
                       buffers=self.buffers, batch_size=self.batch_size, input_shape=self.input_shape,
                       features=self.features, label=self.label, use_gpus=self.use_gpus, seed=self.seed,
                       executor_wait_s=self.executor_wait_s, agent_start_timeout_s=self.agent_start_timeout_s,
                       joint=joint)
        history: List[dict] = []
        progress = Progress(self.progress, self.target_error)
        t0 = time.time() - prior_wall
        cycles_done, stop_reason = first_cycle, "max_cycles"
        winner = None
        evaluator = _BackgroundEval(model, run.bound, self.buffers, hx, hy, self.loss_fn)
        saver = _BackgroundSaver()
        last_eval = time.time()
        try:
            with run:
                rows = sum(int(e.get("rows") or 0) for e in run.agent_info.values())
                c = first_cycle
                while True:
                    rec = run.cycle(c)
                    cycles_done = c + 1
                    samples = sum(int(e.get("samples") or 0) for e in run.pipeline.last_agent_reports.values())
                    epochs = samples / rows if rows else 0.0
                    due = (c - first_cycle) % self.eval_every_cycles == self.eval_every_cycles - 1
                    if self.eval_every_seconds is not None and time.time() - last_eval >= self.eval_every_seconds:
                        due = True
                    if due:
                        last_eval = time.time()
                        evaluator.submit(run.joint_vectors(), c, time.time() - t0, rec, epochs)
                    if self.checkpoint_dir and cycles_done % self.checkpoint_every == 0:
                        saver.submit(self.checkpoint_dir, self._snapshot(run, model, cycles_done, specs, time.time() - t0),
                                     self.checkpoint_keep)
                    progress.update(cycles_done, None, evaluator.samples_per_s)
                    for row in evaluator.drain():
                        snapshot = row.pop("_snapshot")
                        history.append(row)
                        progress.update(cycles_done, row["holdout_error"], row["samples_per_s"])
                        if self.on_cycle:
                            self.on_cycle(row)
                        if self.target_error is not None and row["holdout_error"] <= self.target_error:
                            stop_reason = "target_error"
                            winner = snapshot  # the joint model that met the target
                    if stop_reason == "target_error":
                        break
                    if self.max_cycles is not None and cycles_done >= self.max_cycles:
                        stop_reason = "max_cycles"
                        break
                    if self.max_seconds is not None and time.time() - t0 >= self.max_seconds:
                        stop_reason = "max_seconds"
                        break
                    if self.max_epochs is not None and epochs >= self.max_epochs:
                        stop_reason = "max_epochs"
                        break
                    # optional throttle: fewer cycles leave more CPU to the agents where cores are shared
                    time.sleep(max(0.0, self.min_cycle_interval_s - (time.time() - rec.t_submit)))
                    c += 1
        finally:
            evaluator.close()
            saver.close()
            progress.close()
        # the final model: the evaluated snapshot that met the target, else the joint model after the last reduction
        for s, vec in enumerate(winner if winner is not None else run.joint_vectors()):
            run.bound.write(s, vec)
        if self.checkpoint_dir:
            saver.write(self.checkpoint_dir, self._snapshot(run, model, cycles_done, specs, time.time() - t0),
                        self.checkpoint_keep)
        final = evaluate(model, hx, hy, self.loss_fn)
        wall = time.time() - t0
        if self.target_error is not None and final.error <= self.target_error:
            stop_reason = "target_error"
        history.append({"wall_s": wall, "cycle": cycles_done, "holdout_error": final.error, "holdout_loss": final.loss,
                        "samples_per_s": history[-1]["samples_per_s"] if history else float("nan"),
                        "epochs": history[-1]["epochs"] if history else float("nan"),
                        "tau": {}, "agent_samples_per_s": {}})
        import pandas as pd

        pipe = run.pipeline
        return FitResult(model.cpu(), pd.DataFrame(history), run.timeline, run.summaries, cycles_done, wall,
                         stop_reason, final,
                         extra={"run_id": run.run_id, "jobs": dict(pipe.jobs), "job_group": pipe.job_group,
                                "broadcasts": dict(pipe.broadcasts),
                                "layout": run.layout.describe(), "first_cycle": first_cycle})

    def _snapshot(self, run, model, cycle: int, specs, wall: float):
        """A checkpoint: the driver model's state with its exchanged tensors replaced by the joint shards."""
        from mpca.checkpoint import Checkpoint

        joints = [j.joint.clone() for j in run.pipeline.joint]
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        bound = run.layout.bind([state[name] for name, _, _ in specs])
        for s, v in enumerate(joints):
            bound.write(s, v)
        return Checkpoint(cycle=cycle, joint=joints, velocity=[j.velocity.clone() for j in run.pipeline.joint],
                          reductions=[j.reductions for j in run.pipeline.joint], model_state=state,
                          layout=specs, shards=self.shards, wall_s=wall)


class _BackgroundSaver:
    """Writes checkpoints in a thread (one at a time; a checkpoint due while one is written is skipped)."""

    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None
        self.written: List[str] = []

    def write(self, location, ckpt, keep) -> None:
        from mpca import checkpoint

        self.close()
        self.written.append(checkpoint.save(location, ckpt, keep))

    def submit(self, location, ckpt, keep) -> None:
        if self.error is not None:
            raise self.error
        if self._thread is not None and self._thread.is_alive():
            return

        def work():
            try:
                from mpca import checkpoint

                self.written.append(checkpoint.save(location, ckpt, keep))
            except BaseException as e:  # noqa: BLE001 - re-raised on the next submit
                self.error = e

        self._thread = threading.Thread(target=work, name="mpca-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()


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

    samples_per_s = None

    def submit(self, joints, cycle: int, wall: float, rec, epochs: float = float("nan")) -> None:
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
        if sps:
            self.samples_per_s = float(sum(sps.values()))
        self._busy.set()

        def work():
            try:
                for s, v in enumerate(snap):
                    self.bound.write(s, v)
                r = evaluate(self.model, self.hx, self.hy, self.loss_fn)
                row = {"wall_s": wall, "cycle": cycle + 1, "holdout_error": r.error, "holdout_loss": r.loss,
                       "samples_per_s": float(sum(sps.values())) if sps else float("nan"), "epochs": epochs,
                       "tau": taus, "agent_steps_per_s": rates, "agent_samples_per_s": sps}
                row["_snapshot"] = snap
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
