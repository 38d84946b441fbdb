"""The agents' Spark job (mpca.runtime.agent_job): an executor's error reduced to its Python line."""
from __future__ import annotations

import os


def test_an_executor_error_is_reduced_to_its_python_exception_line():
    from mpca.runtime.agent_job import executor_cause

    msg = ("An error occurred while calling o123.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
           "due to stage failure: Task 1 in stage 9.0 failed 4 times\norg.apache.spark.api.python.PythonException: "
           "Traceback (most recent call last):\n  File \"/x/worker.py\", line 1, in main\n"
           "ModuleNotFoundError: No module named 'team_models'\n\tat org.apache.spark.api.python.BasePythonRunner")
    assert executor_cause(msg) == "on an executor: ModuleNotFoundError: No module named 'team_models'"
    assert executor_cause("Job 3 cancelled\nmore") == "Job 3 cancelled"


def test_an_agent_whose_executor_was_lost_max_failures_times_is_named_with_the_setting_to_raise():
    """lab.campaign's 4th kill of agent 1's executor: Spark aborts the agents' job (spark.task.maxFailures = 4)."""
    from mpca.runtime.agent_job import executor_cause

    msg = ("An error occurred while calling o39499.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
           "due to stage failure: Task 1 in stage 2449.0 failed 4 times, most recent failure: Lost task 1.3 in stage "
           "2449.0 (TID 8812) (127.0.0.1 executor 6): ExecutorLostFailure (executor 6 exited caused by one of the "
           "running tasks) Reason: Command exited with code 137\n\tat org.apache.spark.scheduler.DAGScheduler")
    line = executor_cause(msg)
    assert line.startswith("agent 1's executor was lost 4 times") and "spark.task.maxFailures" in line
    assert "\n" not in line


def test_mpcas_own_sessions_let_an_agent_outlast_many_lost_executors(monkeypatch):
    """local_session asks for spark.task.maxFailures = AGENT_TASK_MAX_FAILURES unless the caller sets it (the
    builder is recorded, not started)."""
    from pyspark.sql import SparkSession

    from mpca.runtime import cluster

    seen = {}

    class Recording:
        def master(self, *_):
            return self

        appName = master

        def config(self, k, v):
            seen[k] = v
            return self

        def getOrCreate(self):
            return None

    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP"):  # local_session sets them
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(SparkSession, "builder", Recording())
    monkeypatch.setattr(cluster, "watch_driver_jvm", lambda spark: None)
    monkeypatch.setattr("pyspark.SparkContext._active_spark_context", object())  # no Java check
    cluster.local_session(2, 2, 1024)
    assert seen["spark.task.maxFailures"] == str(cluster.AGENT_TASK_MAX_FAILURES) == "100"
    cluster.local_session(2, 2, 1024, conf={"spark.task.maxFailures": "7"})
    assert seen["spark.task.maxFailures"] == "7"
    seen.clear()  # and the emulated cluster's session (mpca.bench), on its standalone master
    from mpca.bench import emulated_cluster

    monkeypatch.setenv(emulated_cluster.MASTER, "spark://10.200.0.1:7077")
    monkeypatch.setenv(emulated_cluster.DRIVER_HOST, "10.200.0.1")
    emulated_cluster.session_in_cluster("t")
    assert seen["spark.task.maxFailures"] == "100"
    emulated_cluster.session_in_cluster("t", {"spark.task.maxFailures": "7"})
    assert seen["spark.task.maxFailures"] == "7"


def test_a_session_with_few_task_retries_is_said_before_the_run(caplog):
    from mpca.runtime.cluster import warn_low_task_retries

    class Conf(dict):
        def getConf(self):
            return self

    with caplog.at_level("WARNING", logger="mpca.cluster"):
        warn_low_task_retries(Conf())  # Spark's default: 4
        warn_low_task_retries(Conf({"spark.task.maxFailures": "100"}))
    assert len(caplog.records) == 1 and "is 4: the run ends when one agent's executor is lost 4 times" in caplog.text


def test_an_agents_jobs_failure_is_sparks_cause_else_the_first_agents_exception_else_that_it_ended():
    """job_failure (a classic run's AgentJob and a Connect client's agents' job say it alike)."""
    from mpca.runtime.agent_job import job_failure

    spark = RuntimeError("Job aborted\nCaused by: org.apache.spark.api.python.PythonException: Traceback (most "
                         "recent call last):\nModuleNotFoundError: No module named 'team_models'\n\tat x")
    assert job_failure(spark, [{"error": "ignored"}]) == \
        "on an executor: ModuleNotFoundError: No module named 'team_models'"
    summaries = [{"agent": 0}, {"agent": 1, "error": "agent 1 failed:\nTraceback ...\nValueError: bad batch\n"},
                 {"agent": 2, "error": "OSError: gone"}]
    assert job_failure(None, summaries) == "ValueError: bad batch"
    assert job_failure(None, [{"agent": 0}]) == "the agents' Spark job ended"
