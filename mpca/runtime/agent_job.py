"""The AgentRDD: one long-lived Spark task per agent, running in a background driver thread.

The agents' job is ``train_df.repartition(K).mapInArrow(agent_task, profile=...)``:
each task receives its own partitions as Arrow record batches (never collected
to the driver), turns them into tensors and runs :func:`mpca.runtime.agent.run_agent`
until the driver stops it.  No barrier mode: it refuses dynamic allocation and
is not retried when one task fails.
"""
from __future__ import annotations

import functools
import json
import logging
import threading
import traceback
from typing import Iterator, List, Optional

import pyarrow as pa

from mpca.runtime.agent import AgentSpec, run_agent

log = logging.getLogger("mpca.agents")

SUMMARY_SCHEMA = "summary string"


def agent_task(spec: AgentSpec, features: str, label: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import torch
    from pyspark import TaskContext

    from mpca.data.arrow import batches_to_tensors

    tc = TaskContext.get()
    agent_id = tc.partitionId()
    res = tc.resources()
    gpus = list(res["gpu"].addresses) if "gpu" in res else []
    torch.set_num_threads(max(1, tc.cpus()))
    try:
        x, y = batches_to_tensors(batches, features, label, spec.input_shape)
        summary = run_agent(spec, agent_id, x, y, gpus)
    except Exception:  # reported, not raised: a user error must not be retried maxFailures times
        summary = {"agent": agent_id, "error": f"agent {agent_id} could not start:\n{traceback.format_exc()}"}
    summary["attempt"] = tc.attemptNumber()
    yield pa.RecordBatch.from_pydict({"summary": [json.dumps(summary, default=str)]})


class AgentJob:
    """Runs the agents' Spark job in a thread; :meth:`alive` and :attr:`summaries` report on it."""

    def __init__(self, sc, run_id: str):
        self.sc = sc
        self.group = f"mpca-{run_id}-agents"
        self.summaries: List[dict] = []
        self.error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def start(self, train_df, agents: int, spec: AgentSpec, features: str, label: str, profile) -> None:
        fn = functools.partial(agent_task, spec, features, label)
        df = train_df.repartition(agents).mapInArrow(fn, SUMMARY_SCHEMA, profile=profile)

        def run():
            self.sc.setJobGroup(self.group, f"mpca agents ({agents})", interruptOnCancel=True)
            try:
                self.summaries = [json.loads(r.summary) for r in df.collect()]
            except BaseException as e:  # noqa: BLE001 - surfaced by the trainer
                self.error = e

        self._thread = threading.Thread(target=run, name="mpca-agents", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.alive()

    def cancel(self) -> None:
        self.sc.cancelJobGroup(self.group)
