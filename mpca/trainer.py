"""The user API: ``Trainer(model_fn, loss_fn, optimizer_fn, agents=2, algorithm="mpca").fit(df)``.

``model_fn``, ``loss_fn`` and ``optimizer_fn`` are shipped to executors with
cloudpickle (define them at module top level, or as lambdas/closures that
only capture picklable values).  Every other option is a setting of
:class:`mpca.config.Settings` — the object a YAML configuration maps to —
given whole (``settings=``) or as keywords (``agents=2``, ``max_cycles=30``,
``algorithm="sync"``, ``stop={"target_error": 0.05}``).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

import torch

from mpca.algorithm import DriverRule
from mpca.checkpoint import due as checkpoint_due
from mpca.config import Settings, settings_from
from mpca.errors import RunFailedError, UserError
from mpca.evaluation import BackgroundEvaluator, EvalResult, SampleRate, evaluate
from mpca.exchange.schedule import ExchangeEvent
from mpca.observers import OnCycle, RunObserver, observer_of
from mpca.runtime.reports import RunCounters
from mpca.runtime.timeline import Timeline
from mpca.stopping import LN2, StopRules, metric_column

log = logging.getLogger("mpca.trainer")


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` returns: the model, its curve and the run's own record."""

    model: torch.nn.Module
    history: "object"  # pandas.DataFrame: one row per evaluation of the joint model (and the final one)
    timeline: Timeline  # every exchange cycle (mpca.runtime.timeline)
    agents: List[dict]  # each agent's own summary at the end (steps, samples, pid, ...)
    cycles: int
    wall_s: float
    stop_reason: str
    final: EvalResult
    run_id: str
    algorithm: str
    layout: str  # how the model was cut into shards
    first_cycle: int  # > 0 when resumed from a checkpoint
    counters: RunCounters  # Spark jobs and broadcasts by purpose, the job group, parameter-service bytes
    driver_rule: DriverRule  # the algorithm's driver side after the run (its joint model and state)
    agents_up_s: Optional[float] = None  # wall time (same clock as the history) when every agent had answered
    first_exchange_s: Optional[float] = None  # when the first cycle had handed every agent a shard of the joint model
    first_exchange_job_end_s: Optional[float] = None  # when that cycle's job ended (its reduce too), on the driver
    prepare_s: Optional[float] = None  # the driver's work between fit's call and the clock's 0 (the model, the first
    # rows' check; the holdout's read where the agents do not set it aside, mpca.data.holdout)
    startup: Dict[int, Dict[str, float]] = field(default_factory=dict)  # per agent: AgentRun.startup_phases
    holdout_missing: List[int] = field(default_factory=list)  # agents whose holdout rows never came: scored without
    # what the exchange core's schedule did, in order (mpca.exchange.schedule.ExchangeEvent; the latest 10,000)
    exchange_events: List[ExchangeEvent] = field(default_factory=list)


