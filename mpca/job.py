"""A training job from a :class:`~mpca.config.JobConfig`: session, data, Trainer, outputs, exit code.

Used by ``mpca train`` and ``spark-submit spark_jobs/train.py``.  Outputs in
``run.output_dir``: ``model.pt`` (a plain state_dict), ``history.csv``,
``history.png``, ``timeline.csv``, ``summary.json`` (for schedulers) and
``checkpoints/``.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from mpca.config import JobConfig
from mpca.data.sources import job_dataframe, job_holdout
from mpca.stopping import LN2
from mpca.errors import UserError
from mpca.models import training_functions
from mpca.runtime.cluster import session_for

log = logging.getLogger("mpca.job")

EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_RUN_FAILED = 3
EXIT_TARGET_NOT_REACHED = 4  # stopped at a time/cycle/epoch limit without reaching stop.target_error (_loss)


@dataclass
class JobResult:
    exit_code: int
    summary: dict


def write_failure_summary(cfg: JobConfig, status: str, code: int, message: str) -> None:
    """``summary.json`` for a job that failed (user error, run failure), where its outputs go and nowhere
    else: a local ``run.output_dir`` that exists or can be created, or a URI through the same store as the
    outputs where that store is reachable now (a URI is never taken for a local path)."""
    import json

    from mpca import storage
    from mpca.report import strict_json

    out = cfg.run.output_dir
    summary = {"status": status, "exit_code": code, "message": message, "algorithm": cfg.algorithm.name,
               "run": cfg.run.name}
    data = json.dumps(strict_json(summary), indent=2, allow_nan=False, default=str).encode()
    if storage.is_uri(out):
        try:
            storage.check_location(out)
            store = storage.open_store(out)
            store.makedirs()
            store.write_atomic("summary.json", data)
        except Exception:  # noqa: BLE001 - unreachable or unknown URI: the message on stderr is all there is
            log.debug("no summary.json written to %s", out, exc_info=True)
        return
    try:
        if os.path.isdir(out) or (not os.path.exists(out) and _creatable(out)):
            os.makedirs(out, exist_ok=True)
            storage.LocalStore(out).write_atomic("summary.json", data)
    except OSError:
        pass  # nowhere to write it: the message on stderr is all there is


def _creatable(path: str) -> bool:
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return os.path.isdir(parent) and os.access(parent, os.W_OK)


def preflight(cfg: JobConfig, starting_spark: bool) -> None:
    """Mistakes visible before Spark starts, each as one line: missing local paths, unreachable storage URIs,
    no usable Java for a local cluster."""
    from mpca import checkpoint

    d = cfg.data
    if d.path is not None and "://" not in d.path and not os.path.exists(d.path):
        raise UserError(f"data.path {d.path!r} does not exist; write one with `mpca data digits {d.path}` "
                        f"or point data.path at a file or directory Spark reads as {d.format}")
    if d.path is not None and "://" not in d.path and d.format == "parquet" and not d.feature_columns:
        # rows, columns, labels and one batch, before Spark starts
        from mpca.data.checks import check_parquet

        check_parquet(d.path, d.features, d.label, d.input_shape, *training_functions(cfg.model, cfg.optimizer))
    if d.holdout_path is not None and "://" not in d.holdout_path and not os.path.exists(d.holdout_path):
        raise UserError(f"data.holdout_path {d.holdout_path!r} does not exist; point it at the rows to score on "
                        f"(read as {d.format}) or drop it to split data.holdout of the rows")
    if d.dataset == "pytext":
        from mpca.data.sources import text_corpus

        text_corpus(d).files()  # a corpus directory that is missing or holds no text: one line, before Spark
    init = cfg.checkpoint.init_from
    if init is not None and "://" not in init and not os.path.exists(init):
        raise UserError(f"checkpoint.init_from {init!r} does not exist; give a previous run's model.pt or "
                        "checkpoint directory")
    if cfg.checkpoint.dir:
        checkpoint.check_location(cfg.checkpoint.dir)
    if starting_spark:
        from mpca.runtime.java import check_java

        check_java()  # JAVA_HOME without bin/java, no java, or older than pyspark needs: one line, not a traceback


def _check_output_dir(path: str) -> None:
    """A local directory must be writable now; a URI's scheme must be one this machine or the cluster knows
    (cluster schemes are checked through Spark's Hadoop once the session is up)."""
    from mpca import storage

    if storage.is_uri(path):
        try:
            storage.check_location(path)
        except UserError as e:
            raise UserError(f"run.output_dir: {e}") from None
        return
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".mpca-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"run.output_dir {path!r} is not writable: {e.strerror or e}") from None


def _check_cluster_locations(cfg: JobConfig) -> None:
    """Output and checkpoint URIs, checked through the cluster's Hadoop once the session is up."""
    from mpca import storage

    for where in (cfg.run.output_dir, cfg.checkpoint.dir):
        if where and storage.is_uri(where):
            storage.check_location(where)


def dry_run(cfg: JobConfig, spark=None) -> int:
    """Everything ``run`` checks before training — the config, the model, the output and checkpoint
    locations, the data source (read, one aggregate job and one batch through the model) and the cluster's
    room for the agents — then the resolved config on stdout; nothing is trained or written."""
    from mpca import storage
    from mpca.config import resolved_yaml
    from mpca.data.checks import check_dataframe
    from mpca.models import check_model_name
    from mpca.runtime.cluster import agents_fit, is_connect

    out = cfg.run.output_dir
    if storage.is_uri(out):
        _check_output_dir(out)
    elif not _creatable(out) and not (os.path.isdir(out) and os.access(out, os.W_OK)):
        raise UserError(f"run.output_dir {out!r} cannot be created or written; choose a writable directory")
    check_model_name(cfg.model.name, cfg.model.args)
    preflight(cfg, starting_spark=spark is None and cfg.cluster.master.startswith("local-cluster"))
    own_session = False
    if spark is None:
        spark, own_session = session_for(cfg.cluster, cfg.run.name)
    try:
        _check_cluster_locations(cfg)
        d = cfg.data
        df = job_dataframe(spark, cfg.data, cfg.training.agents)
        check_dataframe(df, d.features, d.label, d.input_shape, *training_functions(cfg.model, cfg.optimizer))
        if is_connect(spark):  # a Connect client sees no executors: the agents' job waits for room if it lacks it
            cluster = "a Spark Connect server, whose room for agents a client cannot see"
        else:
            shape, use_gpus = agents_fit(spark.sparkContext, cfg)
            cluster = f"{shape.describe()}, room for {cfg.training.agents} agent(s){' on GPUs' if use_gpus else ''}"
    finally:
        if own_session:
            spark.stop()
    print(resolved_yaml(cfg), end="")
    print(f"# dry run: config, model, data ({cfg.data.dataset or cfg.data.path or cfg.data.table}) and cluster "
          f"({cluster}) are fine; nothing was trained", flush=True)
    return 0


def run(cfg: JobConfig, spark=None) -> JobResult:
    from mpca.models import check_model_name
    from mpca.stopping import StopSignals
    from mpca.trainer import Trainer

    out = cfg.run.output_dir
    _check_output_dir(out)
    check_model_name(cfg.model.name, cfg.model.args)
    preflight(cfg, starting_spark=spark is None and cfg.cluster.master.startswith("local-cluster"))
    from mpca.tracking import from_config

    trackers = from_config(cfg.tracking)  # MLflow / TensorBoard: the config's, or MLflow's environment (before Spark)
    own_session = False
    if spark is None:
        spark, own_session = session_for(cfg.cluster, cfg.run.name)
    t0 = time.time()
    try:
        _check_cluster_locations(cfg)
        df = job_dataframe(spark, cfg.data, cfg.training.agents)
        holdout = job_holdout(spark, cfg.data)
        trainer = Trainer(*training_functions(cfg.model, cfg.optimizer), cfg, spark=spark, on_cycle=trackers)  # settings passed whole
        with StopSignals() as signals:
            trainer.stop_requested = signals.event  # SIGTERM / Ctrl-C: stop after this cycle, write everything
            fit = trainer.fit(df, holdout)
        if trackers is not None:
            trackers.take_input_example(df, cfg.data)  # a few rows: the MLflow model's input example and signature
        return _write_outputs(cfg, fit, signals.exit_code, trackers, t0)  # while Spark is up (cluster storage)
    finally:
        if own_session:
            spark.stop()


def _write_outputs(cfg: JobConfig, fit, signal_code, trackers, t0: float) -> JobResult:
    """model.pt + model.json, history.csv/png, timeline.csv and summary.json in ``run.output_dir``: written
    there directly on a local disk; for a URI, made in a local staging directory and copied (atomically,
    summary last) to the cluster's storage."""
    import tempfile

    from mpca import storage
    from mpca.ml.spec import registry_spec, save_model
    from mpca.report import plot_history, summary_table, write_history_csv, write_json

    out = cfg.run.output_dir
    remote = storage.is_uri(out)
    local = tempfile.mkdtemp(prefix="mpca-outputs-") if remote else out
    target_path = (lambda name: f"{out.rstrip('/')}/{name}") if remote else (lambda name: os.path.join(out, name))
    # model.pt (a plain state_dict) and model.json (its architecture: mpca predict and load_model rebuild it)
    save_model(os.path.join(local, "model.pt"), fit.model, registry_spec(cfg.model.name, cfg.model.args))
    hist_path = os.path.join(local, "history.csv")
    history = fit.history
    previous = _previous_history(cfg, out, fit)
    if previous is not None:
        import pandas as pd

        history = pd.concat([previous[previous["cycle"] <= fit.first_cycle], history], ignore_index=True)
    write_history_csv(history, hist_path)
    metric = cfg.eval.metric
    plot = plot_history(history, os.path.join(local, "history.png"), title=f"{cfg.run.name}: holdout {metric}",
                        target=cfg.stop.target, agents_up_s=fit.agents_up_s, metric=metric)
    fit.timeline.write_csv(os.path.join(local, "timeline.csv"))  # every cycle, streamed from the spill file
    target = cfg.stop.target
    reached = target is not None and getattr(fit.final, metric) <= target
    code = EXIT_TARGET_NOT_REACHED if target is not None and not reached else EXIT_OK
    status = "target_reached" if reached else ("limit_reached" if target is not None else "done")
    if signal_code is not None:  # stopped by SIGTERM / Ctrl-C: everything written, then 143 / 130
        code, status = signal_code, "interrupted"
    from mpca.config import resolved_yaml

    with open(os.path.join(local, "config.yaml"), "w", encoding="utf-8") as f:
        f.write(resolved_yaml(cfg))  # what this run used: rerun it with mpca train -c config.yaml
    names = {"model": "model.pt", "history": "history.csv", "plot": "history.png" if plot else None,
             "timeline": "timeline.csv", "config": "config.yaml", "summary": "summary.json"}
    summary = {
        "status": status,
        "exit_code": code, "stop_reason": fit.stop_reason, "final_holdout_error": fit.final.error,
        "final_holdout_loss": fit.final.loss, "holdout_missing_agents": fit.holdout_missing, "metric": metric, "target_error": cfg.stop.target_error,
        "target_loss": cfg.stop.target_loss, "wall_s": fit.wall_s,
        "job_wall_s": time.time() - t0, "cycles": fit.cycles, "agents_up_s": fit.agents_up_s,
        "prepare_s": fit.prepare_s, "first_exchange_s": fit.first_exchange_s,  # start-up, before / after the clock's 0
        "first_cycle": fit.first_cycle,
        "agents": cfg.training.agents, "algorithm": cfg.algorithm.name, "layout": fit.layout,
        "agent_devices": [a.get("device") for a in sorted(fit.agents, key=lambda a: a.get("agent", 0))],
        "paths": {**{k: target_path(v) if v else None for k, v in names.items()}, "checkpoints": cfg.checkpoint.dir},
        "tracking": trackers.describe() if trackers is not None else {},  # e.g. the MLflow run and model URI
    }
    write_json(os.path.join(local, "summary.json"), summary)
    if remote:
        store = storage.open_store(out)
        store.makedirs()
        for name in ["model.json"] + [v for v in names.values() if v]:  # summary.json last
            with open(os.path.join(local, name), "rb") as f:
                store.write_atomic(name, f.read())
    if trackers is not None:
        trackers.log_outputs({k: os.path.join(local, v) for k, v in names.items() if v})
    print(summary_table([
        ("final holdout error", f"{100 * fit.final.error:.2f}%") if metric == "error" else
        ("final holdout loss", f"{fit.final.loss:.4f} nats ({fit.final.loss / LN2:.4f} bits)"),
        ("stop reason", fit.stop_reason),
        ("cycles", fit.cycles), ("wall time", f"{fit.wall_s:.1f}s"), ("model", summary["paths"]["model"]),
        ("history", summary["paths"]["history"]), ("plot", summary["paths"]["plot"]),
        ("summary", summary["paths"]["summary"]),
    ]), flush=True)
    if remote:
        import shutil

        shutil.rmtree(local, ignore_errors=True)
    return JobResult(code, summary)


def _previous_history(cfg: JobConfig, out: str, fit):
    """A resumed job's history before its first cycle (from the earlier run's history.csv), or None."""
    if not (cfg.checkpoint.resume and fit.first_cycle > 0):
        return None
    import io

    import pandas as pd

    from mpca import storage

    try:
        data = storage.open_store(out).read("history.csv")
    except (OSError, FileNotFoundError):
        return None
    return pd.read_csv(io.BytesIO(data))
