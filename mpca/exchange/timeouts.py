"""How long the exchange's tasks wait: one spelling of each bound, torch-free (the executors' Python workers that
run the exchange and control tasks import it: :mod:`tests.integration.test_worker_imports`)."""

TASK_TIMEOUT_S = 120.0  # cluster.task_timeout_s's default: an exchange task's wait for its agent's answer

__all__ = ["TASK_TIMEOUT_S"]