class Trainer:
    """Train a PyTorch model with the chosen algorithm (MPCA SGD by default) on the active classic Spark session.

    ``on_cycle(row)`` is called on the driver with every new history row (an evaluation of the joint
    model: ``wall_s``, ``cycle``, ``holdout_error``, ``holdout_loss``, ``samples_per_s``, ``epochs`` …); an
    :class:`~mpca.observers.RunObserver` (the trackers of :mod:`mpca.tracking`: MLflow, TensorBoard) also hears
    ``start(settings)`` before the agents start and ``finish(result)`` when the fit ends (None: it failed).
    """

    def __init__(self, model_fn: Callable[[], torch.nn.Module], loss_fn: Callable, optimizer_fn: Callable,
                 settings: Optional[Settings | Mapping] = None, *, spark=None, on_cycle: OnCycle = None,
                 **options):
        for name, fn in (("model_fn", model_fn), ("loss_fn", loss_fn), ("optimizer_fn", optimizer_fn)):
            if not callable(fn):
                raise ValueError(f"{name} must be callable, got {type(fn).__name__}")
        self.model_fn, self.loss_fn, self.optimizer_fn = model_fn, loss_fn, optimizer_fn
        if isinstance(settings, Mapping):  # the sections as the YAML file spells them: {"training": {...}, ...}
            settings, options = None, {**settings, **options}
        elif settings is not None and not isinstance(settings, Settings):
            raise UserError(f"settings is a mpca.Settings or a mapping of its sections, got {type(settings).__name__}")
        self.settings = settings_from(settings, **options) if options or settings is None else settings
        observer_of(on_cycle)  # a mistake found here, not after the agents started
        self.spark, self.on_cycle = spark, on_cycle
        self.stop_requested = threading.Event()

    def request_stop(self) -> None:
        """Stop after the current cycle (from another thread, a signal handler or a notebook callback); the
        run still returns its model, final checkpoint and history, with ``stop_reason="interrupted"``."""
        self.stop_requested.set()

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

    def _split(self, df, holdout=None):
        """(training rows, holdout features, holdout labels): :meth:`_frames` and :meth:`_holdout` at once."""
        _, train, hold = self._frames(df, holdout)
        return (train, *self._holdout(hold))

    def _frames(self, df, holdout=None):
        """(every row, train, holdout) DataFrames of ``df``'s features and label (ML vectors as arrays): the
        split by each row's hash, no job; or ``df`` whole and the ``holdout`` given."""
        d = self.settings.data
        df = self._columns(df)
        if holdout is not None:  # the user's own split (e.g. by file: mpca.data.text)
            holdout = self._columns(holdout)
            return df.select(d.features, d.label), df.select(d.features, d.label), holdout
        from mpca.data.split import hash_split

        if d.holdout > 0:  # by the rows' content: no per-partition sort as randomSplit needs (mpca.data.split)
            train, hold = hash_split(df, d.features, d.label, d.holdout, self.settings.seed)
        else:
            train, hold = df, df.limit(0)
        return df.select(d.features, d.label), train.select(d.features, d.label), hold

    def _columns(self, df):
        """``df`` checked for the features and label columns, ML vectors turned into arrays."""
        from mpca.data.checks import check_columns

        d = self.settings.data
        check_columns(df.columns, d.features, d.label)
        from pyspark.ml.linalg import VectorUDT

        if isinstance(df.schema[d.features].dataType, VectorUDT):  # ML vectors → array<float>
            from pyspark.ml.functions import vector_to_array

            df = df.withColumn(d.features, vector_to_array(d.features, "float32"))
        return df

    def _holdout(self, hold):
        """The holdout rows the driver scores on, as tensors (a Spark job: a scan of the data)."""
        from mpca.compat import to_arrow
        from mpca.data.checks import tensors
        from mpca.data.split import evaluation_rows

        d = self.settings.data
        table = to_arrow(evaluation_rows(hold, d.features, d.label, self.settings.seed, d.holdout_max_rows))
        return tensors(table, d.features, d.label, d.input_shape)

    def _calibration(self, model, train_df) -> Optional[torch.Tensor]:
        """Training inputs for BatchNorm statistics when the agents keep theirs (``buffers="local"``) or the joint
        model's are re-estimated before scoring (``buffers="recalibrate"``): the first
        rows, read as ``DataFrame.take`` reads them (:func:`mpca.compat.take_arrow`), not every partition's."""
        from mpca.evaluation import has_batchnorm

        if self.settings.algorithm.buffers == "average" or not has_batchnorm(model):
            return None
        from mpca.compat import take_arrow
        from mpca.data.checks import tensors

        d, rows = self.settings.data, self.settings.eval.calibration_rows
        return tensors(take_arrow(train_df.select(d.features, d.label), rows), d.features, d.label, d.input_shape)[0]

    def restore(self, model, specs):
        """Apply ``checkpoint.init_from`` / ``checkpoint.resume`` to the driver's ``model`` (its shard ``specs``:
        name, size, dtype); return the checkpoint resumed from (or None).  A Connect run's coordinator that
        Spark started again resumes through it (:mod:`mpca.connect.coordinator`)."""
        from mpca import checkpoint

        ck_set, algo = self.settings.checkpoint, self.settings.algorithm
        if ck_set.init_from:
            state = checkpoint.load_model_state(ck_set.init_from)
            try:
                model.load_state_dict(state)
            except RuntimeError as e:
                raise UserError(f"init_from {ck_set.init_from!r} does not fit this model: {str(e).splitlines()[0]}") from None
        if not ck_set.resume:
            return None
        ck = checkpoint.latest(ck_set.dir)
        if ck is None:
            log.info("resume: no valid checkpoint in %s, starting fresh", ck_set.dir)
            return None
        if ck.algorithm != algo.name:
            raise UserError(f"checkpoint {ck.path} was written by algorithm {ck.algorithm!r}, not {algo.name!r}; "
                            f"resume with algorithm.name={ck.algorithm} or start from it with checkpoint.init_from")
        if ck.shards != algo.num_shards or [tuple(x) for x in ck.layout] != specs:
            raise UserError(f"checkpoint {ck.path} was written for another model or shard count "
                            f"({ck.shards} shards); resume with the same model and shards")
        model.load_state_dict(ck.model_state)
        log.info("resuming from %s at cycle %d", ck.path, ck.cycle)
        return ck

    def _snapshot(self, run, model, cycle: int, specs, wall: float):
        """A checkpoint: the driver rule's state, and the driver model's state with its exchanged tensors
        replaced by the joint model."""
        from mpca.checkpoint import Checkpoint

        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        bound = run.layout.bind([state[name] for name, _, _ in specs])
        for s, v in enumerate(run.joint_vectors()):
            bound.write(s, v)
        driver_state, pending = run.checkpoint_state()
        return Checkpoint(cycle=cycle, algorithm=self.settings.algorithm.name, driver_state=driver_state,
                          pending=pending, wire=run.wire_state(), cycle_times=run.cycle_times(),
                          model_state=state, layout=specs, shards=run.layout.num_shards, wall_s=wall)

    # ------------------------------------------------------------------ fit
    def fit(self, df, holdout=None) -> FitResult:
        """Train on ``df`` (``data.features``, ``data.label``) until a ``stop`` rule holds.  The holdout the
        joint model is scored on is ``holdout`` where given (a DataFrame of the same columns: a split of the
        user's, e.g. by file or by time), else ``data.holdout`` of ``df``'s rows by their hash.

        On a Spark Connect session (Databricks standard or serverless compute, any ``sc://`` client) the run's
        driver side goes into the cluster as a coordinator task, and progress and the result come back through
        ``cluster.connect_dir`` (:mod:`mpca.connect`)."""
        from mpca.runtime.cluster import is_connect

        called = time.time()
        spark = self._session()
        if is_connect(spark):
            from mpca.connect.client import fit_over_connect

            return fit_over_connect(self, spark, df, holdout, called)
        from mpca.runtime.run import AgentRun

        prep = self.prepare(df, holdout, called)
        observer = observer_of(self.on_cycle)
        observer.start(self.settings)  # a tracker (mpca.tracking): params before the run
        return self.run_prepared(prep, observer, lambda: AgentRun(
            spark, prep.agents_df, model=prep.model, model_fn=self.model_fn, loss_fn=self.loss_fn,
            optimizer_fn=self.optimizer_fn, settings=self.settings, resume_from=prep.checkpoint,
            classes=prep.classes, holdout_on_agents=prep.on_agents))

    def prepare(self, df, holdout, called: float) -> "Prepared":
        """Everything before the agents start, on the driver (or a Connect client): the model (restored from a
        checkpoint where asked), the frames and the rows' check, the holdout where the driver reads it, the
        agents' DataFrame."""
        from mpca.data.checks import NO_ROWS, check_dataframe, check_schema
        from mpca.data.holdout import with_row_hash

        st = self.settings
        torch.manual_seed(st.seed)
        model = self.model_fn()
        layout = st.algorithm.shard_layout(model)
        specs = [(t.name, t.numel, str(t.dtype)) for t in layout.specs]
        ck = self.restore(model, specs)
        rows_df, train_df, hold_df = self._frames(df, holdout)
        d = st.data
        # The agents set the holdout aside as their rows arrive (mpca.data.holdout: the driver's own read of it
        # was a second scan of every row), except in an elastic run, whose agents may come later, or without an
        # input shape (the rows' width comes from the data): the driver reads it first, as before.
        on_agents = holdout is None and not st.training.elastic and d.holdout > 0 and bool(d.input_shape)
        if _no_partitions(train_df):  # limit(0), an empty local relation: known without a job
            raise UserError(NO_ROWS)
        fns = (self.model_fn, self.loss_fn, self.optimizer_fn)
        # no row read before the agents' job where the rows' shape is given: the agents check every row they load
        classes = (check_schema(train_df.schema, d.features, d.label, d.input_shape, *fns) if d.input_shape else
                   check_dataframe(train_df, d.features, d.label, d.input_shape, *fns, full=False))
        holdout_rows = _HoldoutRows(classes, d.label, self._calibration(model, train_df))
        if not on_agents:
            holdout_rows.take(*self._holdout(hold_df))
        agents_df = with_row_hash(rows_df, d.features, d.label, st.seed) if on_agents else train_df
        return Prepared(model, specs, ck, classes, holdout_rows, on_agents, agents_df, called)

    def run_prepared(self, prep: "Prepared", observer: RunObserver, start_run: Callable[[], object]) -> FitResult:
        """The run itself, from the agents' start (``start_run()``: an :class:`~mpca.runtime.run.AgentRun`) to
        the result: cycles until a stop rule holds, evaluations, checkpoints, the final model; on the classic
        driver, or inside the cluster as a Connect run's coordinator (:mod:`mpca.connect.coordinator`)."""
        from mpca.checkpoint import BackgroundSaver
        from mpca.progress import Progress

        st, model, specs, ck = self.settings, prep.model, prep.specs, prep.checkpoint
        first_cycle, prior_wall = (ck.cycle, ck.wall_s) if ck else (0, 0.0)
        holdout_rows = prep.holdout_rows
        run = start_run()
        initial = run.joint_vectors()  # the curve's first point: the model before any agent steps
        t0 = time.time() - prior_wall
        out = _Outcome(history=[], first_cycle=first_cycle, t0=t0, cycles=first_cycle,
                       prepare_s=time.time() - prep.called)
        # scores queue from the start and wait for the holdout where the agents set it aside (mpca.evaluation)
        evaluator = BackgroundEvaluator(model, run.bound, st.algorithm.buffers, self.loss_fn, holdout_rows.calibration)
        if first_cycle == 0:  # the starting point of the curve: the initial model, before any agent stepped
            evaluator.submit(initial, -1, 0.0, {}, 0.0, run.metrics)
        saver = BackgroundSaver(st.checkpoint.dir, st.checkpoint.keep)
        progress = Progress(st.progress, st.stop.target, metric=st.eval.metric)
        loop = _RunLoop(self, run, out, evaluator, holdout_rows, observer,
                        lambda cycles, wall: saver.submit(self._snapshot(run, model, cycles, specs, wall)), progress)
        try:
            with run:
                loop.until_stop()
        except BaseException:
            observer.finish(None)  # the tracker's run ends as failed
            raise
        finally:
            evaluator.close()
            saver.close()
            progress.close()
        result = self._finish(run, model, specs, saver, out, holdout_rows.x, holdout_rows.y, holdout_rows.calibration)
        observer.finish(result)
        return result

    def _with_bits(self, row: dict) -> dict:
        """``holdout_bits`` beside the loss in nats where the metric is the loss (bits per token of an LM)."""
        if self.settings.eval.metric == "loss":
            row["holdout_bits"] = row["holdout_loss"] / LN2
        return row

    def _eval_due(self, cycles_in_run: int, last_eval: float) -> bool:
        """Every ``eval.every_cycles``-th cycle, and before that after cycles 1, 2, 4, 8 … (the early descent
        of the curve); or ``eval.every_seconds`` after the last evaluation."""
        ev = self.settings.eval
        done = cycles_in_run + 1
        early = ev.every_cycles is not None and done < ev.every_cycles and done & (done - 1) == 0
        due = early or ev.every_cycles is not None and cycles_in_run % ev.every_cycles == ev.every_cycles - 1
        return due or (ev.every_seconds is not None and time.time() - last_eval >= ev.every_seconds)

    def _finish(self, run, model, specs, saver, out: "_Outcome", hx, hy, calibration=None) -> FitResult:
        """The final model (the evaluated snapshot that met the target, else the joint model after the last
        reduction; BatchNorm statistics recalibrated when the agents kept theirs), the final checkpoint and
        evaluation, and the result."""
        import pandas as pd

        from mpca.evaluation import recalibrate_batchnorm

        for s, vec in enumerate(out.winner if out.winner is not None else run.joint_vectors()):
            run.bound.write(s, vec)
        if calibration is not None:
            recalibrate_batchnorm(model, calibration)
        if self.settings.checkpoint.dir:
            saver.write(self._snapshot(run, model, out.cycles, specs, time.time() - out.t0))
        final = evaluate(model, hx, hy, self.loss_fn)
        wall = time.time() - out.t0
        rules = StopRules(self.settings.stop, out.t0, metric=self.settings.eval.metric)
        stop_reason = rules.target_reason if rules.target_met(getattr(final, rules.metric)) else out.stop_reason
        history = out.history
        last = history[-1] if history else {}
        history.append(self._with_bits({
            "wall_s": wall, "cycle": out.cycles, "holdout_error": final.error, "holdout_loss": final.loss,
            "samples_per_s": last.get("samples_per_s", float("nan")), "epochs": last.get("epochs", float("nan")),
            "weight": {}, "agent_samples_per_s": {}}))
        return FitResult(model=model.cpu(), history=pd.DataFrame(history), timeline=run.timeline,
                         agents=run.summaries, cycles=out.cycles, wall_s=wall, stop_reason=stop_reason, final=final,
                         run_id=run.run_id, algorithm=self.settings.algorithm.name, layout=run.layout.describe(),
                         first_cycle=out.first_cycle, counters=run.counters(), driver_rule=run.rule,
                         agents_up_s=out.agents_up_s, first_exchange_s=out.first_exchange_s,
                         first_exchange_job_end_s=out.first_exchange_job_end_s, prepare_s=out.prepare_s,
                         startup=out.startup, holdout_missing=out.holdout_missing,
                         exchange_events=run.exchange_events())


