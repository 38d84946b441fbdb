"""The AgentRDD: one long-lived Spark task per agent, running in a background driver thread.

The agents' job is ``train_df.coalesce(K).mapInArrow(agent_task, profile=...)`` (``repartition(K)`` when the
data has fewer than K partitions or ``data.shuffle`` asks for it):
each task receives its own partitions as Arrow record batches (never collected
to the driver), turns them into tensors (all of them first, or with ``data.stream`` in a thread as they arrive,
:mod:`mpca.data.stream`), setting the holdout rows aside where the trainer asks (:mod:`mpca.data.holdout`),
and runs :func:`mpca.runtime.agent.run_agent` until the driver stops it.  No barrier mode: it refuses dynamic allocation and
is not retried when one task fails.
"""
from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import traceback
from typing import Iterator, List, Optional

import pyarrow as pa

from mpca.runtime.agent import AgentSpec, run_agent
from mpca.runtime.cluster import is_connect

log = logging.getLogger("mpca.agents")

SUMMARY_SCHEMA = "summary string"


def agent_task(spec: AgentSpec, features: str, label: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    started = time.time()
    import torch
    from pyspark import TaskContext

    from mpca.data.arrow import UnreadableRows
    from mpca.data.spill import Partition, load_partition

    tc = TaskContext.get()
    agent_id = tc.partitionId()
    res = tc.resources()
    gpus = list(res["gpu"].addresses) if "gpu" in res else []
    slots = list(res["agentslot"].addresses) if "agentslot" in res else []
    torch.set_num_threads(max(1, tc.cpus()))
    part = keeper = loading = None
    problem: Optional[str] = None
    try:
        if spec.holdout is not None:  # its rows come with their hash: the holdout's are set aside as they load
            from mpca.data.holdout import HoldoutKeeper

            keeper = HoldoutKeeper(*spec.holdout, features, label, spec.data.input_shape)
            batches = keeper.training_batches(batches)
        try:
            if spec.data.stream and spec.data.agent_memory_mb is None:  # it trains on its first rows as the rest arrive
                loading = _start_loading(spec, features, label, batches)
                there = loading.ready()  # before the view: the tensors it gets hold at least these rows
                x, y = loading.view()
                part = Partition(x[:there], y[:there])
            else:  # every row read first (spilled to disk where over a memory budget)
                loading, part = None, load_partition(batches, features, label, spec.data.input_shape,
                                                     spec.data.agent_memory_mb)
        except UnreadableRows as e:  # the user's rows: the agent still answers the driver, with this one line
            from mpca.data.checks import found_in_agent, unreadable

            problem = found_in_agent(unreadable(features, label, e), agent_id)
            part = Partition(torch.zeros((0, *spec.data.input_shape)), torch.zeros(0, dtype=torch.int64))
        loaded = time.time()
        # a retry within the stage attempt is a replacement; one in a resubmitted stage (lost shuffle input)
        # restarts at attempt 0, and the driver recognises it by its new process (see ExchangePlan.pids)
        summary = run_agent(spec, agent_id, part.features, part.labels, gpus, attempt=tc.attemptNumber(),
                            slot=slots[0] if slots else None, data_on_host=part.spilled, task_started=started,
                            data_loaded=loaded, holdout=keeper, loading=loading, problem=problem)
        if loading is not None:
            loading.drop_rest()
            summary["load_s"] = (loading.finished_at or loaded) - started
    except Exception:  # reported, not raised: a user error must not be retried maxFailures times
        summary = {"agent": agent_id, "error": f"agent {agent_id} could not start:\n{traceback.format_exc()}"}
    finally:
        if loading is not None:
            loading.drop_rest()  # its input read to the end (Spark's Python worker reads on once this task returns)
        if part is not None:
            part.close()  # the spill files, if any
    summary["attempt"] = tc.attemptNumber()
    if spec.relay is not None and summary.get("error"):
        note_ending(spec.relay, agent_id, summary["error"])
    yield pa.RecordBatch.from_pydict({"summary": [json.dumps(summary, default=str)]})


def error_line(error: str) -> str:
    """An agent's error (its summary's: a line, or a line and a traceback) as one line: the line, and the
    traceback's last (the exception)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else "no reason given"
    return f"{lines[0].rstrip(':')}: {lines[-1]}"


def job_failure(error: Optional[BaseException], summaries: List[dict]) -> str:
    """Why an agents' Spark job ended, in one line (a classic run's :class:`AgentJob`, a Connect client's): the
    executor's own Python error where Spark carried it, else Spark's message (``error``), else the first error of
    the agents' summaries (the exception: its traceback's last line)."""
    if error is not None:
        return executor_cause(str(error))
    errors = [s["error"].strip().splitlines()[-1] for s in summaries if s.get("error")]
    return errors[0] if errors else "the agents' Spark job ended"


def note_ending(relay: str, agent_id: int, error: str) -> None:
    """A Spark Connect run's agent whose task ends early says why in the run's directory, at once: the client
    logs it (a Connect user sees no executor's log, and the agents' summaries reach the client only when the
    whole job ends)."""
    from mpca.runtime.rundir import RunDir

    try:
        RunDir(relay).write_note(f"agent {agent_id}", logging.WARNING,
                                 f"its Spark task ended early: {error_line(error)}")
    except Exception as e:  # noqa: BLE001 - the summary still says it; the note is the early word only
        log.warning("agent %d: could not leave its note in %s: %s", agent_id, relay, e)


def _start_loading(spec: AgentSpec, features: str, label: str, batches):
    """The agent's rows arriving in a thread (:mod:`mpca.data.stream`), once the first ones are there (or all)."""
    from mpca.data.arrow import batch_arrays
    from mpca.data.checks import labels_problem
    from mpca.data.stream import START_ROWS, LoadingRows

    shape = spec.data.input_shape
    loading = LoadingRows(shape, check=lambda y: labels_problem(y, spec.classes, spec.data.label))
    loading.start(batches, lambda b: batch_arrays(b, features, label, shape), name="mpca-load")
    loading.wait(START_ROWS, timeout=None)
    if loading.error is not None:
        raise loading.error
    return loading


