"""``Trainer.fit`` on a Spark Connect session: the client's side.

The client prepares the run as a classic driver does (:meth:`mpca.trainer.Trainer.prepare`: the model, the rows'
check, the holdout split — DataFrame API only), then starts two Spark jobs through Connect, in threads of its own:

* the **coordinator** — one task (``mapInArrow`` over ``spark.range(1)``) that runs the run's driver side inside
  the cluster (:mod:`mpca.connect.coordinator`);
* the **agents** — the user's DataFrame in K partitions, one long-lived task per agent
  (:func:`mpca.runtime.agent_job.agent_task`, as on a classic driver), which announce where they listen in the
  run's directory and find the coordinator's services there.

While they run, the client follows the run's directory: each history row becomes a progress line and an
``on_cycle`` call (and a tracker's row, :mod:`mpca.tracking`); each note (the coordinator's warnings, an agent
whose task ended early) a line of its log; :meth:`~mpca.trainer.Trainer.request_stop` is
passed on; at the end the result and the final model come back and ``fit`` returns a
:class:`~mpca.trainer.FitResult` as on a classic session (its ``driver_rule`` stays in the cluster: None).
"""
from __future__ import annotations

import functools
import io
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from mpca.connect.coordinator import SUMMARY_SCHEMA, CoordinatorJob, coordinator_task
from mpca.errors import RunFailedError, UserError
from mpca.observers import observer_of
from mpca.runtime.rundir import AGENTS_ENDED, CLIENT, COORDINATOR, FAILED, MODEL, RESULT, STOP, RunDir

log = logging.getLogger("mpca.connect")

FOLLOW_S = 0.5  # how often the client reads the run's directory
HEARTBEAT_S = 5.0  # how often it says it is there (the coordinator stops after cluster.client_gone_s without)
AGENTS_END_WAIT_S = 60.0  # after the coordinator's task: how long the agents' job may take to end by itself


OLDEST_SERVER = (3, 5)  # mapInArrow, per-thread tags and interruptTag over Connect


def check_server(spark) -> None:
    """Refuse, in one line, a Connect server older than the features this mode uses."""
    version = str(spark.version)
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    if parts < OLDEST_SERVER:
        raise UserError(f"the Spark Connect server runs Spark {version}; mpca's Connect mode needs Spark "
                        f"{'.'.join(map(str, OLDEST_SERVER))} or newer (mapInArrow, job tags): use a newer server "
                        "or a classic session")


def connect_location(spark, settings, run_id: str) -> Tuple[str, bool]:
    """The run's directory (``cluster.connect_dir``/<run id>) and whether it is a temporary one of this machine
    (no ``connect_dir`` given, the cluster local: removed after the run)."""
    base = settings.cluster.connect_dir
    if base is not None:
        return f"{base.rstrip('/')}/{run_id}", False
    master = spark.conf.get("spark.master", None) or ""
    if not master.startswith("local"):
        raise UserError(f"a Spark Connect run needs cluster.connect_dir: a directory that this client and the "
                        f"executors both reach (e.g. /Volumes/<catalog>/<schema>/<volume>/mpca, or "
                        f"s3://<bucket>/mpca); the cluster's master is {master or 'not known here'}")
    return os.path.join(tempfile.gettempdir(), f"mpca-connect-{run_id}"), True


class _Job:
    """One Spark job of the run, collected in a thread of its own, tagged with the run's tag (Spark Connect's
    tags are per thread) so that :meth:`interrupt` can end it."""

    def __init__(self, spark, tag: str, name: str, collect: Callable[[], list]):
        self.spark, self.tag = spark, tag
        self.rows: List[Any] = []
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(collect,), name=f"mpca-{name}", daemon=True)

    def _run(self, collect) -> None:
        self.spark.addTag(self.tag)
        try:
            self.rows = collect()
        except BaseException as e:  # noqa: BLE001 - reported by the client
            self.error = e

    def start(self) -> "_Job":
        self.thread.start()
        return self

    def alive(self) -> bool:
        return self.thread.is_alive()

    def summaries(self) -> List[dict]:
        return [json.loads(r.summary) for r in self.rows]

    def failure(self) -> str:
        from mpca.runtime.agent_job import job_failure

        return job_failure(self.error, self.summaries())


def relay_notes(rundir: RunDir, noted: set, names: Optional[List[str]] = None) -> int:
    """Log the run directory's notes not yet in ``noted`` (the coordinator's warnings, agents whose task ended
    early: :meth:`~mpca.runtime.rundir.RunDir.new_notes`), each once, at its level; return how many."""
    notes = rundir.new_notes(noted, names)
    for note in notes:
        level = note.get("level")
        log.log(level if isinstance(level, int) and logging.DEBUG <= level <= logging.CRITICAL else logging.WARNING,
                "%s: %s", note.get("origin"), note.get("message"))
    return len(notes)