class _HoldoutRows:
    """The rows the joint model is scored on (features ``x``, labels ``y``), checked against the model's classes as
    they arrive — read by the driver before the run, or handed over by the agents that set them aside — and the
    training rows that re-estimate BatchNorm statistics (``calibration``)."""

    def __init__(self, classes: Optional[int], label: str, calibration: Optional[torch.Tensor]):
        self.classes, self.label, self.calibration = classes, label, calibration
        self.x: Optional[torch.Tensor] = None
        self.y: Optional[torch.Tensor] = None

    def take(self, x: torch.Tensor, y: torch.Tensor) -> None:
        from mpca.data.checks import labels_problem

        problem = labels_problem(y, self.classes, self.label)  # the holdout is on the driver: all of it
        if problem:
            raise UserError(f"{problem} (found in the holdout rows)")
        self.x, self.y = x, y

    @property
    def here(self) -> bool:
        return self.x is not None


class _RunLoop:
    """The cycles of one fit: a cycle of the agents' run, then what follows it — the first useful exchange noted,
    the joint model queued for evaluation when due, a checkpoint when due (``checkpoint``), the progress line, each
    new history row to the observer, the stop rules — until one of them says stop; ``out`` holds how it went."""

    def __init__(self, trainer: "Trainer", run, out: "_Outcome", evaluator: BackgroundEvaluator,
                 holdout: _HoldoutRows, observer: RunObserver, checkpoint: Callable[[int, float], None], progress):
        st = trainer.settings
        self.trainer, self.st, self.run, self.out = trainer, st, run, out
        self.evaluator, self.holdout, self.observer = evaluator, holdout, observer
        self.checkpoint, self.progress = checkpoint, progress
        self.metric = st.eval.metric
        self.stop = StopRules(st.stop, out.t0, trainer.stop_requested, self.metric)
        self.rate = SampleRate()
        self.last_eval, self.eval_wanted = time.time(), False
        self.last_checkpoint = time.time()

    def holdout_ready(self, wait_s: float = 0.0, partial: bool = False) -> bool:
        """Whether the evaluator has the holdout: the agents set it aside as their rows arrive, so each is asked
        once it has all of them, or after ``wait_s`` of asking; with ``partial`` (the run's end), the rows of
        the agents that handed theirs over when some never did, with a warning naming the others."""
        if self.evaluator.has_holdout:
            return True
        if not self.holdout.here:
            got = self.run.holdout_rows(wait_s, partial)
            if got is None or (got[2] and not len(got[1])):  # none at all, or none of those that answered
                return False
            x, y, missing = got
            if missing:
                log.warning("the holdout rows of agent(s) %s never came (their executors lost, not replaced "
                            "within %.0fs): the run is scored on the %d rows of the others", missing, wait_s, len(y))
                self.out.holdout_missing = missing
            self.holdout.take(x, y)
        self.evaluator.set_holdout(self.holdout.x, self.holdout.y)
        return True

    def until_stop(self) -> None:
        """Cycle until a stop rule holds, then take the evaluations still queued."""
        from mpca.data.checks import NO_ROWS

        out, run, st = self.out, self.run, self.st
        out.agents_up_s = time.time() - out.t0
        out.startup = run.startup_phases(out.t0)
        rows = sum(int(r.rows or 0) for r in run.agent_info.values())  # there yet: some may still arrive
        if rows == 0 and not st.training.elastic:  # every row went to the holdout (a tiny data set)
            raise UserError(NO_ROWS)
        self.rate.observe(run.agent_info)  # the agents' counts at start: a rate from the first cycle on
        c = out.first_cycle
        while out.stop_reason is None:
            rec = run.cycle(c)
            self.after(c, rec)
            # optional throttle: fewer cycles leave more CPU to the agents where cores are shared
            time.sleep(max(0.0, st.algorithm.cycle_interval_s - (time.time() - rec.t_submit)))
            c += 1
        if not self.holdout_ready(st.cluster.agent_start_timeout_s, partial=True):  # no agent's rows arrived
            raise RunFailedError(f"no agent's holdout rows arrived within "
                                 f"{st.cluster.agent_start_timeout_s:.0f}s of the run's end; check the "
                                 "executors' logs")
        self.evaluator.close()  # the scores still queued (those taken before the holdout came, where it came late)
        self.rows(final=True)

    def after(self, c: int, rec) -> None:
        """What follows cycle ``c`` (its record ``rec``)."""
        out, run, t0 = self.out, self.run, self.out.t0
        out.cycles = c + 1
        if out.first_exchange_s is None and rec.bcast_shard is not None and rec.delivered:
            # the pipeline's first useful exchange: when the last agent held the shard (with one exchange task per
            # agent the job then goes on to reduce the cycle's shard)
            out.first_exchange_s = rec.delivered_at() - t0
            out.first_exchange_job_end_s = rec.t_end - t0
        reports = run.latest_reports()
        rows = sum(int(r.rows or 0) for r in {**run.agent_info, **reports}.values())
        samples = sum(int(r.samples or 0) for r in reports.values())
        epochs = samples / rows if rows else 0.0
        sps = self.rate.observe(reports)
        membership = run.membership()  # (agents present, agents the run has now)
        self.eval_wanted = self.eval_wanted or self.trainer._eval_due(c - out.first_cycle, self.last_eval)
        # the holdout's control jobs wait until the pipeline's first useful exchange (or its fill's two cycles, for
        # the algorithms without one): they must not delay it
        if out.first_exchange_s is not None or c - out.first_cycle >= 2:
            self.holdout_ready()  # the copies due before it wait for it in the evaluator
            if self.eval_wanted and self.evaluator.submit(run.joint_vectors(), c, time.time() - t0, rec.agents,
                                                          epochs, run.metrics, sps, present=membership[0]):
                self.last_eval, self.eval_wanted = time.time(), False  # one it had no room for: next cycle
        ck = self.st.checkpoint
        if ck.dir and checkpoint_due(out.cycles, ck.every_cycles, time.time() - self.last_checkpoint, ck.every_seconds):
            self.checkpoint(out.cycles, time.time() - t0)
            self.last_checkpoint = time.time()
        self.progress.update(out.cycles, None, sum(sps.values()) if sps else None, agents=membership)
        met = self.rows()
        out.stop_reason = self.stop.reason(out.cycles, epochs, met)

    def rows(self, final: bool = False) -> bool:
        """The evaluations done since the last call, into the history, the progress line and the observer;
        whether one met the target (its joint model becomes the winner; ``final``: after the run, no more)."""
        met = False
        column = metric_column(self.metric)
        for row in self.evaluator.drain():
            snapshot = row.pop("_snapshot")
            self.trainer._with_bits(row)
            self.out.history.append(row)
            if not final:
                self.progress.update(self.out.cycles, row[column], row["samples_per_s"])
            self.observer(row)
            if not final and not met and self.stop.target_met(row[column]):
                met, self.out.winner = True, snapshot  # the joint model that met the target
        return met


