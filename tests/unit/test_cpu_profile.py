"""The CPU profile of `mpca bench compare`: roles by command line (the CPU of a real process that ends inside
the window: tests/integration/test_cpu_profile.py)."""
import os

from mpca.bench.cpu_profile import role_of


def test_roles_come_from_the_command_line_and_the_agents_pids():
    executor = b"java\x00-cp\x00x\x00org.apache.spark.executor.CoarseGrainedExecutorBackend\x00"
    assert role_of(10, executor, agent_pids={11}, driver_jvm=12) == "executor JVMs"
    assert role_of(11, b"python3\x00-m\x00pyspark.daemon\x00", agent_pids={11}, driver_jvm=12) == "agents"
    assert role_of(13, b"python3\x00-m\x00pyspark.daemon\x00", agent_pids={11}, driver_jvm=12) == "python workers"
    assert role_of(12, b"java\x00org.apache.spark.deploy.SparkSubmit\x00", agent_pids=(), driver_jvm=12) == "driver JVM"
    assert role_of(os.getpid(), b"python", agent_pids=(), driver_jvm=None) == "driver Python"
    assert role_of(14, b"java\x00org.apache.spark.deploy.worker.Worker\x00", (), None) == "standalone JVMs"
    assert role_of(15, b"bash\x00", (), None) == "other"