def _int_keys(value: Dict[str, Any]) -> Dict[int, Any]:
    return {int(k): v for k, v in (value or {}).items()}


def history_row(row: Dict[str, Any]) -> Dict[str, Any]:
    """A history row as the coordinator wrote it, back to a classic run's: agent ids as ints, NaN for None."""
    out = {k: (float("nan") if v is None and k.startswith("holdout_") else v) for k, v in row.items()}
    for key in ("weight", "agent_samples_per_s"):
        if isinstance(out.get(key), dict):
            out[key] = _int_keys(out[key])
    return out


def timeline_row(row: Dict[str, Any]) -> Dict[str, Any]:
    return {**row, "weight": _int_keys(row.get("weight")), "steps_per_s": _int_keys(row.get("steps_per_s"))}


def _agents_profile(df, use_gpus) -> Dict[str, Any]:
    """The agents' resource profile where the server takes one (Spark 4.0+): a CPU each, and a GPU each with
    ``training.use_gpus: true`` (a client cannot see the executors' GPUs to decide it itself); none on Spark 3.5."""
    import inspect

    if "profile" not in inspect.signature(df.mapInArrow).parameters:
        return {}
    from mpca.runtime.cluster import agent_resource_profile

    profile = agent_resource_profile(use_gpus is True, pinned=False)
    try:
        profile.id  # made on the server now, in fit's thread: the agents' thread has no active session
    except RuntimeError as e:  # no active session in this thread either: the agents take the default profile
        log.warning("the agents' resource profile could not be made (%s): they run with the default one", e)
        return {}
    return {"profile": profile}


def _absolute_dirs(settings):
    """The settings with a relative local ``checkpoint.dir`` and ``cluster.connect_dir`` made absolute here."""
    from mpca.storage import is_uri

    def absolute(path):
        return path if path is None or is_uri(path) else os.path.abspath(path)

    return settings.model_copy(update={
        "checkpoint": settings.checkpoint.model_copy(update={"dir": absolute(settings.checkpoint.dir)}),
        "cluster": settings.cluster.model_copy(update={"connect_dir": absolute(settings.cluster.connect_dir)})})