def _no_partitions(df) -> bool:
    """Whether ``df`` has no partitions at all (``limit(0)``, an empty local relation), known without a job; a
    Connect DataFrame has no RDD to ask: its rows are counted where they are read."""
    from mpca.runtime.cluster import is_connect

    return not is_connect(df) and df.rdd.getNumPartitions() == 0


@dataclass
class Prepared:
    """What :meth:`Trainer.prepare` hands to the run: the driver's model (its shard specs, the checkpoint it was
    restored from), the model's class count, the holdout rows, whether the agents set the holdout aside, the
    agents' DataFrame and when ``fit`` was called."""

    model: torch.nn.Module
    specs: list
    checkpoint: object
    classes: Optional[int]
    holdout_rows: "_HoldoutRows"
    on_agents: bool
    agents_df: object
    called: float


@dataclass
class _Outcome:
    """How the cycles of one fit went: what :meth:`Trainer._finish` builds the result from."""

    history: List[dict]
    first_cycle: int
    t0: float
    cycles: int = 0
    stop_reason: Optional[str] = None
    winner: Optional[List[torch.Tensor]] = None  # the evaluated snapshot that met the target
    agents_up_s: Optional[float] = None
    first_exchange_s: Optional[float] = None
    first_exchange_job_end_s: Optional[float] = None
    prepare_s: Optional[float] = None
    startup: Dict[int, Dict[str, float]] = field(default_factory=dict)
    holdout_missing: List[int] = field(default_factory=list)
