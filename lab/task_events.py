"""Spark's own per-task events, seen from the driver: a SparkListener implemented in Python (py4j callback).

PySpark has no listener API, so :class:`TaskEvents` registers a Python object implementing Spark's
``SparkListenerInterface`` through py4j's callback server (as PySpark's own streaming listeners do); every
method it does not define is a no-op.  It keeps, per finished task of a job whose description starts with
``prefix``: the executor, Spark's launch and finish times, and the task metrics' deserialization and run
times.  For an exchange task that references a broadcast, PySpark's runner fetches the broadcast after the
task launched and deserialized and before its Python code starts, so the broadcast fetch on that executor
starts at ``launch + deserialize`` (Spark's clock) and ends when the Python code starts (the task's own
``t_start``).  Meant for benchmarks: each event is a py4j round trip on Spark's listener bus.
"""
from __future__ import annotations

import threading
from typing import Dict, List


class TaskEvents:
    class Java:
        implements = ["org.apache.spark.scheduler.SparkListenerInterface"]

    def __init__(self, sc, prefix: str = "mpca cycle"):
        from pyspark.java_gateway import ensure_callback_server_started

        self.sc, self.prefix = sc, prefix
        self._lock = threading.Lock()
        self.jobs: Dict[int, str] = {}  # job id → description
        self.stage_job: Dict[int, int] = {}
        self.tasks: List[dict] = []
        ensure_callback_server_started(sc._gateway)
        sc._jsc.sc().addSparkListener(self)

    # the events it keeps -------------------------------------------------------------------------
    def onJobStart(self, event) -> None:
        props = event.properties()
        desc = props.getProperty("spark.job.description") if props is not None else None
        if desc and desc.startswith(self.prefix):
            with self._lock:
                self.jobs[event.jobId()] = desc
                ids = event.stageIds()  # a Scala Seq through py4j
                for i in range(ids.size()):
                    self.stage_job[int(ids.apply(i))] = event.jobId()

    def onTaskEnd(self, event) -> None:
        job = self.stage_job.get(event.stageId())
        if job is None:
            return
        info, metrics = event.taskInfo(), event.taskMetrics()
        row = {"job": job, "description": self.jobs.get(job), "stage": event.stageId(), "index": info.index(),
               "executor": info.executorId(), "launch": info.launchTime() / 1000.0,
               "finish": info.finishTime() / 1000.0,
               "deserialize_s": metrics.executorDeserializeTime() / 1000.0 if metrics is not None else None,
               "run_s": metrics.executorRunTime() / 1000.0 if metrics is not None else None}
        with self._lock:
            self.tasks.append(row)

    def __getattr__(self, name):  # every other listener method: nothing to do
        if name.startswith("on"):
            return lambda *args: None
        raise AttributeError(name)

    # reading ----------------------------------------------------------------------------------------
    def fetch_windows(self, rec) -> Dict[int, tuple]:
        """Per agent handed cycle ``rec``'s broadcast: (fetch start, fetch end) in wall seconds — the start from
        Spark's events (launch + deserialization of the first deliver task on the agent's executor: a task of
        the cycle's deliver job, or of its one job where one task per agent does both), the end when that
        task's Python code began (``t_start``: PySpark runs it only once the broadcast is there)."""
        tasks = self.for_job_prefix(f"{self.prefix} {rec.cycle}:")
        deliver = [t for t in tasks if (t["description"] or "").endswith("(deliver)")]
        out = {}
        for agent, entry in rec.delivered.items():
            mine = sorted((t for t in deliver or tasks if t["executor"] == str(entry.executor)),
                          key=lambda t: t["launch"])
            if mine and entry.t_start:
                out[agent] = (mine[0]["launch"] + (mine[0]["deserialize_s"] or 0.0), entry.t_start)
        return out

    def for_job_prefix(self, prefix: str) -> List[dict]:
        with self._lock:
            return [t for t in self.tasks if (t["description"] or "").startswith(prefix)]

    def close(self) -> None:
        try:
            self.sc._jsc.sc().removeSparkListener(self)
        except Exception:  # noqa: BLE001 - the context may be gone already
            pass