def fit_over_connect(trainer, spark, df, holdout, called: float):
    """:meth:`mpca.trainer.Trainer.fit` on a Spark Connect session (see the module's docstring)."""
    from mpca.evaluation import EvalResult
    from mpca.progress import Progress
    from mpca.runtime.agent_job import SUMMARY_SCHEMA as AGENT_SUMMARY, agent_task, balanced
    from mpca.runtime.reports import RunCounters
    from mpca.runtime.run import agent_spec, payload_limit
    from mpca.runtime.timeline import Timeline
    from mpca.stopping import metric_column
    from mpca.trainer import FitResult

    st = trainer.settings
    training, data, algo = st.training, st.data, st.algorithm
    check_server(spark)
    if training.elastic:
        raise UserError("training.agents as MIN-MAX (an elastic run) is not available over Spark Connect yet: give "
                        "a number of agents")
    prep = trainer.prepare(df, holdout, called)
    st = _absolute_dirs(st)  # the coordinator's task runs in an executor's directory, not the client's
    run_id, secret = uuid.uuid4().hex[:10], secrets.token_bytes(32)
    location, temporary = connect_location(spark, st, run_id)
    rundir = RunDir(location).create()
    layout = algo.shard_layout(prep.model)
    bound = layout.bind_module(prep.model, algo.buffers)
    rule = algo.driver_rule([bound.read(s) for s in range(layout.num_shards)], training.agents)
    try:
        max_payload = payload_limit(layout, rule)
    finally:
        rule.close()
    fns = (trainer.model_fn, trainer.loss_fn, trainer.optimizer_fn)
    spec = agent_spec(run_id, secret, st, prep.model, fns, layout, max_payload, prep.classes, prep.on_agents,
                      relay=location)
    job = CoordinatorJob(*fns, settings=st.model_copy(update={"progress": "off"}),
                         prepared=replace(prep, agents_df=None), run_id=run_id, secret=secret, relay=location,
                         max_payload=max_payload)
    observer = observer_of(trainer.on_cycle)
    observer.start(st)
    tag = f"mpca-{run_id}"
    agents_df = balanced(prep.agents_df, training.agents, data.shuffle)
    coordinator = _Job(spark, tag, "coordinator", lambda: spark.range(1, numPartitions=1).mapInArrow(
        functools.partial(coordinator_task, job), SUMMARY_SCHEMA).collect()).start()
    profile = _agents_profile(agents_df, training.use_gpus)
    agents = _Job(spark, tag, "agents", lambda: agents_df.mapInArrow(
        functools.partial(agent_task, spec, data.features, data.label), AGENT_SUMMARY, **profile).collect()).start()
    log.info("Spark Connect run %s: its coordinator and %d agents started; they meet in %s", run_id,
             training.agents, location)
    progress = Progress(st.progress, st.stop.target, metric=st.eval.metric)
    column = metric_column(st.eval.metric)
    history: List[Dict[str, Any]] = []
    noted: set = set()  # the notes already logged
    failed = False
    try:
        ended_said = stop_said = coordinator_up = False
        started = time.monotonic()
        beats, beat_at = 0, -HEARTBEAT_S
        while True:
            alive = coordinator.alive()
            if not agents.alive() and not ended_said:
                rundir.write(AGENTS_ENDED, {"failure": agents.failure()})
                ended_said = True
            if time.monotonic() - beat_at >= HEARTBEAT_S:
                beats += 1
                rundir.write(CLIENT, {"beat": beats})
                beat_at = time.monotonic()
            if trainer.stop_requested.is_set() and not stop_said:
                rundir.write(STOP, {"at": time.time()})
                stop_said = True
            coordinator_up = coordinator_up or rundir.read(COORDINATOR) is not None
            if not coordinator_up and alive and time.monotonic() - started > st.cluster.agent_start_timeout_s:
                raise RunFailedError(f"the run's coordinator task did not start within "
                                     f"{st.cluster.agent_start_timeout_s:.0f}s (cluster.agent_start_timeout_s): a "
                                     f"Spark Connect run needs a free task slot for it beside its "
                                     f"{training.agents} agents'")
            names = rundir.names()  # one listing for the notes and the rows
            relay_notes(rundir, noted, names)
            for row in rundir.rows_from(len(history), names):
                row = history_row(row)
                history.append(row)
                progress.update(int(row["cycle"]), row.get(column), row.get("samples_per_s"))
                observer(row)
            if not alive:
                break
            time.sleep(FOLLOW_S)
        if coordinator.error is not None:
            raise RunFailedError(f"the run's coordinator task failed: {coordinator.failure()}")
        failure = rundir.read(FAILED)
        if failure is not None:
            raise (UserError if failure.get("user_error") else RunFailedError)(failure["error"])
        result = rundir.read(RESULT)
        if result is None:
            raise RunFailedError(f"the run's coordinator ended without a result in {location}")
        state = torch.load(io.BytesIO(rundir.store.read(MODEL)), weights_only=True)
    except BaseException:
        failed = True
        observer.finish(None)
        raise
    finally:
        progress.close()
        _end_agents(spark, tag, agents, wait_s=0.0 if failed else AGENTS_END_WAIT_S)
        if temporary:
            shutil.rmtree(location, ignore_errors=True)
    model = prep.model
    model.load_state_dict(state)
    import pandas as pd

    # the rows as they came (a coordinator started again wrote its rows after its first attempt's), and the final
    fit = FitResult(model=model.cpu(), history=pd.DataFrame(history + [history_row(result["history"][-1])]),
                    timeline=Timeline.of_rows(timeline_row(r) for r in result["timeline"]),
                    agents=agents.summaries() or result["agents"], cycles=result["cycles"], wall_s=result["wall_s"],
                    stop_reason=result["stop_reason"],
                    final=EvalResult(*(float("nan") if v is None else v
                                       for v in (result["final"]["error"], result["final"]["loss"]))),
                    run_id=result["run_id"], algorithm=result["algorithm"], layout=result["layout"],
                    first_cycle=result["first_cycle"], counters=RunCounters(**result["counters"]), driver_rule=None,
                    agents_up_s=result["agents_up_s"], first_exchange_s=result["first_exchange_s"],
                    first_exchange_job_end_s=result["first_exchange_job_end_s"], prepare_s=result["prepare_s"],
                    startup=_int_keys(result["startup"]), holdout_missing=result.get("holdout_missing", []))
    observer.finish(fit)
    return fit


def _end_agents(spark, tag: str, agents: _Job, wait_s: float) -> None:
    """The agents' job ends by itself once the coordinator stopped them; otherwise it is interrupted."""
    agents.thread.join(wait_s)
    if agents.alive():
        try:
            spark.interruptTag(tag)
        except Exception as e:  # noqa: BLE001 - a session already gone: nothing left to interrupt
            log.warning("could not interrupt the run's Spark jobs (tag %s): %s", tag, e)
        agents.thread.join(30)
