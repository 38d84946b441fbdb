"""The agents' Spark job (mpca.runtime.agent_job): an executor's error reduced to its Python line."""
from __future__ import annotations


def test_an_executor_error_is_reduced_to_its_python_exception_line():
    from mpca.runtime.agent_job import executor_cause

    msg = ("An error occurred while calling o123.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
           "due to stage failure: Task 1 in stage 9.0 failed 4 times\norg.apache.spark.api.python.PythonException: "
           "Traceback (most recent call last):\n  File \"/x/worker.py\", line 1, in main\n"
           "ModuleNotFoundError: No module named 'team_models'\n\tat org.apache.spark.api.python.BasePythonRunner")
    assert executor_cause(msg) == "on an executor: ModuleNotFoundError: No module named 'team_models'"
    assert executor_cause("Job 3 cancelled\nmore") == "Job 3 cancelled"