_PY_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)(?::.*)?)$")


_GAVE_UP = re.compile(r"Task (\d+) in stage \S+ failed (\d+) times")


def executor_cause(message: str) -> str:
    """The last Python exception line of an executor traceback inside a Spark error message, with Spark's
    own first line (which task failed how often) when there is no Python traceback; when Spark gave up on an
    agent's task after its executor was lost ``spark.task.maxFailures`` times, that and the fix."""
    lines = message.splitlines()
    gave_up = _GAVE_UP.search(message)
    if gave_up and "ExecutorLostFailure" in message:
        agent, times = gave_up.groups()
        return (f"agent {agent}'s executor was lost {times} times and Spark gave up on the agents' job "
                f"(spark.task.maxFailures = {times}); set cluster.conf spark.task.maxFailures higher to outlast "
                "more losses of one agent")
    causes = [m.group(1).strip() for line in lines if (m := _PY_ERROR.match(line))]
    causes = [c for c in causes if not c.startswith(("org.apache", "py4j", "java."))]
    if causes:
        return f"on an executor: {causes[-1]}"
    first = next((line.strip() for line in lines if line.strip()), "unknown error")
    return first[:500]


def balanced(train_df, agents: int, shuffle: bool = False):
    """K partitions for K agents, without a shuffle where the data has at least K partitions (unless
    ``shuffle``: rows dealt out round-robin, so every agent sees every class of data ordered by label).

    A shuffle would make the agents' stage depend on map outputs kept by executors: losing one executor
    then fails the fetch, and Spark resubmits the stage, relaunching every agent still running (two
    processes per agent).  Coalesced, a lost agent task is simply retried on its own."""
    if shuffle or is_connect(train_df):  # a Connect DataFrame has no RDD to count its partitions: dealt out
        return train_df.repartition(agents)
    if train_df.rdd.getNumPartitions() >= agents:
        return train_df.coalesce(agents)
    log.info("the training data has fewer partitions than agents: repartitioning (a shuffle; an executor lost "
             "mid-run then restarts every agent) — give it at least %d partitions to avoid that", agents)
    return train_df.repartition(agents)


class AgentJob:
    """Runs the agents' Spark job in a thread; :meth:`alive` and :attr:`summaries` report on it."""

    def __init__(self, sc, run_id: str, profile=None):
        self.sc = sc
        self.profile = profile  # the agents' task resource profile (mpca.runtime.cluster.agent_resource_profile)
        self.group = f"mpca-{run_id}-agents"
        self.summaries: List[dict] = []
        self.error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def start(self, train_df, agents: int, spec: AgentSpec, features: str, label: str, shuffle: bool = False) -> None:
        fn = functools.partial(agent_task, spec, features, label)
        from mpca.compat import collect_map_in_arrow

        df = balanced(train_df, agents, shuffle)

        def run():
            self.sc.setJobGroup(self.group, f"mpca agents ({agents})", interruptOnCancel=True)
            try:
                self.summaries = [json.loads(r.summary) for r in collect_map_in_arrow(df, fn, SUMMARY_SCHEMA, self.profile)]
            except BaseException as e:  # noqa: BLE001 - surfaced by the trainer
                self.error = e

        self._thread = threading.Thread(target=run, name="mpca-agents", daemon=True)
        self._thread.start()

    def failure(self) -> str:
        """Why the agents' job ended, in one line: the executor's own Python error where Spark carried it
        (e.g. a model module the executors cannot import), else Spark's message, else the agents' summaries."""
        return job_failure(self.error, self.summaries)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.alive()

    def cancel(self) -> None:
        self.sc.cancelJobGroup(self.group)
